"""Train the embedded tiny Python-code GPT-2 pair (target, then a draft distilled from it).

Optional tooling: needs PyTorch (`pip install -e ".[train]"`), never needed at run time. See weights/README.md.
Runs on the CPU, or on a GPU (`--device cuda`, bf16 autocast either way); `weights/recipe.py` runs the whole
recipe on a GPU in one command with these functions.

    python weights/train_tiny.py corpus            # tokenize the stdlib -> weights/work/*.npy
    python weights/train_tiny.py train target      # resumable; checkpoints in weights/work/
    python weights/train_tiny.py train draft       # distilled from the trained target
    python weights/train_tiny.py samples           # the shipped target's top-k 50, T=1 samples
    python weights/train_tiny.py train draft_t1    # the shipped draft, distilled further on them
    python weights/train_tiny.py match             # how well the shipped draft matches the shipped target
    python weights/train_tiny.py bench             # tokens/s of the training step, to size a run (--device cuda)

Everything is seeded; a run interrupted at any point resumes from its last checkpoint with the
same data order (batches are a function of the step number).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import lzma
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
sys.path.insert(0, str(HERE.parent))

N_VOCAB = 8193  # GPT-2 BPE restricted to its first 8192 ranks + <|endoftext|> (id 8192)
HELDOUT_EVERY = 20  # a file is held out when sha1(relative path) % 20 == 0 (~5% of files)


@dataclass
class RunConfig:
    name: str
    n_layer: int
    n_head: int
    n_embd: int
    n_ctx: int = 512
    seq_len: int = 512
    batch: int = 16
    steps: int = 1000
    lr: float = 2e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    seed: int = 1234
    distill_from: str | None = None  # name of the teacher run (draft only)
    distill_alpha: float = 1.0  # weight of KL(teacher || student); 1 - alpha on the corpus CE
    ckpt_every: int = 100
    init_from: str | None = None  # start from these weights ("shipped:draft" = specdec_np/weights/tiny-draft)
    sample_frac: float = 0.0  # fraction of each batch drawn from the teacher's samples (work/samples_train.npy)
    tvd_weight: float = 0.0  # + tvd_weight x total variation between the top-k processed distributions
    top_k: int = 50  # the k of that top-k (the benchmark's sampled setting: top-k 50, T=1)


RUNS = {
    # ~10M parameters, ~20 MFLOPs/token; ~2-3 s/step (bf16 autocast, 2 threads): ~60 min.
    "target": RunConfig("target", n_layer=6, n_head=8, n_embd=320, steps=1600, lr=1.5e-3),
    # ~1.5M parameters, ~3 MFLOPs/token (7x fewer than the target), distilled from it.
    "draft": RunConfig("draft", n_layer=2, n_head=4, n_embd=128, steps=1000, lr=3e-3,
                       distill_from="target", distill_alpha=0.8),
    # The shipped draft, distilled further on contexts the decoder actually meets at T=1 (half the
    # batch: the target's own top-k 50 samples), matching the top-k processed distributions whose
    # overlap sum(min(p, q)) is the acceptance rate, not only the full softmax.
    "draft_t1": RunConfig("draft_t1", n_layer=2, n_head=4, n_embd=128, seq_len=511, steps=300, lr=1e-3, warmup=20,
                          distill_from="shipped:target", init_from="shipped:draft", sample_frac=0.5,
                          tvd_weight=1.0),
}


# ----------------------------------------------------------------------------- corpus

def stdlib_files() -> tuple[Path, list[str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    return root, rel


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


def build_corpus() -> None:
    from specdec_np.tokenizer import get_encoding

    enc = get_encoding(N_VOCAB)
    root, rel = stdlib_files()
    WORK.mkdir(exist_ok=True)
    parts = {"train": [], "heldout": []}
    n_files = {"train": 0, "heldout": 0}
    for r in rel:
        try:
            text = (root / r).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test files are deliberately not UTF-8
        split = "heldout" if is_heldout(r) else "train"
        parts[split].append(np.array(enc.encode_ordinary(text) + [enc.eot_token], dtype=np.uint16))
        n_files[split] += 1
    info = {"python": sys.version.split()[0], "stdlib": str(root), "n_vocab": N_VOCAB}
    for split, arrs in parts.items():
        toks = np.concatenate(arrs)
        np.save(WORK / f"{split}.npy", toks)
        info[split] = {"files": n_files[split], "tokens": int(toks.size)}
    (WORK / "corpus.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))


def load_tokens(path: Path) -> np.ndarray:
    """A token array: .npy, or .u16.xz (little-endian uint16, xz-compressed: weights/build_corpus.py)."""
    if path.name.endswith(".u16.xz"):
        with lzma.open(path) as f:
            return np.frombuffer(f.read(), dtype="<u2").astype(np.uint16)
    return np.load(path)


def read_corpus(corpus: Path) -> dict:
    """{"train", "heldout", "packages_heldout"}: token arrays (train: the stdlib's and the packages' training files)."""
    names = ("stdlib_train", "stdlib_heldout", "packages_train", "packages_heldout")
    parts = {n: load_tokens(corpus / f"{n}.u16.xz") for n in names if (corpus / f"{n}.u16.xz").exists()}
    train = np.concatenate([parts[n] for n in ("stdlib_train", "packages_train") if n in parts])
    return {"train": train, "heldout": parts["stdlib_heldout"], "packages_heldout": parts.get("packages_heldout")}


# ----------------------------------------------------------------------------- model (torch)

def make_model(cfg: RunConfig):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg.n_embd
            self.ln_1 = nn.LayerNorm(d, eps=1e-5)
            self.c_attn = nn.Linear(d, 3 * d)
            self.c_proj = nn.Linear(d, d)
            self.ln_2 = nn.LayerNorm(d, eps=1e-5)
            self.c_fc = nn.Linear(d, 4 * d)
            self.mlp_proj = nn.Linear(4 * d, d)

        def forward(self, x, cache=None, pos0=0):  # cache: [2, B, head, n, head dim] (sampling only)
            B, T, d = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            h = cfg.n_head
            q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k, v))
            if cache is not None:  # keys and values of positions pos0.. join the cached ones
                cache[0, :, :, pos0:pos0 + T], cache[1, :, :, pos0:pos0 + T] = k, v
                k, v = cache[0, :, :, :pos0 + T], cache[1, :, :, :pos0 + T]
            a = F.scaled_dot_product_attention(q, k, v, is_causal=pos0 == 0)  # a later token sees all
            x = x + self.c_proj(a.transpose(1, 2).reshape(B, T, d))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(N_VOCAB, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.n_ctx, cfg.n_embd)
            self.h = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd, eps=1e-5)
            self.apply(self._init)
            for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
                if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

        @staticmethod
        def _init(m):
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)

        def forward(self, idx, caches=None, pos0=0):  # [B, T] -> logits [B, T, n_vocab]
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(pos0, pos0 + T, device=idx.device))
            for i, blk in enumerate(self.h):
                x = blk(x, None if caches is None else caches[i], pos0)
            return self.ln_f(x) @ self.wte.weight.T  # tied LM head

    return GPT()


def to_numpy_params(model, cfg: RunConfig) -> dict:
    """The torch model's weights in specdec_np's parameter layout (Conv1D orientation [in, out])."""
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    blocks = []
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        blocks.append({
            "ln_1": {"g": sd[p + "ln_1.weight"], "b": sd[p + "ln_1.bias"]},
            "attn": {"c_attn": {"w": sd[p + "c_attn.weight"].T.copy(), "b": sd[p + "c_attn.bias"]},
                     "c_proj": {"w": sd[p + "c_proj.weight"].T.copy(), "b": sd[p + "c_proj.bias"]}},
            "ln_2": {"g": sd[p + "ln_2.weight"], "b": sd[p + "ln_2.bias"]},
            "mlp": {"c_fc": {"w": sd[p + "c_fc.weight"].T.copy(), "b": sd[p + "c_fc.bias"]},
                    "c_proj": {"w": sd[p + "mlp_proj.weight"].T.copy(), "b": sd[p + "mlp_proj.bias"]}},
        })
    return {"wte": sd["wte.weight"], "wpe": sd["wpe.weight"], "blocks": blocks,
            "ln_f": {"g": sd["ln_f.weight"], "b": sd["ln_f.bias"]}}


# ----------------------------------------------------------------------------- training

def from_numpy_params(model, params: dict) -> None:
    """Copy specdec_np parameters into the torch model (the inverse of to_numpy_params)."""
    import torch

    sd = {"wte.weight": params["wte"], "wpe.weight": params["wpe"],
          "ln_f.weight": params["ln_f"]["g"], "ln_f.bias": params["ln_f"]["b"]}
    for i, b in enumerate(params["blocks"]):
        p = f"h.{i}."
        sd.update({p + "ln_1.weight": b["ln_1"]["g"], p + "ln_1.bias": b["ln_1"]["b"],
                   p + "c_attn.weight": b["attn"]["c_attn"]["w"].T, p + "c_attn.bias": b["attn"]["c_attn"]["b"],
                   p + "c_proj.weight": b["attn"]["c_proj"]["w"].T, p + "c_proj.bias": b["attn"]["c_proj"]["b"],
                   p + "ln_2.weight": b["ln_2"]["g"], p + "ln_2.bias": b["ln_2"]["b"],
                   p + "c_fc.weight": b["mlp"]["c_fc"]["w"].T, p + "c_fc.bias": b["mlp"]["c_fc"]["b"],
                   p + "mlp_proj.weight": b["mlp"]["c_proj"]["w"].T, p + "mlp_proj.bias": b["mlp"]["c_proj"]["b"]})
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()})


def get_model(name: str):
    """A run's final torch model, or "shipped:NAME" = the committed specdec_np/weights/tiny-NAME/ checkpoint."""
    if not name.startswith("shipped:"):
        return load_run(name)
    from specdec_np import checkpoint

    which = name.split(":", 1)[1]
    shipped = checkpoint.load(HERE.parent / "specdec_np" / "weights" / f"tiny-{which}")
    # The run's settings with the shipped model's shape (the GPU recipe may have trained another shape).
    c = shipped.config
    cfg = dataclasses.replace(next(r for r in RUNS.values() if r.name == which), n_layer=c.n_layer,
                              n_head=c.n_head, n_embd=c.n_embd, n_ctx=c.n_ctx)
    model = make_model(cfg)
    from_numpy_params(model, shipped.params)
    model.eval()
    return model, cfg


def top_k_probs(logits, k: int):  # [..., V] -> [..., V]: softmax over the k largest logits, 0 elsewhere
    import torch
    import torch.nn.functional as F

    v, i = logits.topk(k, dim=-1)
    return torch.zeros_like(logits).scatter(-1, i, F.softmax(v, dim=-1))


def sample(model, cfg: RunConfig, prompts: np.ndarray, n_new: int, top_k: int, seed: int, temperature: float = 1.0,
           device: str = "cpu") -> np.ndarray:
    """Continue each prompt [B, P] by n_new tokens drawn at `temperature` from the top-k processed model (top_k 1:
    greedy), with a KV cache -> [B, P + n_new]."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    B, P = prompts.shape
    n = P + n_new
    caches = torch.zeros(cfg.n_layer, 2, B, cfg.n_head, n, cfg.n_embd // cfg.n_head,
                         device=device)  # [layer, k/v, B, head, n, head dim]
    out = torch.zeros(B, n, dtype=torch.int64, device=device)
    out[:, :P] = torch.from_numpy(prompts.astype(np.int64))
    with torch.no_grad():
        logits = model(out[:, :P], caches)[:, -1]  # [B, V]
        for t in range(P, n):
            if top_k == 1:
                out[:, t] = logits.argmax(-1)
            else:
                probs = top_k_probs(logits.float() / temperature, top_k)
                out[:, t:t + 1] = torch.multinomial(probs, 1, generator=gen)  # [B, 1]
            if t + 1 < n:
                logits = model(out[:, t:t + 1], caches, pos0=t)[:, -1]
    return out.cpu().numpy()


def autocast(device: str, enabled: bool = True):
    """bf16 autocast on the CPU or the GPU (the models train and sample in it, weights in float32)."""
    import torch

    return torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16, enabled=enabled)


SAMPLES = {"train": 2048, "heldout": 64}  # sequences of 512 tokens: 64 of corpus text, 448 sampled


def make_samples(batch: int = 64, prefix: int = 64) -> None:
    """The shipped target's top-k 50, T=1 continuations of corpus prefixes (held-out prefixes for the
    held-out set), in work/samples_{split}.npy; resumable batch by batch."""
    import torch

    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", "2")))
    target, cfg = get_model("shipped:target")
    for split, n in SAMPLES.items():
        toks = np.load(WORK / f"{split}.npy")
        path = WORK / f"samples_{split}.npy"
        done = np.load(path) if path.exists() else np.zeros((0, cfg.n_ctx), np.uint16)
        t0 = time.time()
        for b in range(done.shape[0] // batch, n // batch):
            rng = np.random.default_rng([99, b, split == "heldout"])
            starts = rng.integers(0, toks.size - prefix, size=batch)
            prompts = np.stack([toks[s:s + prefix] for s in starts])
            seqs = sample(target, cfg, prompts, cfg.n_ctx - prefix, 50, seed=b + 1000 * (split == "heldout"))
            done = np.concatenate([done, seqs.astype(np.uint16)])
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, done)
            os.replace(tmp, path)
            print(f"{split}: {done.shape[0]}/{n} sequences, {time.time() - t0:.0f} s", flush=True)


def match(student, teacher, windows: np.ndarray, k: int, device: str = "cpu") -> dict:
    """How well the student matches the teacher on windows [N, T+1]: the acceptance rate of one
    drafted token at top-k k, T=1 (sum min(p, q) of the processed distributions), argmax agreement
    (the greedy acceptance rate) and KL(p || q) of the raw T=1 distributions."""
    import torch
    import torch.nn.functional as F

    acc, agree, kl = [], [], []
    with torch.no_grad():
        for i in range(0, len(windows), 8):
            x = torch.from_numpy(windows[i:i + 8, :-1].astype(np.int64)).to(device)
            tl, sl = teacher(x).float(), student(x).float()
            acc.append(torch.minimum(top_k_probs(tl, k), top_k_probs(sl, k)).sum(-1).mean().item())
            agree.append((tl.argmax(-1) == sl.argmax(-1)).float().mean().item())
            tp, sp = F.log_softmax(tl, -1), F.log_softmax(sl, -1)
            kl.append((tp.exp() * (tp - sp)).sum(-1).mean().item())
    return {"accept_topk": round(float(np.mean(acc)), 4), "argmax_agree": round(float(np.mean(agree)), 4),
            "kl": round(float(np.mean(kl)), 4)}


def report_match() -> None:
    """The model card's agreement numbers for the shipped pair: on 24 evenly spaced held-out windows
    of 256 tokens, and on the target's held-out samples."""
    target, _ = get_model("shipped:target")
    draft, cfg = get_model("shipped:draft")
    held = np.load(WORK / "heldout.npy")
    starts = np.linspace(0, held.size - 300, 24).astype(np.int64)
    windows = np.stack([held[s:s + 257] for s in starts])
    print("held-out text:", match(draft, target, windows, 50))
    if (WORK / "samples_heldout.npy").exists():
        print("target's held-out samples:", match(draft, target, np.load(WORK / "samples_heldout.npy"), 50))
    print("held-out loss (nats/token):", round(evaluate(draft, cfg, held), 4))


def lr_at(cfg: RunConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def batch_at(tokens: np.ndarray, cfg: RunConfig, step: int, samples: np.ndarray | None = None) -> np.ndarray:
    """Random windows of seq_len+1 tokens (a fraction sample_frac of them: the first seq_len+1 tokens
    of random sampled sequences); a pure function of (seed, step), so resuming is exact."""
    rng = np.random.default_rng([cfg.seed, step])
    n_samples = round(cfg.batch * cfg.sample_frac) if samples is not None else 0
    starts = rng.integers(0, tokens.size - cfg.seq_len - 1, size=cfg.batch - n_samples)
    rows = [tokens[s:s + cfg.seq_len + 1] for s in starts]
    if n_samples:
        rows += list(samples[rng.integers(0, len(samples), size=n_samples), :cfg.seq_len + 1])
    return np.stack(rows).astype(np.int64)


def load_run(name: str, which: str = "final"):
    import torch

    cfg = RUNS[name]
    model = make_model(cfg)
    ck = torch.load(WORK / f"{name}_{which}.pt", weights_only=False)
    model.load_state_dict(ck["model"])
    model.eval()
    return model, cfg


def evaluate(model, cfg: RunConfig, tokens: np.ndarray, n_windows: int = 64, device: str = "cpu") -> float:
    """Mean next-token NLL (nats/token) over fixed evenly spaced held-out windows."""
    import torch
    import torch.nn.functional as F

    starts = np.linspace(0, tokens.size - cfg.seq_len - 2, n_windows).astype(np.int64)
    losses = []
    with torch.no_grad():
        for i in range(0, n_windows, 16):
            xb = torch.from_numpy(np.stack([tokens[s:s + cfg.seq_len + 1] for s in starts[i:i + 16]]).astype(np.int64))
            xb = xb.to(device)
            logits = model(xb[:, :-1]).float()
            losses.append(F.cross_entropy(logits.reshape(-1, N_VOCAB), xb[:, 1:].reshape(-1)).item())
    return float(np.mean(losses))


def optimizer(model, cfg: RunConfig):
    """AdamW (0.9, 0.95), weight decay on matrices only."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def step_loss(model, cfg: RunConfig, xb, teacher=None, bf16: bool = True):
    """(loss, cross-entropy) of a batch of windows [B, T + 1] on the model's device: next-token cross-entropy, or
    with a teacher distill_alpha x KL(teacher || model) + (1 - distill_alpha) x CE + tvd_weight x the total
    variation of the top-k processed distributions (1 - sum min(p, q): the rejection rate at top-k, T=1)."""
    import torch
    import torch.nn.functional as F

    x, y = xb[:, :-1], xb[:, 1:]
    with autocast(str(xb.device), bf16):
        logits = model(x)
        ce = F.cross_entropy(logits.float().reshape(-1, N_VOCAB), y.reshape(-1))
        loss = ce
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(x).float()
                t_logp = F.log_softmax(t_logits, dim=-1)
            s_logp = F.log_softmax(logits.float(), dim=-1)
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
            loss = cfg.distill_alpha * kl + (1 - cfg.distill_alpha) * ce
            if cfg.tvd_weight:
                p, q = top_k_probs(t_logits, cfg.top_k), top_k_probs(logits.float(), cfg.top_k)
                tvd = 0.5 * (p - q).abs().sum(-1).mean()
                loss = loss + cfg.tvd_weight * tvd
    return loss, ce


def train_step(model, opt, cfg: RunConfig, xb, teacher=None, bf16: bool = True):
    """One optimiser step on a batch [B, T + 1] (moved to the model's device), clipped at 1.0 -> (loss, ce)."""
    import torch

    loss, ce = step_loss(model, cfg, xb.to(next(model.parameters()).device), teacher, bf16)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss, ce


def train(name: str, bf16: bool = True, device: str = "cpu") -> None:
    import torch

    cfg = RUNS[name]
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", "2")))
    train_toks = np.load(WORK / "train.npy")
    held_toks = np.load(WORK / "heldout.npy")
    model = (get_model(cfg.init_from)[0].train() if cfg.init_from else make_model(cfg)).to(device)
    teacher = get_model(cfg.distill_from)[0].to(device) if cfg.distill_from else None
    samples = np.load(WORK / "samples_train.npy") if cfg.sample_frac else None
    held_samples = np.load(WORK / "samples_heldout.npy")[:32] if cfg.sample_frac else None
    opt = optimizer(model, cfg)
    ckpt = WORK / f"{name}_last.pt"
    log_path = WORK / f"{name}.log"
    step, elapsed = 0, 0.0
    if ckpt.exists():
        ck = torch.load(ckpt, weights_only=False, map_location=device)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, elapsed = ck["step"], ck["elapsed"]
        print(f"resuming {name} at step {step}", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n_params / 1e6:.2f}M params, config {asdict(cfg)}", flush=True)
    log = open(log_path, "a")
    t0 = time.time()
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step)
        if step == 0 and held_samples is not None:  # where the student starts
            print(json.dumps({"step": 0, "match_samples": match(model.eval(), teacher, held_samples, cfg.top_k, device)}),
                  file=log, flush=True)
            model.train()
        loss, ce = train_step(model, opt, cfg, torch.from_numpy(batch_at(train_toks, cfg, step, samples)), teacher, bf16)
        step += 1
        if step % 10 == 0 or step == cfg.steps:
            now = elapsed + time.time() - t0
            rec = {"step": step, "loss": round(loss.item(), 4), "ce": round(ce.item(), 4),
                   "lr": lr_at(cfg, step - 1), "elapsed_s": round(now, 1),
                   "tok_per_s": round(step * cfg.batch * cfg.seq_len / max(now, 1e-9))}
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                model.eval()
                rec["heldout_nats"] = round(evaluate(model, cfg, held_toks, device=device), 4)
                if held_samples is not None:
                    rec["match_samples"] = match(model, teacher, held_samples, cfg.top_k, device)
                model.train()
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                            "elapsed": now}, tmp)
                os.replace(tmp, ckpt)
            print(json.dumps(rec), file=log, flush=True)
            print(json.dumps(rec), flush=True)
    now = elapsed + time.time() - t0
    torch.save({"model": model.state_dict(), "step": step, "elapsed": now,
                "tokens": step * cfg.batch * cfg.seq_len, "config": asdict(cfg)}, WORK / f"{name}_final.pt")
    print(f"done {name}: {step} steps, {now / 60:.1f} min", flush=True)


def bench_step(cfg: RunConfig, device: str = "cpu", bf16: bool = True, teacher_cfg: RunConfig | None = None,
               steps: int = 4) -> float:
    """Tokens per second of `train_step` for a run of `cfg`'s shape on `device` (random weights and tokens; with
    `teacher_cfg`, distilling from a model of that shape), after two warm-up steps: what sizes a run."""
    import torch

    model = make_model(cfg).to(device)
    teacher = make_model(teacher_cfg).to(device).eval() if teacher_cfg else None
    opt = optimizer(model, cfg)
    xb = torch.randint(0, N_VOCAB, (cfg.batch, cfg.seq_len + 1), device=device)
    for i in range(2 + steps):
        if i == 2:
            sync(device)
            t = time.perf_counter()
        train_step(model, opt, cfg, xb, teacher, bf16)
    sync(device)
    return steps * cfg.batch * cfg.seq_len / (time.perf_counter() - t)


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench(name: str, bf16: bool, device: str = "cpu") -> None:
    import torch

    cfg = RUNS[name]
    torch.set_num_threads(int(os.environ.get("TRAIN_THREADS", "2")))
    teacher = next((c for c in RUNS.values() if c.name == (cfg.distill_from or "").split(":")[-1]), None)
    tps = bench_step(cfg, device, bf16, teacher)
    print(f"{name} bf16={bf16} on {device}: {cfg.batch * cfg.seq_len / tps * 1000:.0f} ms/step, {tps:.0f} tok/s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["corpus", "samples", "train", "match", "bench"])
    ap.add_argument("run", nargs="?", default="target", choices=sorted(RUNS))
    ap.add_argument("--fp32", action="store_true", help="train in float32 instead of bf16 autocast")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (train, bench)")
    a = ap.parse_args()
    if a.cmd == "corpus":
        build_corpus()
    elif a.cmd == "samples":
        make_samples()
    elif a.cmd == "match":
        report_match()
    elif a.cmd == "train":
        train(a.run, bf16=not a.fp32, device=a.device)
    else:
        bench(a.run, bf16=not a.fp32, device=a.device)
