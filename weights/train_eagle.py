"""Train the EAGLE head of the embedded target (weights/tiny-target), then export it to specdec_np/weights/tiny-eagle/.

Optional tooling: needs PyTorch (`pip install -e ".[train]"`), never needed at run time. See weights/README.md.
The head (specdec_np/eagle.py) is narrower than the target: fc [2D -> d] on (token embedding, feature), one GPT-2
block of width d (192: 3 heads of 64, against the target's 384), out [d -> D] back to the feature. The target is
frozen; its features (the top layer's hidden state after its final layer norm, what its tied head reads) are read
from a cache computed once (`cache`: windows of the training split, each token's feature and the logsumexp of the
target's logits there), so training never runs the target. The loss is EAGLE-1's: smooth-L1 regression of the next
feature plus the cross-entropy of q (the target's head on the guessed feature, over the draft vocabulary's rows)
against the target's p on those rows (p_i = exp(f . wte_i - lse)), weighted 1.0 (EAGLE-1's 0.1 left the first
guesses behind the draft model's; EAGLE-3 keeps only this term); the input features get EAGLE's uniform noise. The
head drafts from the 2048 tokens most frequent in the training windows (EAGLE-3's reduced vocabulary, `--vocab`):
its q reads 2048 rows instead of 8193, and those tokens are 98% of the corpus.

    python weights/train_eagle.py cache --cached DIR    # the target's features of the corpus's windows (resumable)
    python weights/train_eagle.py train --cached DIR    # resumable; checkpoints in weights/work/eagle_last.pt
                                                        # (--width d, --minutes; TRAIN_THREADS sets torch's threads)
    python weights/train_eagle.py match --cached DIR    # first-guess acceptance on the cache's held-out windows,
                                                        # beside the shipped draft's
    python weights/train_eagle.py export --cached DIR   # fp16 -> specdec_np/weights/tiny-eagle/, checked against torch
    python weights/train_eagle.py export --from DIR     # weights/recipe.py's eagle.NN.npz -> tiny-eagle/ (NumPy only)

The cache (DIR): tokens.u16.npy [W, 257] windows, feats.f16.npy [W, 257, D], lse.f32.npy [W, 257], meta.json
({"train_rows", "windows_done": training rows filled so far, in order; "held_rows": [start, stop), held-out text's
windows, never trained on; "held_done"}). Training samples from
the rows done (reread as the cache grows); batches are a function of the step and those rows; the learning rate
follows the wall-clock budget. weights/recipe.py trains a retrained target's head on a GPU with the same functions
(`make_head`, `optimizer`, `loss_of`, `train_step`, `numpy_head`, `export_error`, `first_guess`), features on the fly.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import operator
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import train_tiny  # noqa: E402  (the target's torch model, the corpus)

WORK = train_tiny.WORK
from specdec_np.files import SHIPPED_DIR  # noqa: E402  (specdec_np/weights/: the package data)

OUT = SHIPPED_DIR / "tiny-eagle"
CFG = dict(seq_len=256, batch=8, steps=1_000_000, lr=1.5e-3, min_lr=1e-4, warmup=50, weight_decay=0.01, seed=4321,
           noise=0.2, p_weight=1.0, ckpt_every=50, minutes=50.0, vocab=2048, width=192, held=64)


def heads(d: int) -> int:
    """The head's attention heads at width d: about 64 wide each (the target's size), dividing d."""
    return next(h for h in range(max(1, d // 64), 0, -1) if d % h == 0)


def make_head(target_cfg):
    """EAGLE's head over the target (width D): fc [2D -> d] on (token embedding, feature), one GPT-2 block of width
    d = min(CFG["width"], D), out [d -> D]; forward: the guessed features."""
    import torch
    import torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            D = target_cfg.n_embd
            d = min(CFG["width"], D)
            self.n_head = heads(d)
            self.fc = nn.Linear(2 * D, d)
            self.block = train_tiny.make_model(train_tiny.RunConfig("head", n_layer=1, n_head=self.n_head,
                                                                    n_embd=d)).h[0]
            self.out = nn.Linear(d, D)
            for lin in (self.fc, self.out):
                nn.init.normal_(lin.weight, 0.0, 0.02)
                nn.init.zeros_(lin.bias)

        def forward(self, emb, feat):  # [B, T, D], [B, T, D] -> the guessed features [B, T, D]
            return self.out(self.block(self.fc(torch.cat([emb, feat], dim=-1))))

    return Head()


def target_features(target, x):  # [B, T] -> [B, T, D]: the target's features (after ln_f)
    import torch

    T = x.shape[1]
    h = target.wte(x) + target.wpe(torch.arange(T, device=x.device))
    for blk in target.h:
        h = blk(h)
    return target.ln_f(h)


def head_inputs(target, x, feats):  # -> (emb [B, T-1, D], feat [B, T-1, D]) for the pairs (f_(j-1), t_j), j = 1..T-1
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


def eagle_loss(head, emb, feat, f_next, p, rows):
    """EAGLE-1's loss on pairs (emb [B, T, D] of t_j, feat [B, T, D] = f_(j-1), with EAGLE's uniform noise): smooth-L1
    of the guesses against f_next [B, T, D], plus p_weight x the cross-entropy of q (the target's head on the guesses
    over `rows` [N, D], the draft vocabulary's) against the target's p on those rows [B, T, N]: (total, reg, ce)."""
    import torch
    import torch.nn.functional as F

    if CFG["noise"]:
        feat = feat + (torch.rand_like(feat) - 0.5) * CFG["noise"]
    out = head(emb, feat)  # [B, T, D]
    logq = F.log_softmax((out @ rows.T).float(), dim=-1)  # [B, T, N]
    reg = F.smooth_l1_loss(out.float(), f_next.float())
    ce = -(p * logq).sum(-1).mean()
    return reg + CFG["p_weight"] * ce, reg, ce


def loss_of(head, target, xb, ids, device: str = "cpu"):
    """`eagle_loss` on windows xb [B, T] with the target's features computed now (weights/recipe.py, bf16 autocast as
    train_tiny.py's), q and p on the rows `ids` [N] (a tensor)."""
    import torch
    import torch.nn.functional as F

    with train_tiny.autocast(device):
        with torch.no_grad():
            feats = target_features(target, xb)  # [B, T, D]
            p = F.softmax((feats[:, 1:] @ target.wte.weight.T).float(), dim=-1)[..., ids]  # the target's p, N rows
            emb, feat = head_inputs(target, xb, feats)
        return eagle_loss(head, emb, feat, feats[:, 1:], p, target.wte.weight[ids])


def optimizer(head):
    """AdamW on the head, weight decay on its matrices only."""
    import torch

    decay = [q for q in head.parameters() if q.dim() >= 2]
    rest = [q for q in head.parameters() if q.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": CFG["weight_decay"]},
                              {"params": rest, "weight_decay": 0.0}], lr=CFG["lr"], betas=(0.9, 0.95))


def train_step(head, opt, loss) -> None:
    """One optimizer step on `loss` (gradients clipped to norm 0.5)."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
    opt.step()


# ----------------------------------------------------------------------------- the feature cache
def open_cache(root: Path) -> dict:
    """The cache's arrays (memory-mapped, read only) and its rows: "train" (those done so far), "held"."""
    meta = json.loads((root / "meta.json").read_text())
    c = {name: np.load(root / f"{name}.npy", mmap_mode="r") for name in ("tokens.u16", "feats.f16", "lse.f32")}
    held = np.arange(*meta["held_rows"]) if meta.get("held_done") else np.arange(0)
    return c | {"train": np.arange(min(int(meta["windows_done"]), meta["train_rows"])), "held": held, "meta": meta}


def cached_batch(cache: dict, step: int, wte, wpe, rows):
    """Batch `step` of the cache's training rows: (emb [B, T, D], feat [B, T, D], f_next [B, T, D], p [B, T, N])."""
    import torch

    pick = np.sort(np.random.default_rng([CFG["seed"], step]).choice(cache["train"], CFG["batch"], replace=False))
    x = torch.from_numpy(cache["tokens.u16"][pick].astype(np.int64))  # [B, T + 1]
    f = torch.from_numpy(cache["feats.f16"][pick].astype(np.float32))  # [B, T + 1, D]
    lse = torch.from_numpy(np.ascontiguousarray(cache["lse.f32"][pick]))  # [B, T + 1]
    with torch.no_grad():
        p = torch.exp(f[:, 1:] @ rows.T - lse[:, 1:, None])  # the target's p after tokens 1..T on the N rows
    return wte[x[:, 1:]] + wpe[1:x.shape[1]], f[:, :-1], f[:, 1:], p


def build_cache(root: Path, n_train: int = 4000, chunk: int = 50) -> None:
    """The cache of the shipped target's features: `n_train` windows of 257 tokens at random starts in the corpus's
    training split, then CFG["held"] evenly spaced in its held-out split (`python weights/train_tiny.py corpus`);
    the held ones first, then the training ones chunk by chunk (meta.json's windows_done: resumable)."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    target, _ = train_tiny.get_model("shipped:target")
    corpus = train_tiny.read_corpus(WORK / "corpus")
    starts = np.random.default_rng(CFG["seed"]).integers(0, corpus["train"].size - 257, size=n_train)
    held = np.linspace(0, corpus["heldout"].size - 257, CFG["held"]).astype(np.int64)
    tokens = np.stack([corpus["train"][s:s + 257] for s in starts] + [corpus["heldout"][s:s + 257] for s in held])
    W, D = len(tokens), target.wte.weight.shape[1]
    if not (root / "meta.json").exists():
        np.save(root / "tokens.u16.npy", tokens.astype(np.uint16))
        np.lib.format.open_memmap(root / "feats.f16.npy", "w+", np.float16, (W, 257, D))
        np.lib.format.open_memmap(root / "lse.f32.npy", "w+", np.float32, (W, 257))
        (root / "meta.json").write_text(json.dumps({"train_rows": n_train, "held_rows": [n_train, W], "seq": 257,
                                                    "windows_done": 0, "held_done": False}))
    meta = json.loads((root / "meta.json").read_text())
    feats, lse = (np.load(root / f"{n}.npy", mmap_mode="r+") for n in ("feats.f16", "lse.f32"))
    todo = [(n_train, W, "held_done")] * (not meta["held_done"])
    todo += [(i, min(i + chunk, n_train), "windows_done") for i in range(meta["windows_done"], n_train, chunk)]
    for i, j, key in todo:
        with torch.no_grad():
            f = target_features(target, torch.from_numpy(tokens[i:j].astype(np.int64)))  # [j - i, 257, D]
            feats[i:j], lse[i:j] = f.numpy(), torch.logsumexp(f @ target.wte.weight.T, -1).numpy()
        feats.flush(), lse.flush()
        meta[key] = True if key == "held_done" else j
        (root / "meta.json.tmp").write_text(json.dumps(meta))
        os.replace(root / "meta.json.tmp", root / "meta.json")


def train(root: Path) -> None:
    import torch

    torch.manual_seed(CFG["seed"])
    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", os.cpu_count() or 1)))
    WORK.mkdir(parents=True, exist_ok=True)
    ckpt, step, elapsed, tokens_seen = WORK / "eagle_last.pt", 0, 0.0, 0
    ck = torch.load(ckpt, weights_only=False) if ckpt.exists() else None
    if ck is not None:
        CFG.update(width=ck["cfg"]["width"], vocab=ck["cfg"]["vocab"])
    target, tcfg = train_tiny.get_model("shipped:target")
    wte, wpe = target.wte.weight.detach(), target.wpe.weight.detach()
    cache = open_cache(root)
    head = make_head(tcfg)
    opt = optimizer(head)
    if ck is not None:
        head.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed, tokens_seen, vocab = ck["step"], ck["elapsed"], ck["tokens"], ck["vocab"]
        print(f"resuming at step {step}", flush=True)
    else:  # counted on the training rows done now (ties to the lower id)
        vocab = draft_vocab(CFG["vocab"], np.asarray(cache["tokens.u16"][cache["train"]]).ravel())
    rows = wte[torch.from_numpy(np.flatnonzero(vocab))] if vocab is not None else wte  # [N, D]
    log, t0 = open(WORK / "eagle.log", "a"), time.time() - elapsed

    def save(final=False):
        state = {"model": head.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": time.time() - t0,
                 "tokens": tokens_seen, "vocab": vocab, "cfg": CFG, "threads": torch.get_num_threads(),
                 "windows": int(cache["train"].size)}
        tmp = ckpt.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, ckpt)
        if final:
            torch.save(state, WORK / "eagle_final.pt")

    while step < CFG["steps"]:
        if time.time() - t0 > 60 * CFG["minutes"]:
            print(f"time budget reached at step {step}", flush=True)
            break
        if step % 20 == 0:  # the cache may still be growing
            cache = open_cache(root)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, time.time() - t0)
        emb, feat, f_next, p = cached_batch(cache, step, wte, wpe, rows)
        loss, reg, ce = eagle_loss(head, emb, feat, f_next, p, rows)
        train_step(head, opt, loss)
        step, tokens_seen = step + 1, tokens_seen + emb.shape[0] * emb.shape[1]
        line = (f"step {step} loss {loss.item():.4f} reg {reg.item():.4f} ce {ce.item():.4f} "
                f"windows {cache['train'].size} {time.time() - t0:.0f}s")
        log.write(line + "\n")
        log.flush()
        if step % 10 == 0:
            print(line, flush=True)
        if step % CFG["ckpt_every"] == 0:
            save()
    save(final=True)


def load_head_torch():
    import torch

    ck = torch.load(WORK / "eagle_final.pt", weights_only=False)
    CFG.update(width=ck["cfg"]["width"])
    target, tcfg = train_tiny.get_model("shipped:target")
    head = make_head(tcfg)
    head.load_state_dict(ck["model"])
    head.eval()
    return head, target, tcfg, ck


def match(root: Path) -> dict:
    """First-guess acceptance on the cache's held-out windows (the target's cached features), beside the shipped
    draft's on the same windows."""
    head, target, _, ck = load_head_torch()
    draft, _ = train_tiny.get_model("shipped:draft")
    cache = open_cache(root)
    held = cache["held"]
    report = first_guess(head, target, draft, np.asarray(cache["tokens.u16"][held]), vocab=ck["vocab"],
                         feats=np.asarray(cache["feats.f16"][held]))
    report["held_windows"] = int(held.size)
    report["head"].update(tokens_seen=ck["tokens"], steps=ck["step"], minutes=round(ck["elapsed"] / 60, 1),
                          threads=ck.get("threads"), width=CFG["width"])
    print(json.dumps(report, indent=1))
    return report


def draft_vocab(n: int | None, tokens: np.ndarray) -> np.ndarray | None:
    """EAGLE-3's reduced draft vocabulary: a 0/1 row [V] of the n tokens most frequent in `tokens` (ties to the lower
    id), or None for n None (every token)."""
    if n is None:
        return None
    counts = np.bincount(tokens, minlength=train_tiny.N_VOCAB)
    mask = np.zeros(train_tiny.N_VOCAB, dtype=np.float32)
    mask[np.argsort(-counts, kind="stable")[:n]] = 1.0
    return mask


def first_guess(head, target, draft, windows: np.ndarray, device: str = "cpu", vocab=None, feats=None) -> dict:
    """{"head", "draft" (and "head, every token" with a reduced vocabulary): {"accept_topk", "argmax_agree"}} on windows
    [W, T] after each of tokens 1..T-1: the head's q (from the target's feature of the token before: `feats` [W, T, D]
    if given, else computed; with a reduced vocabulary `vocab`, its logits outside it -inf) and the draft's q against
    the target's p, accepting one token at top-k 50."""
    import torch

    windows = torch.from_numpy(windows.astype(np.int64)).to(device)
    outside = None if vocab is None else torch.from_numpy(np.asarray(vocab) == 0).to(device)
    names = ("head", "draft") + (() if vocab is None else ("head, every token",))
    out = {name: {"accept_topk": [], "argmax_agree": []} for name in names}
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            x = windows[i:i + 8]  # [B, T]
            f = (target_features(target, x) if feats is None else
                 torch.from_numpy(feats[i:i + 8].astype(np.float32)).to(device))
            p = f[:, 1:] @ target.wte.weight.T  # the target's logits after tokens 1..T-1
            q_all = head(*head_inputs(target, x, f)) @ target.wte.weight.T
            qs = {"head": q_all if outside is None else q_all.masked_fill(outside, -torch.inf),
                  "draft": draft(x)[:, 1:], "head, every token": q_all}
            for name in names:
                acc = torch.minimum(train_tiny.top_k_probs(p, 50), train_tiny.top_k_probs(qs[name], 50)).sum(-1)
                out[name]["accept_topk"].append(acc.mean().item())
                out[name]["argmax_agree"].append((p.argmax(-1) == qs[name].argmax(-1)).float().mean().item())
    return {name: {k: round(float(np.mean(v)), 4) for k, v in d.items()} for name, d in out.items()}


# The torch head's modules -> where each sits in specdec_np's {"fc", "block", "out"} (the block in gpt2.py's layout).
TORCH_PLACES = {"fc": ("fc",), "out": ("out",), "block.ln_1": ("block", "ln_1"),
                "block.c_attn": ("block", "attn", "c_attn"), "block.c_proj": ("block", "attn", "c_proj"),
                "block.ln_2": ("block", "ln_2"), "block.c_fc": ("block", "mlp", "c_fc"),
                "block.mlp_proj": ("block", "mlp", "c_proj")}  # the block's parameters in gpt2.py's order


def numpy_head(head, np_target, vocab=None):
    """The torch head as specdec_np's (`eagle.bind` to the numpy target `np_target`: fc, its one block, out; `vocab`
    its reduced draft vocabulary, `draft_vocab`, or None)."""
    from specdec_np import eagle

    sd = {k: v.detach().float().cpu().numpy() for k, v in head.state_dict().items()}
    own = {}
    for name, (*parent, leaf) in TORCH_PLACES.items():  # nn.Linear's weight is [n_out, n_in]: specdec_np's transposed
        w = sd[f"{name}.weight"] if ".ln_" in name else sd[f"{name}.weight"].T
        functools.reduce(lambda node, key: node.setdefault(key, {}), parent, own)[leaf] = {
            "g" if ".ln_" in name else "w": w, "b": sd[f"{name}.bias"]}
    return eagle.bind(np_target, head.n_head, own["fc"], own["block"], own["out"], vocab)


def load_numpy_head(head, np_head) -> None:
    """Set the torch head's weights to specdec_np's head `np_head`: `numpy_head`'s inverse, for a warm start."""
    import torch

    own, sd = {"fc": np_head.fc, "block": np_head.block, "out": np_head.out}, {}
    for name, where in TORCH_PLACES.items():
        p = functools.reduce(operator.getitem, where, own)
        sd |= {f"{name}.weight": p["g"] if ".ln_" in name else p["w"].T, f"{name}.bias": p["b"]}
    head.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()})


def export_error(head, target, loaded, window: np.ndarray) -> dict:
    """Max |difference| of specdec_np's head on the written files (`loaded`) against the torch head with its weights
    rounded to fp16 (a copy, on the CPU), over one window of tokens [T+1]: of the guessed features (head_features), and
    of q's logits on its rows (head_logits: the target's head folded into out, against the torch head's unfolded)."""
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
        want = head(*head_inputs(target, x, feats))[0]  # [T, D]
        want_logits = (want @ target.wte.weight.T).numpy()  # [T, V]
    tokens = x[0, 1:].numpy()
    mask = np.tril(np.ones((len(tokens), len(tokens)), dtype=bool))
    h = eagle.head_pass(loaded, feats[0, :-1].numpy(), tokens, np.arange(1, len(tokens) + 1), new_cache(loaded, 8),
                        mask)
    got_logits = eagle.head_logits(loaded, h)
    rows = np.isfinite(got_logits[0])
    return {"features": float(np.abs(eagle.head_features(loaded, h) - want.numpy()).max()),
            "logits": float(np.abs(got_logits[:, rows] - want_logits[:, rows]).max())}


def head_from_shards(out: Path, np_target, vocab=None):
    """The head in weights/recipe.py's eagle.NN.npz shards (its fc, block and out, flat names such as
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
    fc, out_ = {"w": flat["fc.w"], "b": flat["fc.b"]}, {"w": flat["out.w"], "b": flat["out.b"]}
    return eagle.bind(np_target, heads(fc["w"].shape[1]), fc, block, out_, vocab)


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


def export(root: Path) -> None:
    """The head in fp16 -> specdec_np/weights/tiny-eagle/ (specdec_np.eagle.save_head), then specdec_np's head on the
    written files checked against the torch head with its weights rounded to fp16, on a held-out window."""
    from specdec_np import eagle, models

    head, target, tcfg, ck = load_head_torch()
    np_target = models.load_model(models.EMBEDDED_TARGET)
    eagle.save_head(numpy_head(head, np_target, ck["vocab"]), OUT)
    loaded = models.load_head(OUT, np_target)
    cache = open_cache(root)
    err = export_error(head, target, loaded, np.asarray(cache["tokens.u16"][cache["held"][0], :65]))
    size = (OUT / "model.safetensors").stat().st_size
    print(f"exported {OUT} ({size / 1e6:.2f} MB, {loaded.weight_bytes / 1e6:.2f} MB read per pass); max |numpy - "
          f"torch|: guessed features {err['features']:.2e}, q's logits {err['logits']:.2e}")
    if err["features"] > 1e-2 or err["logits"] > 5e-2:
        raise SystemExit("export check failed: specdec_np's head pass differs from the torch head")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("cache", "train", "export", "match"))
    ap.add_argument("--cached", type=Path, default=WORK / "feats", help="the feature cache's directory")
    ap.add_argument("--minutes", type=float, default=CFG["minutes"], help="wall-clock budget of `train`")
    ap.add_argument("--steps", type=int, default=CFG["steps"])
    ap.add_argument("--width", type=int, default=CFG["width"], help="train: the head's width d (heads of about 64)")
    ap.add_argument("--from", dest="src", type=Path, help="export: weights/recipe.py's output directory")
    ap.add_argument("--vocab", type=int, default=CFG["vocab"],
                    help="train, export --from: the head drafts from the N tokens most frequent in the training split "
                         "(EAGLE-3's reduced vocabulary; 0: every token)")
    a = ap.parse_args()
    if not 0 <= a.vocab <= train_tiny.N_VOCAB:
        ap.error(f"--vocab must be between 0 and {train_tiny.N_VOCAB}, not {a.vocab}")
    if a.width < 1:
        ap.error(f"--width must be a positive integer, not {a.width}")
    CFG.update(minutes=a.minutes, steps=a.steps, vocab=a.vocab or None, width=a.width)
    if a.src is not None:
        if a.what != "export":
            ap.error("--from is for export only")
        export_shards(a.src)
    elif a.what == "cache":
        build_cache(a.cached)
    else:
        if not (a.cached / "meta.json").exists():
            ap.error(f"--cached {a.cached}: no feature cache there (meta.json; `cache` builds one)")
        {"train": train, "export": export, "match": match}[a.what](a.cached)
