"""The embedded pair's whole training recipe in one command, sized to a time budget (one device call on a GPU), with
the target's EAGLE head.

    python weights/recipe.py --device cuda --out "$OUT"     # the corpus from weights/build_corpus.py
    python weights/recipe.py --smoke --corpus DIR --out DIR # the same code path on tiny shapes, CPU, < 1 min

1. The target, trained from scratch on the corpus (train_tiny.step_loss: next-token cross-entropy; AdamW, bf16
   autocast, warm-up then cosine to 1e-4), its steps sized by `train_tiny.bench_step` on this device.
2. Against greedy loops (issue 71), a short last phase of sequence-level unlikelihood training (Welleck et al. 2019,
   `unlikelihood_phase`): each step the model continues 64 corpus prefixes of 128 tokens greedily by 128 tokens, and
   every continuation token that completes a 4-gram already in its continuation costs -log(1 - p(token)), added 1:1
   to the cross-entropy of a corpus batch. The ablation: the target before and after this phase, each with its
   held-out loss (64 held-out windows) and loop measure (HumanEval's first 16 prompts, 128 tokens); the one exported
   holds issue 71's gates (GATES: loop share at most 0.40 on average and 0.60 on every prompt, held-out loss at most
   0.95), else it is the one with the lower loop share (report.json's "ablation" holds both).
3. The exported target's own top-k 50, T=1 samples (64-token corpus prefixes, continued to 512 tokens).
4. The draft, distilled from that target (half of each batch the target's samples; 0.8 KL + 0.2 CE + 0.5 TV at
   top-k 50).
   Then the target's EAGLE head (weights/train_eagle.py's functions and design: EAGLE-1's loss on the frozen target's
   features, a 192-wide head; its pass in specdec_np on the written shards checked against the torch head), written
   as eagle.00.npz.
5. The paper's stage-2 model, a Katz backoff trigram (specdec_np.ngram, min_count 2), as build_ngram.py chose it: fitted
   on the corpus (the standard library's training split, its "corpus" candidate), whose top-1 agreed with the draft's
   argmax more often than the trigram of the draft's own T=1.5 samples (59.9% against 48.9% for the shipped pair on 40
   held-out windows; the whole training split's trigram 58.5%, at 3.6x the bytes).
6. The model card's figures: held-out loss of both models on the standard library's 64 held-out windows of 512
   (and on the packages' held-out files), the trigram's, acceptance of one drafted token at top-k 50 and argmax
   agreement (24 held-out windows; the head's first guess beside the draft's), HumanEval prompt+solution loss, and
   the loop measure of greedy completions (tools/loops.py: 128 tokens after each of HumanEval's first 16 prompts).
The acceptance profile is made on the CPU afterwards (weights/adopt_pair.py's `profile` step).

The budget (--minutes, 9.5 by default): one device call may run 600 s, and the period's 15 device minutes also pay the
machine's start (1-2 minutes), the transfers and its idle time until it is given back, with no room for a second
run (a fresh start needs 4 minutes left). 570 s of run, plus importing PyTorch, ends about 30 s before the call's
limit; the call then spends about 12-13 of the 15 minutes. Each phase gets its SHARES of what is left when it starts
(target 56%, unlikelihood 12%, draft 22%, head 10%, later phases sharing the rest in these proportions, so an early
phase that overruns shortens the later ones), less RESERVE_S (45 s) for the trigram, the figures and the checks; a
phase sized by steps stops past 1.15x its share.

The device call (the lead's checkout is what travels: its tracked files, its untracked files that git does not
ignore, and the ignored paths named in `carry`, 64 MiB in all): the tracked tree is 49.2 MiB (the shipped model files
specdec_np/weights/tiny-* 44.8 MiB of it) and the corpus weights/work/corpus 28.9 MiB, 78.0 MiB together. The recipe
reads no shipped model file, and needs neither tiktoken (prompts.json holds token ids) nor a network, so for the one
call `weights/gpu_carry.sh slim` takes the shipped model files out of git's index and ignores them (they stay on
disk; `weights/gpu_carry.sh restore` puts them back, commit nothing in between): 4.4 MiB tracked + 28.9 MiB carried
= 33.3 MiB, measured by `weights/gpu_carry.sh check`. Then `run` with

    command:   PYTHONUNBUFFERED=1 python3 weights/recipe.py --device cuda --out "$OUT"
    carry:     ["weights/work/corpus"]
    timeout_s: 600

Out (at most 8 files of at most 16 MiB, 64 MiB together; each model saved as soon as trained, a failing figure
reported in report.json and the exit status, not fatal): target.NN.npz and draft.NN.npz (fp16 parameters in
specdec_np's layout, sharded), eagle.00.npz (the head's own fc, block and out), trigram.npz, report.json, log.txt.
`python weights/export_tiny.py --from DIR` turns them into specdec_np/weights/tiny-target/, tiny-draft/ and
tiny-trigram.npz, then `python weights/train_eagle.py export --from DIR` the head into tiny-eagle/. Each shard set
is read back here and its logits (the head's: its guessed features) checked against the torch model's with fp16
weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import train_eagle as E  # noqa: E402
import train_tiny as T  # noqa: E402
from train_tiny import read_corpus  # noqa: E402  (shared with train_eagle.py)

SHARD_BYTES = (16 << 20) - (64 << 10)  # the 16 MiB a returned file may hold, less room for the .npz headers
MAX_FILES, MAX_BYTES = 8, 64 << 20
# The shapes weights/shape_study.py studied (name: n_layer, n_head, n_embd) and the smoke run's; weights/time_gates.py
# prices its targets from this table too.
SHAPES = {"8L/448": (8, 7, 448), "8L/384": (8, 6, 384), "6L/512": (6, 8, 512), "6L/320": (6, 8, 320),
          "8L/512": (8, 8, 512), "2L/128": (2, 4, 128), "3L/192": (3, 6, 192), "4L/256": (4, 8, 256),
          "2L/64": (2, 2, 64), "1L/32": (1, 1, 32)}
# The phases' shares of the budget, in their order: each phase gets its share of what is left when it starts (the
# phases still to come sharing the rest in these proportions), less RESERVE_S kept for the trigram, figures and checks.
SHARES = {"target": 0.56, "unlikelihood": 0.12, "draft": 0.22, "eagle": 0.10}
RESERVE_S = 45
# Issue 71's gates for the target, which choose the variant exported (before or after the unlikelihood phase).
GATES = {"loop_average": 0.40, "loop_max": 0.60, "heldout_nats": 0.95}
UL = {"lr": 3e-4, "warmup": 10, "prefix": 128, "new": 128, "batch": 64, "n": 4, "steps": 1_000_000}  # (smoke: below)


class Log:
    """Lines to stdout and to log.txt, each with the seconds since the start."""

    def __init__(self, path: Path):
        self.t0, self.f = time.time(), open(path, "w")

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:6.1f} s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()

    def elapsed(self) -> float:
        return time.time() - self.t0


def run_config(name: str, shape: str, smoke: bool, **kw) -> T.RunConfig:
    n_layer, n_head, n_embd = SHAPES[shape]
    ctx = {"n_ctx": 64, "seq_len": 32, "batch": 4} if smoke else {"n_ctx": 512, "seq_len": 512, "batch": 64}
    return T.RunConfig(name, n_layer=n_layer, n_head=n_head, n_embd=n_embd, **ctx, **kw)


def fit(model, cfg: T.RunConfig, tokens: np.ndarray, seconds: float, log, teacher=None, samples=None,
        device="cpu") -> dict:
    """Train `model` for cfg.steps steps (stopping early past 1.15 x `seconds`): the run's record."""
    import torch

    opt = T.optimizer(model, cfg)
    model.train()
    t0, step = time.time(), 0
    while step < cfg.steps:
        for g in opt.param_groups:
            g["lr"] = T.lr_at(cfg, step)
        loss, ce = T.train_step(model, opt, cfg, torch.from_numpy(T.batch_at(tokens, cfg, step, samples)), teacher)
        step += 1
        if step % max(1, cfg.steps // 20) == 0 or step == cfg.steps:
            log(f"{cfg.name} step {step}/{cfg.steps}: loss {loss.item():.4f}, ce {ce.item():.4f}, "
                f"{step * cfg.batch * cfg.seq_len / (time.time() - t0):.0f} tok/s")
        if time.time() - t0 > 1.15 * seconds:
            log(f"{cfg.name}: stopped at step {step} of {cfg.steps}: over its {seconds:.0f} s")
            break
    model.eval()
    return {"steps": step, "planned_steps": cfg.steps, "tokens": step * cfg.batch * cfg.seq_len,
            "seconds": round(time.time() - t0, 1), "config": dataclasses.asdict(cfg)}


def repeat_mask(seqs: np.ndarray, n: int = 4) -> np.ndarray:
    """[B, L] -> [B, L] bool: the tokens that end an n-gram already ending earlier in their row (tools/loops.py's
    `repeats`: a row's mean is the loop measure)."""
    from specdec_np.tools.loops import repeats

    return np.array([repeats(row, n) for row in seqs.tolist()], dtype=bool).reshape(seqs.shape)


def unlikelihood_loss(model, seqs, prefix: int, n: int = 4):
    """Sequence-level unlikelihood (Welleck et al. 2019, "Neural text generation with unlikelihood training", sec.
    5.2): seqs [B, prefix + L] are prefixes continued greedily by the model itself; each continuation token that
    completes an n-gram already in its continuation is a negative candidate, pushed down by -log(1 - p(token | what
    precedes it)). The mean over the B x L continuation tokens (0 where nothing repeats)."""
    import torch
    import torch.nn.functional as F

    mask = torch.from_numpy(repeat_mask(seqs[:, prefix:].cpu().numpy(), n)).to(seqs.device)  # [B, L]
    with T.autocast(str(seqs.device)):
        logits = model(seqs[:, :-1]).float()[:, prefix - 1:]  # [B, L, V]: the predictions of the continuation
    p = F.log_softmax(logits, -1).gather(-1, seqs[:, prefix:, None])[..., 0].exp()  # [B, L]
    return -(torch.log1p(-p.clamp(max=1 - 1e-5)) * mask).mean()


def unlikelihood_phase(model, cfg: T.RunConfig, tokens: np.ndarray, seconds: float, log, device, ul: dict) -> dict:
    """The target's last phase, against greedy loops: each step the next-token cross-entropy of a corpus batch (so
    quality holds) plus the unlikelihood loss of the model's own greedy continuations (ul["new"] tokens) of the
    first ul["prefix"] tokens of ul["batch"] of its windows, weighted 1:1 (the paper's mix), a fresh AdamW at a
    constant ul["lr"] after a short warm-up, for `seconds` (or ul["steps"]): the record, with the continuations'
    repeat share at its start and its end."""
    import torch

    opt = T.optimizer(model, cfg)
    t0, step, shares = time.time(), 0, []
    while step < ul["steps"] and time.time() - t0 < seconds:
        for g in opt.param_groups:
            g["lr"] = ul["lr"] * min(1.0, (step + 1) / ul["warmup"])
        xb = T.batch_at(tokens, dataclasses.replace(cfg, seed=cfg.seed + 1), step)  # not the main phase's windows
        seqs = T.sample(model, cfg, xb[:ul["batch"], :ul["prefix"]], ul["new"], 1, seed=step, device=device)
        shares.append(float(repeat_mask(seqs[:, ul["prefix"]:], ul["n"]).mean()))
        loss, ce = T.step_loss(model, cfg, torch.from_numpy(xb).to(device))
        loss_ul = unlikelihood_loss(model, torch.from_numpy(seqs).to(device), ul["prefix"], ul["n"])
        opt.zero_grad(set_to_none=True)
        (loss + loss_ul).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            log(f"unlikelihood step {step}: ce {ce.item():.4f}, ul {loss_ul.item():.4f}, "
                f"repeat share of its continuations {np.mean(shares[-10:]):.3f}")
    model.eval()
    k = max(1, min(10, step // 2))
    record = {"steps": step, "seconds": round(time.time() - t0, 1), "config": ul,
              "continuations_repeat_share": {"first": round(float(np.mean(shares[:k])), 4),
                                             "last": round(float(np.mean(shares[-k:])), 4)}}
    log(f"unlikelihood: {step} steps in {record['seconds']:.0f} s; {json.dumps(record['continuations_repeat_share'])}")
    return record


def choose(variants: dict) -> str:
    """The variant to export: one whose loop measure holds issue 71's gates with its held-out loss within the
    quality gate (of several, the lower held-out loss), else the one with the lower average loop share (then the
    lower held-out loss)."""
    def holds(v):
        return (v["loops"] is not None and v["heldout_nats"] is not None and v["heldout_nats"] <= GATES["heldout_nats"]
                and v["loops"]["average"] <= GATES["loop_average"] and v["loops"]["max"] <= GATES["loop_max"])
    ok = [k for k, v in variants.items() if holds(v)]
    if ok:
        return min(ok, key=lambda k: variants[k]["heldout_nats"])
    return min(variants, key=lambda k: (math.inf if variants[k]["loops"] is None else variants[k]["loops"]["average"],
                                        variants[k]["heldout_nats"] or math.inf))


def sized(cfg: T.RunConfig, seconds: float, tok_per_s: float) -> T.RunConfig:
    steps = max(4, int(seconds * tok_per_s / (cfg.batch * cfg.seq_len)))
    return dataclasses.replace(cfg, steps=steps, warmup=max(2, min(100, steps // 20)))


def train_head(target, t_cfg: T.RunConfig, draft, data: dict, seconds: float, out: Path, log, smoke: bool,
               device, start=None) -> dict:
    """The frozen target's EAGLE head (train_eagle.make_head: narrower than the target), trained for `seconds` (smoke:
    6 steps) with train_eagle.py's loss (q and p on the draft vocabulary's rows, counted on the training split) and
    learning rate, written as eagle.NN.npz (fp16, its own fc, block and out) and read back by specdec_np: its record,
    with the numpy head's difference from the torch head's and the held-out first guess beside the draft's. `start`:
    specdec_np's head to continue from (a warm start, on windows its first run did not draw: the seed moves on)."""
    import torch

    from specdec_np.gpt2 import GPT2, GPT2Config

    cfg = dataclasses.replace(t_cfg, name="eagle", seq_len=min(256, t_cfg.n_ctx - 1), batch=4 if smoke else 32,
                              seed=E.CFG["seed"] + (start is not None), sample_frac=0.0)
    steps = 6 if smoke else 1_000_000  # else until `seconds`: the learning rate follows the clock (E.lr_at)
    E.CFG.update(steps=steps, minutes=seconds / 60, warmup=2 if smoke else E.CFG["warmup"])
    for q in target.parameters():
        q.requires_grad_(False)
    head = E.make_head(t_cfg)
    if start is not None:
        E.load_numpy_head(head, start)
    head = head.to(device)
    opt = E.optimizer(head)
    head.train()
    vocab = E.draft_vocab(E.CFG["vocab"], data["train"])  # as `train_eagle.py export --from` counts it
    ids = torch.arange(T.N_VOCAB) if vocab is None else torch.from_numpy(np.flatnonzero(vocab))
    ids = ids.to(device)
    t0, step = time.time(), 0
    while step < steps and time.time() - t0 < seconds:
        for g in opt.param_groups:
            g["lr"] = E.lr_at(step, time.time() - t0)
        xb = torch.from_numpy(T.batch_at(data["train"], cfg, step)).to(device)
        loss, reg, ce = E.loss_of(head, target, xb, ids, device)
        E.train_step(head, opt, loss)
        step += 1
        if step % 20 == 0 or step == steps:
            log(f"eagle step {step}: loss {loss.item():.4f}, reg {reg.item():.4f}, ce {ce.item():.4f}")
    head.eval()
    record = {"steps": step, "tokens": step * cfg.batch * cfg.seq_len, "seconds": round(time.time() - t0, 1),
              "config": {"seq_len": cfg.seq_len, "batch": cfg.batch} | {k: E.CFG[k] for k in ("lr", "noise",
                                                                                               "p_weight", "width")}}
    config = GPT2Config(n_vocab=T.N_VOCAB, n_ctx=t_cfg.n_ctx, n_embd=t_cfg.n_embd, n_layer=t_cfg.n_layer,
                        n_head=t_cfg.n_head)
    np_target = GPT2(config, from_shards(out, "target"))  # the target as shipped: fp16 weights, read back
    own = E.numpy_head(head, np_target)
    record["files"] = to_shards({"fc": own.fc, "blocks": [own.block], "out": own.out}, "eagle", out)
    held = data["heldout"]
    err = E.export_error(head, target, E.head_from_shards(out, np_target, vocab), held[:min(65, t_cfg.n_ctx)])
    record["max_feature_diff_vs_torch"], record["max_logit_diff_vs_torch"] = err["features"], err["logits"]
    win = min(256, t_cfg.n_ctx - 1)
    starts = np.linspace(0, held.size - win - 2, 8 if smoke else 24).astype(np.int64)
    record["first_guess_heldout"] = E.first_guess(head, target, draft, np.stack([held[s:s + win + 1] for s in starts]),
                                                  device, vocab)
    log(f"eagle head: {step} steps in {record['seconds']:.0f} s; first guess {record['first_guess_heldout']}")
    return record


def target_samples(target, cfg: T.RunConfig, tokens: np.ndarray, n: int, prefix: int, batch: int, device) -> np.ndarray:
    """n sequences of cfg.n_ctx tokens: `prefix` corpus tokens, continued at top-k 50, T=1 by the target."""
    out = []
    for b in range(math.ceil(n / batch)):
        rng = np.random.default_rng([99, b])
        starts = rng.integers(0, tokens.size - prefix, size=batch)
        prompts = np.stack([tokens[s:s + prefix] for s in starts])
        out.append(T.sample(target, cfg, prompts, cfg.n_ctx - prefix, 50, seed=b, device=device).astype(np.uint16))
    return np.concatenate(out)[:n]


def to_shards(params: dict, prefix: str, out: Path) -> list[str]:
    """The parameters as fp16 arrays in .npz shards of at most SHARD_BYTES: the files' names."""
    flat = {}

    def walk(tree, name):
        if isinstance(tree, dict):
            for k, v in tree.items():
                walk(v, f"{name}.{k}" if name else k)
        elif isinstance(tree, list):
            for i, v in enumerate(tree):
                walk(v, f"{name}.{i}")
        else:
            flat[name] = np.asarray(tree, dtype=np.float16)
    walk(params, "")
    shards, size = [{}], 0
    for name, a in flat.items():
        if size + a.nbytes > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    names = []
    for i, shard in enumerate(shards):
        path = out / f"{prefix}.{i:02d}.npz"
        tmp = out / f"{prefix}.{i:02d}.tmp.npz"
        np.savez(tmp, **shard)
        os.replace(tmp, path)
        names.append(path.name)
    return names


def from_shards(out: Path, prefix: str) -> dict:
    """The parameters of `to_shards`' files (float32), in specdec_np's nested layout."""
    flat = {}
    for path in sorted(out.glob(f"{prefix}.[0-9][0-9].npz")):
        with np.load(path) as z:
            flat.update({k: z[k].astype(np.float32) for k in z.files})
    n_layer = 1 + max(int(k.split(".")[1]) for k in flat if k.startswith("blocks."))
    params = {"wte": flat["wte"], "wpe": flat["wpe"], "ln_f": {"g": flat["ln_f.g"], "b": flat["ln_f.b"]}, "blocks": []}
    for i in range(n_layer):
        b = {}
        for k, v in flat.items():
            if k.startswith(f"blocks.{i}."):
                node = b
                *path, leaf = k.split(".")[2:]
                for p in path:
                    node = node.setdefault(p, {})
                node[leaf] = v
        params["blocks"].append(b)
    return params


def check_shards(model, cfg: T.RunConfig, out: Path, prefix: str, window: np.ndarray) -> float:
    """Max |logit difference| of specdec_np on the shards against the torch model with fp16 weights (CPU)."""
    import copy

    import torch

    from specdec_np.gpt2 import GPT2, GPT2Config, forward, new_cache

    ref_model = copy.deepcopy(model).float().cpu()
    with torch.no_grad():
        for p in ref_model.parameters():
            p.copy_(p.half().float())
        ref = ref_model(torch.from_numpy(window.astype(np.int64))[None])[0].numpy()
    config = GPT2Config(n_vocab=T.N_VOCAB, n_ctx=cfg.n_ctx, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head)
    ours = GPT2(config, from_shards(out, prefix))
    return float(np.abs(forward(ours, window.astype(np.int64), new_cache(ours)) - ref).max())


def nll(model, seqs: list, device) -> float:
    """Mean next-token NLL (nats) over every token but the first of each sequence (each at most n_ctx)."""
    import torch
    import torch.nn.functional as F

    total, count = 0.0, 0
    with torch.no_grad(), T.autocast(device):
        for s in seqs:
            x = torch.tensor(s, dtype=torch.int64, device=device)[None]
            logits = model(x[:, :-1]).float()[0]
            total += F.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            count += len(s) - 1
    return total / max(count, 1)


def loop_measure(target, cfg: T.RunConfig, prompts: list, max_new: int, device) -> dict:
    """The loop measure (tools/loops.py) of the target's greedy completions of `prompts` (bench's truncation)."""
    from specdec_np.tools.loops import repeat_share

    room = cfg.n_ctx - max_new - 1
    shares = []
    for p in prompts:
        seq = T.sample(target, cfg, np.array([p[-room:]]), max_new, 1, seed=0, device=device)[0]
        shares.append(repeat_share(seq[len(p[-room:]):].tolist()))
    return {"average": round(float(np.mean(shares)), 4), "max": round(float(np.max(shares)), 4),
            "min": round(float(np.min(shares)), 4), "per_prompt": [round(float(x), 4) for x in shares]}


def trigram_figures(model, draft, held: np.ndarray, device, n_windows: int = 40, window: int = 256) -> dict:
    """The trigram's held-out loss and how often its top-1 equals the draft's argmax (build_ngram.py's measure)."""
    import torch

    from specdec_np import ngram

    starts = np.linspace(0, held.size - window - 1, n_windows).astype(np.int64)
    hits = total = 0
    logp = []
    for s in starts:
        w = held[s:s + window].astype(np.int64)
        with torch.no_grad(), T.autocast(device):
            am = draft(torch.from_numpy(w).to(device)[None]).float()[0].argmax(-1).cpu().numpy()
        for i in range(1, window - 1):
            ctx = w[max(0, i - 1):i + 1]
            hits += ngram.greedy_continuation(model, ctx, 1)[0] == am[i]
            logp.append(math.log(max(float(ngram.dist(model, ctx)[w[i + 1]]), 1e-30)))
            total += 1
    return {"agreement_with_draft_argmax": round(hits / total, 4), "heldout_nats": round(-float(np.mean(logp)), 4)}


def save_report(out: Path, report: dict) -> None:
    """report.json, written whole or not at all (a temporary file renamed over it)."""
    tmp = out / "report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, out / "report.json")


def head_only(a, data: dict, log, report: dict) -> int:
    """`--head-only`: an EAGLE head of the shipped target and draft, trained for what is left of the budget
    (`train_head`; smoke: 6 steps), from random weights or --head-from's head, written as eagle.00.npz beside the
    shipped target's shards, checked on them."""
    (target, t_cfg), (draft, _) = T.get_model("shipped:target"), T.get_model("shipped:draft")
    target, draft = target.to(a.device), draft.to(a.device)
    report["target"] = {"files": to_shards(T.to_numpy_params(target, t_cfg), "target", a.out), "shipped": True,
                        "config": dataclasses.asdict(t_cfg)}  # what `train_eagle.py export --from` checks
    start = None
    if a.head_from is not None:  # specdec_np's head of the shipped target, read from its checkpoint
        from specdec_np import models

        start = models.load_head(a.head_from)
        report["head_from"] = str(a.head_from)
    report["eagle"] = train_head(target, t_cfg, draft, data, 60 * a.minutes - log.elapsed(), a.out, log, a.smoke,
                                 a.device, start)
    report["seconds"] = round(log.elapsed(), 1)
    save_report(a.out, report)
    log(f"done in {report['seconds']:.0f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", help="cuda or cpu (default: cuda; with --smoke, cpu)")
    ap.add_argument("--minutes", type=float, default=9.5, help="the whole run's budget (default: %(default)s)")
    ap.add_argument("--target", default="8L/384", choices=SHAPES, help="target shape (default: %(default)s)")
    ap.add_argument("--draft", default="2L/128", choices=SHAPES, help="draft shape (default: %(default)s)")
    ap.add_argument("--corpus", type=Path, default=T.WORK / "corpus", help="build_corpus.py's output")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", T.WORK / "recipe")))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, short context, seconds: the CPU check")
    ap.add_argument("--head-only", action="store_true", help="only an EAGLE head of the shipped target, for the whole "
                    "budget (on the CPU: --head-only --device cpu --minutes 55)")
    ap.add_argument("--head-from", type=Path, help="with --head-only: continue training this head (a checkpoint "
                    "directory such as specdec_np/weights/tiny-eagle) instead of starting from random weights")
    ap.add_argument("--head-lr", type=float, default=E.CFG["lr"], help="the head's peak learning rate (default: "
                    "%(default)s; lower for --head-from)")
    a = ap.parse_args(argv)
    if a.head_from is not None and not a.head_only:
        ap.error("--head-from: only with --head-only (the full run trains a head of its own new target)")
    if not E.CFG["min_lr"] < a.head_lr <= 1:
        ap.error(f"--head-lr {a.head_lr}: must be above the final rate {E.CFG['min_lr']} and at most 1")
    E.CFG["lr"] = a.head_lr
    import torch

    if a.smoke:
        a.target, a.draft = "2L/64", "1L/32"
    a.device = a.device or ("cpu" if a.smoke else "cuda")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU visible to PyTorch (use --device cpu, or --smoke on the CPU)")
    torch.manual_seed(1234)
    torch.set_num_threads(1 if a.smoke else int(os.environ.get("TRAIN_THREADS", os.cpu_count())))
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    a.out.mkdir(parents=True, exist_ok=True)
    log = Log(a.out / "log.txt")
    budget = 60 * a.minutes
    report = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
              "torch": torch.__version__, "budget_s": budget, "smoke": a.smoke}
    data = read_corpus(a.corpus)
    prompts = json.loads((a.corpus / "prompts.json").read_text()) if (a.corpus / "prompts.json").exists() else {}
    report["corpus"] = {k: int(v.size) for k, v in data.items() if v is not None}
    log(f"corpus: {report['corpus']}; device {report['device']}")
    if a.head_only:
        return head_only(a, data, log, report)

    t_cfg = run_config("target", a.target, a.smoke, lr=1.5e-3)
    d_cfg = run_config("draft", a.draft, a.smoke, lr=3e-3, distill_from="target", distill_alpha=0.8,
                       sample_frac=0.5, tvd_weight=0.5, top_k=50)
    d_cfg = dataclasses.replace(d_cfg, seq_len=d_cfg.n_ctx - 1)  # the samples are n_ctx long
    t_tps = T.bench_step(t_cfg, a.device, steps=1 if a.smoke else 4)
    d_tps = T.bench_step(d_cfg, a.device, teacher_cfg=t_cfg, steps=1 if a.smoke else 4)
    report["bench_tok_per_s"] = {"target": round(t_tps), "draft_distill": round(d_tps)}
    ul = UL | ({"prefix": 8, "new": 16, "batch": 2, "warmup": 2, "steps": 4} if a.smoke else {})

    def seconds_for(phase):  # its share of what is left now, the phases still to come sharing the rest (smoke: fixed)
        if a.smoke:
            return {"unlikelihood": 6.0, "eagle": 60.0}.get(phase, 60.0)
        rest = list(SHARES)[list(SHARES).index(phase):]
        return max(5.0, budget - log.elapsed() - RESERVE_S) * SHARES[phase] / sum(SHARES[p] for p in rest)

    def guarded(name, fn):  # after the models are saved, a failing figure is reported, not fatal
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 (one run on a lent GPU: keep what was made)
            log(f"ERROR in {name}: {type(e).__name__}: {e}")
            report.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            return None

    held = data["heldout"]
    window = held[1000:1000 + min(256, t_cfg.n_ctx)]
    n_windows = 4 if a.smoke else 64
    loop_prompts = [p["prompt"] for p in prompts.get("humaneval", [])[:16]] or prompts.get("calibration", [])[:16]
    loop_source = "humaneval[:16]" if prompts.get("humaneval") else "calibration"

    def target_figures():  # the ablation's: held-out loss and loop measure of the target as it is now
        return {"heldout_nats": guarded("target loss", lambda: T.evaluate(target, t_cfg, held, n_windows, a.device)),
                "loops": guarded("loop measure", lambda: loop_measure(target, t_cfg, loop_prompts, 8 if a.smoke else
                                                                      128, a.device) | {"prompts": loop_source})
                if loop_prompts else None}

    target = T.make_model(t_cfg).to(a.device)
    seconds = seconds_for("target")
    t_cfg = dataclasses.replace(t_cfg, steps=12, warmup=2) if a.smoke else sized(t_cfg, seconds, t_tps)
    log(f"bench: target {t_tps:.0f} tok/s -> {t_cfg.steps} steps; draft distillation {d_tps:.0f} tok/s")
    report["target"] = fit(target, t_cfg, data["train"], seconds, log, device=a.device)
    report["target"]["files"] = to_shards(T.to_numpy_params(target, t_cfg), "target", a.out)  # kept if all else fails
    save_report(a.out, report)
    # The ablation: the target before and after the unlikelihood phase, each with its figures; one is exported.
    variants = {"before": target_figures()}
    before = {k: v.detach().clone() for k, v in target.state_dict().items()}
    report["unlikelihood"] = guarded("unlikelihood", lambda: unlikelihood_phase(
        target, t_cfg, data["train"], seconds_for("unlikelihood"), log, a.device, ul))
    if report["unlikelihood"] is not None:
        variants["after"] = target_figures()
    exported = choose(variants)
    report["ablation"] = {"variants": variants, "gates": GATES, "exported": exported}
    log(f"ablation: {json.dumps(variants)}; exported: the target {exported} the unlikelihood phase")
    if exported == "before":
        target.load_state_dict(before)
    else:
        report["target"]["files"] = to_shards(T.to_numpy_params(target, t_cfg), "target", a.out)
    save_report(a.out, report)
    n_samples, batch, prefix = (4, 4, 8) if a.smoke else (2048, 256, 64)
    t0 = time.time()
    samples = target_samples(target, t_cfg, data["train"], n_samples, prefix, batch, a.device)
    report["target_samples"] = {"sequences": int(samples.shape[0]), "seconds": round(time.time() - t0, 1)}
    log(f"target samples: {samples.shape} in {time.time() - t0:.0f} s")

    draft = T.make_model(d_cfg).to(a.device)
    if a.smoke:  # a fixed few steps, whatever the machine's load
        d_cfg = dataclasses.replace(d_cfg, steps=8, warmup=2)
    else:
        d_cfg = sized(d_cfg, seconds_for("draft"), d_tps)
    log(f"draft: {d_cfg.steps} steps")
    report["draft"] = fit(draft, d_cfg, data["train"], seconds_for("draft"), log, teacher=target, samples=samples,
                          device=a.device)
    report["draft"]["files"] = to_shards(T.to_numpy_params(draft, d_cfg), "draft", a.out)
    save_report(a.out, report)
    report["eagle"] = guarded("eagle head", lambda: train_head(target, t_cfg, draft, data, seconds_for("eagle"),
                                                               a.out, log, a.smoke, a.device))
    save_report(a.out, report)

    def stage2():  # build_ngram.py's best choice: the trigram of the standard library's training split
        from specdec_np import ngram

        t0 = time.time()
        stream = T.load_tokens(a.corpus / "stdlib_train.u16.xz").astype(np.int64)
        trigram = ngram.fit(stream, T.N_VOCAB, min_count=2)
        ngram.save(trigram, a.out / "trigram.npz")
        report["trigram"] = {"fitted_on": "stdlib_train", "tokens": int(stream.size), "min_count": 2,
                             "seconds": round(time.time() - t0, 1)}
        log(f"trigram: fitted on the standard library's {stream.size} training tokens in {time.time() - t0:.0f} s")
        return trigram
    trigram = guarded("trigram", stage2)
    save_report(a.out, report)

    figures = report["figures"] = {}
    figures["target_heldout_nats"] = variants[exported]["heldout_nats"]
    figures["draft_heldout_nats"] = guarded("draft loss", lambda: T.evaluate(draft, d_cfg, held, n_windows, a.device))
    if data["packages_heldout"] is not None and data["packages_heldout"].size > t_cfg.seq_len + 2:
        figures["target_packages_heldout_nats"] = guarded("packages loss", lambda: T.evaluate(
            target, t_cfg, data["packages_heldout"], n_windows, a.device))
    starts = np.linspace(0, held.size - 300, 24).astype(np.int64)
    win = min(256, t_cfg.n_ctx - 1)
    figures["match_heldout"] = guarded("match", lambda: T.match(
        draft, target, np.stack([held[s:s + win + 1] for s in starts]), 50, a.device))
    if trigram is not None:
        figures["trigram"] = guarded("trigram figures", lambda: trigram_figures(
            trigram, draft, held, a.device, 2 if a.smoke else 40, 32 if a.smoke else 256))
    if prompts.get("humaneval"):
        seqs = [p["full"][:t_cfg.n_ctx] for p in prompts["humaneval"]]
        figures["humaneval_nats"] = guarded("humaneval", lambda: {"target": nll(target, seqs, a.device),
                                                                  "problems": len(seqs)})
    if variants[exported]["loops"] is not None:
        figures["loop_measure"] = variants[exported]["loops"]
    log("figures: " + json.dumps(figures))
    for name, model, cfg in (("target", target, t_cfg), ("draft", draft, d_cfg)):
        report[name]["max_logit_diff_vs_torch"] = guarded(f"{name} shards", lambda: check_shards(
            model, cfg, a.out, name, window))
    report["seconds"] = round(log.elapsed(), 1)
    log(f"done in {report['seconds']:.0f} s; logit check of the shards: target "
        f"{report['target']['max_logit_diff_vs_torch']}, draft {report['draft']['max_logit_diff_vs_torch']}")
    save_report(a.out, report)
    log.f.close()
    out_files = [p for p in a.out.iterdir() if p.is_file()]
    size = sum(p.stat().st_size for p in out_files)
    if len(out_files) > MAX_FILES or size > MAX_BYTES or any(p.stat().st_size > 16 << 20 for p in out_files):
        print(f"WARNING: {len(out_files)} files, {size / 2**20:.1f} MiB: over what a device call returns")
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
