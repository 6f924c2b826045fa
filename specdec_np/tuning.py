"""The default tree shape, chosen from this machine's measured costs instead of a GPU paper's constant.

`python -m specdec_np bench --tune` measures the cost curves of the target and the draft, runs the
staged decoder greedily on a few prompts for each candidate (budget, depth) and each chain length,
and picks the shape that the cost model (every pass costs what the curve says a block of its size
costs) predicts is fastest. The choice is stored in `weights/tuned.json` with the models it was
measured for; `generate` uses it for those models, and the documented constants otherwise:
budget 8, depth 6 (tree/staged) and a chain of 4 (speculative).
"""

from __future__ import annotations

import functools
import json
import os
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


def defaults(target, draft) -> dict:
    """{"budget", "depth", "chain"} measured for this pair, else the documented FALLBACK."""
    tuned = _read(str(TUNED_FILE)) if TUNED_FILE.is_file() else {}
    if draft is not None and tuned.get("models") == model_key(target, draft):
        return {k: int(tuned[k]) for k in FALLBACK}
    return dict(FALLBACK)


def interp(curve: dict, k: int) -> float:
    ks = sorted(int(x) for x in curve)
    return float(np.interp(k, ks, [curve[x] if x in curve else curve[str(x)] for x in ks]))


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


def tuned_curves(target, draft) -> dict | None:
    """The cost curves `bench --tune` measured for this pair on this machine, if any."""
    tuned = _read(str(TUNED_FILE)) if TUNED_FILE.is_file() else {}
    if draft is not None and tuned.get("models") == model_key(target, draft):
        return tuned.get("cost_curves_ms")
    return None


def padding(curve: dict | None, limit: int = 64):
    """pad[k] for k = 0..limit from a measured curve (no padding without one); larger k: unpadded."""
    if not curve:
        return lambda k: k
    table = [0] + [pad_size(curve, k) for k in range(1, limit + 1)]
    return lambda k: table[k] if k <= limit else k


def predicted_ms(stats, curves) -> float:
    """Cost model: the sum over passes of the measured cost of a block of that size (padded)."""
    return (sum(block_ms(curves["target"], k) for k in stats.target_blocks)
            + sum(block_ms(curves["draft"], k) for k in stats.draft_blocks))


def tune(target, draft, ngram, prompts, curves, max_new_tokens=64, budgets=(2, 4, 6, 8, 12, 16, 24),
         depths=(4, 6, 8), chains=(1, 2, 3, 4, 6), out=print) -> dict:
    """Pick (budget, depth) for tree/staged and the chain length for speculative by predicted ms/token."""
    from .decode import generate

    def cost(method, **kw):
        ms = tokens = 0
        for p in prompts:
            res = generate(target, p, max_new_tokens, method=method, draft=draft, ngram=ngram, **kw)
            ms += predicted_ms(res.stats, curves)
            tokens += len(res.tokens)
        return ms / tokens

    base = cost("ar")
    out(f"autoregressive: predicted {base:.2f} ms/token")
    best_tree = min(((cost("staged", budget=b, depth=d), b, d) for b in budgets for d in depths if d <= b),
                    key=lambda x: x[0])
    out(f"staged: best budget {best_tree[1]}, depth {best_tree[2]}: predicted {best_tree[0]:.2f} ms/token "
        f"({base / best_tree[0]:.2f}x)")
    best_chain = min(((cost("speculative", depth=k), k) for k in chains), key=lambda x: x[0])
    out(f"speculative: best chain {best_chain[1]}: predicted {best_chain[0]:.2f} ms/token ({base / best_chain[0]:.2f}x)")
    return {"budget": best_tree[1], "depth": best_tree[2], "chain": best_chain[1],
            "models": model_key(target, draft), "predicted_ms_per_token": {
                "ar": base, "staged": best_tree[0], "speculative": best_chain[0]},
            "machine": {"cpus": os.cpu_count()}, "cost_curves_ms": curves}


def save(tuned: dict, path: Path = TUNED_FILE) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(tuned, indent=1) + "\n")
    os.replace(tmp, path)
    _read.cache_clear()
