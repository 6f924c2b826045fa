"""Train the EAGLE head of the embedded target (weights/tiny-target), then export it to specdec_np/weights/tiny-eagle/.

Optional tooling: needs PyTorch (`pip install -e ".[train]"`), never needed at run time. See weights/README.md.
The target is frozen; its features (the top layer's hidden state after its final layer norm, what its tied
head reads: specdec_np/eagle.py) are computed on the fly over random windows of the corpus the pair was
trained on (`python weights/train_tiny.py corpus` builds it). The loss is EAGLE-1's: smooth-L1 regression
of the next feature plus the cross-entropy of q (the target's head on the predicted feature) against the
target's own next-token distribution p, weighted 1.0 (EAGLE-1's 0.1 left the first guesses behind the draft
model's; EAGLE-3 keeps only this term); the input features get EAGLE's uniform noise. The exported head drafts
from the 2048 tokens most frequent in the training split (EAGLE-3's reduced vocabulary, `--vocab`): its q reads
2048 rows of the target's embedding instead of 8193, and those tokens are 98% of the corpus.

    python weights/train_eagle.py train       # resumable; checkpoints in weights/work/eagle_last.pt
    python weights/train_eagle.py export      # fp16 -> specdec_np/weights/tiny-eagle/, checked against the torch head
                                              # (--vocab N: the draft vocabulary's size, 0 for every token)
    python weights/train_eagle.py match       # held-out first-guess acceptance, beside the shipped draft's (and at
                                              # reduced vocabularies of 4096-512 tokens)
    python weights/train_eagle.py export --from DIR   # weights/recipe.py's eagle.NN.npz -> tiny-eagle/ (NumPy only)

Everything is seeded; batches are a function of the step number, so an interrupted run resumes with the same data
(the learning rate also follows the wall-clock budget, below). weights/recipe.py trains a retrained target's head
with the same functions (`make_head`, `optimizer`, `train_step`, `numpy_head`, `export_error`, `first_guess`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import train_tiny  # noqa: E402  (the target's torch model, the corpus, `match`'s windows)

WORK = train_tiny.WORK
from specdec_np.files import SHIPPED_DIR  # noqa: E402  (specdec_np/weights/: the package data)

OUT = SHIPPED_DIR / "tiny-eagle"
CFG = dict(seq_len=256, batch=8, steps=6000, lr=1.5e-3, min_lr=1e-4, warmup=50, weight_decay=0.01, seed=4321,
           noise=0.2, p_weight=1.0, ckpt_every=50, minutes=40.0, vocab=2048)


def make_head(target_cfg):
    """EAGLE's head over the target (n_embd d): fc [2d -> d] on (token embedding, feature), one GPT-2 block."""
    import torch
    import torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            d = target_cfg.n_embd
            self.fc = nn.Linear(2 * d, d)
            self.block = train_tiny.make_model(train_tiny.RunConfig("head", n_layer=1, n_head=target_cfg.n_head,
                                                                    n_embd=d)).h[0]
            nn.init.normal_(self.fc.weight, 0.0, 0.02)
            nn.init.zeros_(self.fc.bias)

        def forward(self, emb, feat):  # [B, T, d], [B, T, d] -> the predicted features [B, T, d]
            return self.block(self.fc(torch.cat([emb, feat], dim=-1)))

    return Head()


def target_features(target, x):  # [B, T] -> [B, T, d]: the target's features (after ln_f)
    import torch

    T = x.shape[1]
    h = target.wte(x) + target.wpe(torch.arange(T, device=x.device))
    for blk in target.h:
        h = blk(h)
    return target.ln_f(h)


def head_inputs(target, x, feats):  # -> (emb [B, T-1, d], feat [B, T-1, d]) for the pairs (f_(j-1), t_j), j = 1..T-1
    import torch

    T = x.shape[1]
    return target.wte(x[:, 1:]) + target.wpe(torch.arange(1, T, device=x.device)), feats[:, :-1]


def lr_at(step: int, elapsed: float) -> float:
    """Linear warm-up, then a cosine decay over the steps or the wall-clock budget, whichever ends first
    (on a shared CPU the budget usually does: the head still ends at the low rate)."""
    if step < CFG["warmup"]:
        return CFG["lr"] * (step + 1) / CFG["warmup"]
    t = max((step - CFG["warmup"]) / max(1, CFG["steps"] - CFG["warmup"]), elapsed / (60 * CFG["minutes"]))
    return CFG["min_lr"] + 0.5 * (CFG["lr"] - CFG["min_lr"]) * (1 + math.cos(math.pi * min(1.0, t)))


def batch_at(tokens: np.ndarray, step: int) -> np.ndarray:  # -> [batch, seq_len + 1]
    rng = np.random.default_rng([CFG["seed"], step])
    starts = rng.integers(0, tokens.size - CFG["seq_len"] - 1, size=CFG["batch"])
    return np.stack([tokens[s:s + CFG["seq_len"] + 1] for s in starts]).astype(np.int64)


def loss_of(head, target, xb, noise: float, device: str = "cpu"):
    """EAGLE-1's loss on windows [B, T]: (total, regression, cross-entropy); the passes in bf16 autocast
    (as train_tiny.py's), the losses in float32."""
    import torch
    import torch.nn.functional as F

    with train_tiny.autocast(device):
        with torch.no_grad():
            feats = target_features(target, xb)  # [B, T, d]
            p = F.softmax((feats[:, 1:] @ target.wte.weight.T).float(), dim=-1)  # the target's p after tokens 1..T-1
            emb, feat = head_inputs(target, xb, feats)
            if noise:
                feat = feat + (torch.rand_like(feat) - 0.5) * noise
        out = head(emb, feat)  # [B, T-1, d]: guesses of f_1..f_(T-1)
        logq = F.log_softmax((out @ target.wte.weight.T).float(), dim=-1)
    reg = F.smooth_l1_loss(out.float(), feats[:, 1:].float())
    ce = -(p * logq).sum(-1).mean()
    return reg + CFG["p_weight"] * ce, reg, ce


def optimizer(head):
    """AdamW on the head, weight decay on its matrices only."""
    import torch

    decay = [q for q in head.parameters() if q.dim() >= 2]
    rest = [q for q in head.parameters() if q.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": CFG["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}], lr=CFG["lr"], betas=(0.9, 0.95))


def train_step(head, target, opt, xb, device: str = "cpu"):
    """One step of EAGLE-1's loss (`loss_of`, with EAGLE's input noise) on windows xb [B, T]: (total, reg, ce)."""
    import torch

    loss, reg, ce = loss_of(head, target, xb, CFG["noise"], device)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
    opt.step()
    return loss, reg, ce


def train() -> None:
    import torch

    torch.manual_seed(CFG["seed"])
    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", os.cpu_count() or 1)))
    tokens = np.load(WORK / "train.npy")
    target, tcfg = train_tiny.get_model("shipped:target")
    for q in target.parameters():
        q.requires_grad_(False)
    head = make_head(tcfg)
    opt = optimizer(head)
    ckpt, step, elapsed = WORK / "eagle_last.pt", 0, 0.0
    if ckpt.exists():
        ck = torch.load(ckpt, weights_only=False)
        head.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        print(f"resuming at step {step}", flush=True)
    log, t0 = open(WORK / "eagle.log", "a"), time.time() - elapsed

    def save(final=False):
        state = {"model": head.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": time.time() - t0,
                 "tokens": step * CFG["batch"] * CFG["seq_len"], "cfg": CFG}
        tmp = ckpt.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, ckpt)
        if final:
            torch.save(state, WORK / "eagle_final.pt")

    while step < CFG["steps"]:
        if time.time() - t0 > 60 * CFG["minutes"]:
            print(f"time budget reached at step {step}", flush=True)
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, time.time() - t0)
        loss, reg, ce = train_step(head, target, opt, torch.from_numpy(batch_at(tokens, step)))
        step += 1
        line = f"step {step} loss {loss.item():.4f} reg {reg.item():.4f} ce {ce.item():.4f} {time.time() - t0:.0f}s"
        log.write(line + "\n")
        log.flush()
        if step % 10 == 0:
            print(line, flush=True)
        if step % CFG["ckpt_every"] == 0:
            save()
    save(final=True)


def load_head_torch():
    import torch

    target, tcfg = train_tiny.get_model("shipped:target")
    head = make_head(tcfg)
    ck = torch.load(WORK / "eagle_final.pt", weights_only=False)
    head.load_state_dict(ck["model"])
    head.eval()
    return head, target, tcfg, ck


def match(n_windows: int = 24, window: int = 256) -> dict:
    """First-guess acceptance on held-out text (train_tiny.match's 24 windows of 256), beside the shipped draft's."""
    head, target, _, ck = load_head_torch()
    draft, _ = train_tiny.get_model("shipped:draft")
    held = np.load(WORK / "heldout.npy")
    starts = np.linspace(0, held.size - 300, n_windows).astype(np.int64)
    report = first_guess(head, target, draft, np.stack([held[s:s + window + 1] for s in starts]),
                         vocabs=(4096, 2048, 1024, 512))
    report["head"].update(tokens_seen=ck["tokens"], steps=ck["step"], minutes=round(ck["elapsed"] / 60, 1))
    print(json.dumps(report, indent=1))
    return report


def draft_vocab(n: int | None, tokens: np.ndarray | None = None) -> np.ndarray | None:
    """EAGLE-3's reduced draft vocabulary: a 0/1 row [V] of the n tokens most frequent in the training split (ties
    to the lower id), or None for n None (every token)."""
    if n is None:
        return None
    counts = np.bincount(np.load(WORK / "train.npy") if tokens is None else tokens, minlength=train_tiny.N_VOCAB)
    mask = np.zeros(train_tiny.N_VOCAB, dtype=np.float32)
    mask[np.argsort(-counts, kind="stable")[:n]] = 1.0
    return mask


def first_guess(head, target, draft, windows: np.ndarray, device: str = "cpu", vocabs=()) -> dict:
    """{"head", "draft", and "head N" for each vocabulary size N in `vocabs`: {"accept_topk", "argmax_agree"}} on
    windows [N, T+1]: the head's q (from the target's true feature of the token before; with a reduced vocabulary,
    its logits outside it -inf) and the draft's q against the target's p, accepting one token at top-k 50."""
    import torch

    windows = torch.from_numpy(windows.astype(np.int64)).to(device)
    outside = {f"head {n}": torch.from_numpy(draft_vocab(n) == 0).to(device) for n in vocabs}
    out = {name: {"accept_topk": [], "argmax_agree": []} for name in ("head", "draft", *outside)}
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            x = windows[i:i + 8, :-1]  # [B, T]
            feats = target_features(target, x)
            p = feats[:, 1:] @ target.wte.weight.T  # the target's logits after tokens 1..T-1
            q_head = head(*head_inputs(target, x, feats)) @ target.wte.weight.T
            q_draft = draft(x)[:, 1:]
            qs = [("head", q_head), ("draft", q_draft)] + [(k, q_head.masked_fill(m, -torch.inf))
                                                           for k, m in outside.items()]
            for name, q in qs:
                acc = torch.minimum(train_tiny.top_k_probs(p, 50), train_tiny.top_k_probs(q, 50)).sum(-1).mean()
                out[name]["accept_topk"].append(acc.item())
                out[name]["argmax_agree"].append((p.argmax(-1) == q.argmax(-1)).float().mean().item())
    return {name: {k: round(float(np.mean(v)), 4) for k, v in d.items()} for name, d in out.items()}


def numpy_head(head, np_target, vocab=None):
    """The torch head as specdec_np's (`eagle.bind` to the numpy target `np_target`: fc and its one block; `vocab`
    its reduced draft vocabulary, `draft_vocab`, or None)."""
    from specdec_np import eagle

    sd = {k: v.detach().float().cpu().numpy() for k, v in head.state_dict().items()}
    b = "block."
    block = {"ln_1": {"g": sd[b + "ln_1.weight"], "b": sd[b + "ln_1.bias"]},
             "attn": {"c_attn": {"w": sd[b + "c_attn.weight"].T, "b": sd[b + "c_attn.bias"]},
                      "c_proj": {"w": sd[b + "c_proj.weight"].T, "b": sd[b + "c_proj.bias"]}},
             "ln_2": {"g": sd[b + "ln_2.weight"], "b": sd[b + "ln_2.bias"]},
             "mlp": {"c_fc": {"w": sd[b + "c_fc.weight"].T, "b": sd[b + "c_fc.bias"]},
                     "c_proj": {"w": sd[b + "mlp_proj.weight"].T, "b": sd[b + "mlp_proj.bias"]}}}
    return eagle.bind(np_target, {"w": sd["fc.weight"].T, "b": sd["fc.bias"]}, block, vocab)


def export_error(head, target, loaded, window: np.ndarray) -> float:
    """Max |difference| of the guessed features of specdec_np's head pass on the written files (`loaded`) against
    the torch head with its weights rounded to fp16 (a copy, on the CPU), over one window of tokens [T+1]."""
    import copy

    import torch

    from specdec_np import eagle
    from specdec_np.gpt2 import new_cache

    head, target = copy.deepcopy(head).float().cpu(), copy.deepcopy(target).float().cpu()
    with torch.no_grad():
        for prm in head.parameters():
            prm.copy_(prm.half().float())
        x = torch.from_numpy(window.astype(np.int64))[None]
        feats = target_features(target, x)
        want = head(*head_inputs(target, x, feats))[0].numpy()  # [T, d]
    tokens = x[0, 1:].numpy()
    mask = np.tril(np.ones((len(tokens), len(tokens)), dtype=bool))
    got = eagle.head_pass(loaded, feats[0, :-1].numpy(), tokens, np.arange(1, len(tokens) + 1),
                          new_cache(loaded, 8), mask)
    return float(np.abs(got - want).max())


def head_from_shards(out: Path, np_target, vocab=None):
    """The head in weights/recipe.py's eagle.NN.npz shards (its fc and block, flat names such as
    "blocks.0.attn.c_attn.w"), bound to the numpy target `np_target` (`eagle.bind`; `vocab`: its reduced
    vocabulary, or None)."""
    from specdec_np import eagle

    flat = {}
    for path in sorted(Path(out).glob("eagle.[0-9][0-9].npz")):
        with np.load(path) as z:
            flat.update({k: z[k].astype(np.float32) for k in z.files})
    block = {}
    for k, v in flat.items():
        if k.startswith("blocks.0."):
            *where, leaf = k.split(".")[2:]
            node = block
            for name in where:
                node = node.setdefault(name, {})
            node[leaf] = v
    return eagle.bind(np_target, {"w": flat["fc.w"], "b": flat["fc.b"]}, block, vocab)


def export_shards(src: Path, out: Path = OUT, np_target=None) -> None:
    """weights/recipe.py's head (`head_from_shards`), bound to `np_target` (default: the embedded target, which
    export_tiny.py wrote from the same run) -> `out` (default specdec_np/weights/tiny-eagle/); the recipe checked its
    pass against the torch head's already. A SystemExit if the target is not the run's own (export_tiny.py first)."""
    from specdec_np import eagle, models

    np_target = models.load_model(models.EMBEDDED_TARGET) if np_target is None else np_target
    ran = json.loads((Path(src) / "report.json").read_text())["target"]["config"]
    shape = {k: getattr(np_target.config, k) for k in ("n_layer", "n_head", "n_embd", "n_ctx")}
    if shape != {k: ran[k] for k in shape}:
        raise SystemExit(f"--from {src}: its head was trained for a {ran['n_layer']}-layer, {ran['n_embd']}-wide "
                         f"target, not the embedded {shape['n_layer']}-layer, {shape['n_embd']}-wide one: run "
                         f"`python weights/export_tiny.py --from {src}` first")
    vocab = None
    if CFG["vocab"]:  # counted on the recipe's training split (build_corpus.py's), whose text the new pair learned
        vocab = draft_vocab(CFG["vocab"], train_tiny.read_corpus(WORK / "corpus")["train"])
    eagle.save_head(head_from_shards(src, np_target, vocab), out)
    size = (out / "model.safetensors").stat().st_size
    print(f"exported {out} ({size / 1e6:.2f} MB) from {src}")


def export() -> None:
    """The head in fp16 -> specdec_np/weights/tiny-eagle/ (specdec_np.eagle.save_head), then specdec_np's head pass on
    the written files checked against the torch head with its weights rounded to fp16."""
    from specdec_np import eagle, models

    head, target, tcfg, _ = load_head_torch()
    np_target = models.load_model(models.EMBEDDED_TARGET)
    eagle.save_head(numpy_head(head, np_target, draft_vocab(CFG["vocab"])), OUT)
    loaded = models.load_head(OUT, np_target)
    # The check: one held-out window through both.
    err = export_error(head, target, loaded, np.load(WORK / "heldout.npy")[:65])
    size = (OUT / "model.safetensors").stat().st_size
    print(f"exported {OUT} ({size / 1e6:.2f} MB); max |numpy - torch| of the guessed features: {err:.2e}")
    if err > 1e-2:
        raise SystemExit("export check failed: specdec_np's head pass differs from the torch head")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("train", "export", "match"))
    ap.add_argument("--minutes", type=float, default=CFG["minutes"], help="wall-clock budget of `train`")
    ap.add_argument("--steps", type=int, default=CFG["steps"])
    ap.add_argument("--from", dest="src", type=Path, help="export: weights/recipe.py's output directory")
    ap.add_argument("--vocab", type=int, default=CFG["vocab"],
                    help="export: the head drafts from the N tokens most frequent in the training split (EAGLE-3's "
                         "reduced vocabulary; 0: every token)")
    a = ap.parse_args()
    if not 0 <= a.vocab <= train_tiny.N_VOCAB:
        ap.error(f"--vocab must be between 0 and {train_tiny.N_VOCAB}, not {a.vocab}")
    CFG.update(minutes=a.minutes, steps=a.steps, vocab=a.vocab or None)
    if a.src is not None:
        if a.what != "export":
            ap.error("--from is for export only")
        export_shards(a.src)
    else:
        {"train": train, "export": export, "match": match}[a.what]()
