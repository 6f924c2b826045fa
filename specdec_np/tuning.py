"""The cost model, and the default tree shape chosen from it instead of a GPU paper's constant.

Cost model: a decoding run costs the measured cost curve of every forward pass it made (padded as
`pad_size` says), plus a fixed overhead per target pass, per draft pass and per n-gram query: the
Python and NumPy work around the forward passes (building trees and masks, processing logits,
verifying, moving the caches). On a 10M-parameter target that work is not small next to a pass.

`python -m specdec_np bench --tune` measures the cost curves, fits the three overheads on a few
calibration prompts (autoregressive, tree and staged runs), then runs the staged decoder for each
candidate (budget, depth) and the chain decoder for each chain length, greedily and with top-k
sampling, and stores the shapes the model predicts fastest in `weights/tuned.json` with the
models they were measured for. `generate` uses them for those models, and the documented
constants otherwise: budget 8, depth 6 (tree/staged) and a chain of 4 (speculative).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import numpy as np

FALLBACK = {"budget": 8, "depth": 6, "chain": 4}
TUNED_FILE = Path(__file__).resolve().parent.parent / "weights" / "tuned.json"


def model_key(target, draft) -> str:
    """Which pair a measurement belongs to (parameter counts are enough to tell ours apart)."""
    return f"{target.n_params}+{draft.n_params if draft is not None else 0}"


@functools.lru_cache(maxsize=4)
def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def tuned_for(target, draft) -> dict:
    """What `bench --tune` stored for this pair on this machine ({} if nothing)."""
    tuned = _read(str(TUNED_FILE)) if TUNED_FILE.is_file() else {}
    return tuned if draft is not None and tuned.get("models") == model_key(target, draft) else {}


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def defaults(target, draft, temperature=0.0) -> dict:
    """{"budget", "depth", "chain"} measured for this pair and setting, else the documented FALLBACK."""
    shape = tuned_for(target, draft).get("shapes", {}).get(setting_name(temperature))
    return {k: int(shape[k]) for k in FALLBACK} if shape else dict(FALLBACK)


def tuned_curves(target, draft) -> dict | None:
    """The cost curves `bench --tune` measured for this pair on this machine, if any."""
    return tuned_for(target, draft).get("cost_curves_ms")


def tuned_overheads(target, draft) -> dict | None:
    return tuned_for(target, draft).get("overheads_ms")


# ----------------------------------------------------------------------------- the cost curve

def interp(curve: dict, k: int) -> float:
    """Cost of a k-token pass: linear between measured sizes, extended linearly past the last two
    (a prompt's prefill is longer than any tree)."""
    ks = sorted(int(x) for x in curve)
    ms = [curve[x] if x in curve else curve[str(x)] for x in ks]
    if k > ks[-1] and len(ks) > 1:
        return ms[-1] + (k - ks[-1]) * (ms[-1] - ms[-2]) / (ks[-1] - ks[-2])
    return float(np.interp(k, ks, ms))


def pad_size(curve: dict, k: int) -> int:
    """The block size to compute k tokens as: the measured size >= k that costs least (ties: the
    smaller), or k itself. OpenBLAS works in panels of 4 and 8 columns, so on this machine 5-7
    tokens cost more than 8 and 13-15 more than 16: padding with dummy rows is free speed."""
    best, best_ms = k, interp(curve, k)
    for size in sorted(int(x) for x in curve):
        if size > k and interp(curve, size) < best_ms:
            best, best_ms = size, interp(curve, size)
    return best


def block_ms(curve: dict, k: int) -> float:
    """What a pass of k tokens costs when padded as `pad_size` says."""
    return interp(curve, pad_size(curve, k))


def padding(curve: dict | None, limit: int = 64):
    """pad[k] for k = 0..limit from a measured curve (no padding without one); larger k: unpadded."""
    if not curve:
        return lambda k: k
    table = [0] + [pad_size(curve, k) for k in range(1, limit + 1)]
    return lambda k: table[k] if k <= limit else k


# ----------------------------------------------------------------------------- the cost model

def forward_ms(stats, curves) -> float:
    """The forward passes of a run, as the measured curves price them."""
    return (sum(block_ms(curves["target"], k) for k in stats.target_blocks)
            + sum(block_ms(curves["draft"], k) for k in stats.draft_blocks))


def predicted_ms(stats, curves, overheads=None) -> float:
    """Cost model: every pass at its (padded) measured cost, plus the fixed overheads per target
    pass, draft pass and n-gram query (none when not measured)."""
    o = overheads or {}
    return (forward_ms(stats, curves) + o.get("target_pass", 0.0) * stats.target_passes
            + o.get("draft_pass", 0.0) * stats.draft_passes + o.get("ngram_query", 0.0) * stats.ngram_queries)


def fit_overheads(runs, curves) -> dict:
    """Overheads (ms) from timed runs [(method, stats, wall seconds)]: per target pass from the
    autoregressive runs, then per draft pass from the tree runs, then per n-gram query from the
    staged runs, each the wall time the curves and the earlier overheads do not explain."""
    def residual(method, o):
        rs = [(1000 * sec - predicted_ms(s, curves, o), s) for m, s, sec in runs if m == method]
        return sum(r for r, _ in rs), rs

    o = {}
    total, rs = residual("ar", o)
    o["target_pass"] = max(0.0, total / max(1, sum(s.target_passes for _, s in rs)))
    total, rs = residual("tree", o)
    o["draft_pass"] = max(0.0, total / max(1, sum(s.draft_passes for _, s in rs)))
    total, rs = residual("staged", o)
    o["ngram_query"] = max(0.0, total / max(1, sum(s.ngram_queries for _, s in rs)))
    return o


# ----------------------------------------------------------------------------- tuning

SAMPLED = {"temperature": 1.0, "top_k": 50}  # the sampled setting tuned (and benchmarked)


def calibrate(target, draft, ngram, prompts, curves, max_new_tokens=64, out=print) -> dict:
    """Time autoregressive, tree and staged runs (greedy) and fit the per-pass overheads."""
    from .decode import generate

    runs = []
    for p in prompts:
        for m in ("ar", "tree", "staged"):
            t0 = time.perf_counter()
            res = generate(target, p, max_new_tokens, method=m, draft=draft, ngram=ngram)
            runs.append((m, res.stats, time.perf_counter() - t0))
    o = fit_overheads(runs, curves)
    out(f"overheads: {o['target_pass']:.3f} ms per target pass, {o['draft_pass']:.3f} ms per draft pass, "
        f"{o['ngram_query']:.4f} ms per n-gram query")
    return o


def tune(target, draft, ngram, prompts, curves, max_new_tokens=64, budgets=(1, 2, 3, 5, 7, 9, 11, 15, 23, 31),
         depths=(3, 4, 6, 8), chains=(1, 2, 3, 4, 6), out=print) -> dict:
    """Pick (budget, depth) for tree/staged and the chain length for speculative, per setting,
    by the cost model's predicted ms per token."""
    from .decode import generate

    overheads = calibrate(target, draft, ngram, prompts, curves, max_new_tokens, out)

    def cost(method, kw):
        ms = tokens = 0
        for i, p in enumerate(prompts):
            res = generate(target, p, max_new_tokens, method=method, draft=draft, ngram=ngram, seed=i, **kw)
            ms += predicted_ms(res.stats, curves, overheads)
            tokens += len(res.tokens)
        return ms / tokens

    shapes, predicted = {}, {}
    for name, setting in (("greedy", {}), ("sampled", SAMPLED)):
        base = cost("ar", setting)
        tree = min(((cost("staged", dict(setting, budget=b, depth=d)), b, d) for b in budgets for d in depths if d <= b),
                   key=lambda x: x[0])
        chain = min(((cost("speculative", dict(setting, depth=k)), k) for k in chains), key=lambda x: x[0])
        out(f"{name}: autoregressive {base:.2f} ms/token; staged budget {tree[1]}, depth {tree[2]}: "
            f"{tree[0]:.2f} ms/token ({base / tree[0]:.2f}x); speculative chain {chain[1]}: "
            f"{chain[0]:.2f} ms/token ({base / chain[0]:.2f}x)")
        shapes[name] = {"budget": tree[1], "depth": tree[2], "chain": chain[1]}
        predicted[name] = {"ar": base, "staged": tree[0], "speculative": chain[0]}
    return {"models": model_key(target, draft), "shapes": shapes, "predicted_ms_per_token": predicted,
            "overheads_ms": overheads, "machine": {"cpus": os.cpu_count()}, "cost_curves_ms": curves}


def save(tuned: dict, path: Path = TUNED_FILE) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(tuned, indent=1) + "\n")
    os.replace(tmp, path)
    _read.cache_clear()
