"""The cost model: what a decoding plan costs on this machine, from counted work and measured costs.

A plan's milliseconds per token = (its forward passes, each at this machine's cost for its block
size as the model's padding table pads it, "cold" when the other model ran just before and "warm"
otherwise (`costcurve.loop_curves`), plus the Python and NumPy work around the passes: a fixed
overhead per step, per step that drafts, per distribution the draft processes and per n-gram query)
/ the tokens it emits. The counts come from an acceptance profile (`acceptance.py`) or a run's
statistics, the costs from this machine (`calibration.py`).
"""

from __future__ import annotations

import functools

import numpy as np

OVERHEADS = ("step", "draft_step", "draft_dist", "ngram_query")


def padded(table, n: int) -> int:
    """The block size a padding table computes n rows as (n past its end), as `GPT2.padded` does."""
    return table[n - 1] if n <= len(table) else n


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
    smaller), or k. OpenBLAS works in panels of 4 and 8 columns, so where 5-7 tokens cost more than
    8, padding with dummy rows is free speed."""
    best, best_ms = k, interp(curve, k)
    for size in sorted(int(x) for x in curve):
        if size > k and interp(curve, size) < best_ms:
            best, best_ms = size, interp(curve, size)
    return best


def padding(curve: dict | None, limit: int | None = None) -> tuple:
    """A model's padding table (`GPT2.padding`): entry k - 1 is `pad_size(curve, k)`, for k up to
    `limit` (default: the largest measured size; past it, nothing is padded); () without a curve."""
    if not curve:
        return ()
    return _pad_table(tuple(sorted((int(k), float(v)) for k, v in curve.items())), limit)


@functools.lru_cache(maxsize=8)
def _pad_table(curve_items: tuple, limit: int | None) -> tuple:  # computed once per curve, not per call
    curve = dict(curve_items)
    return tuple(pad_size(curve, k) for k in range(1, (limit or max(curve)) + 1))


def pads(curves: dict) -> dict:
    """The padding tables of measured cost curves, from each model's warm curve."""
    return {"target_pad": padding(curves["target"]["warm"]),
            "draft_pad": padding(curves["draft"]["warm"]) if "draft" in curves else ()}


def loop_scale(passes, curves: dict) -> dict:
    """{k: in-loop ms / curve ms} at each size k of the curve, from target passes of timed decoding
    runs [(state, k, ms)]: the median ratio over the passes nearest to k (sizes with at least three),
    interpolated between and held flat beyond. The curve times pass after pass; in the loop, Python
    work between passes idles the BLAS threads, and a VM's speed drifts: this measures what that adds."""
    sizes = sorted(int(k) for k in curves["warm"])
    ratios = {k: [] for k in sizes}
    for state, k, ms in passes:
        nearest = min(sizes, key=lambda size: (abs(size - k), size))
        ratios[nearest].append(ms / interp(curves.get(state) or curves["warm"], k))
    seen = [(k, float(np.median(r))) for k, r in ratios.items() if len(r) >= 3]
    if not seen:
        return {k: 1.0 for k in sizes}
    return {k: float(np.interp(k, [x for x, _ in seen], [r for _, r in seen])) for k in sizes}


def scaled(curve: dict, scale: dict) -> dict:
    """A cost curve with each size's cost multiplied by its `loop_scale`."""
    return {k: v * scale.get(int(k), 1.0) for k, v in curve.items()}


def pass_ms(curves: dict, model: str, state: str, k: int, pad=()) -> float:
    """One pass of `model` over k tokens, padded, "cold" or "warm" (a curve without the state: warm)."""
    return interp(curves[model].get(state) or curves[model]["warm"], padded(pad, int(k)))


def forward_ms(record: dict, curves: dict, target_pad=(), draft_pad=()) -> float:
    """The forward passes of a count record (`acceptance.counts`) at the curve's costs, padded."""
    return sum(n * pass_ms(curves, model, state, k, pad)
               for model, pad in (("target", target_pad), ("draft", draft_pad))
               for state, blocks in record[model].items() for k, n in blocks.items())


def work(record: dict) -> list:
    """The counts OVERHEADS multiply: steps, steps that ran the draft (one cold draft pass each), the
    draft's rows processed into a distribution (stage 2's guessed rows are priced by the curve, but
    mostly never processed), n-gram queries."""
    return [record["steps"], sum(record["draft"].get("cold", {}).values()), record["draft_dists"],
            record["ngram_queries"]]


def record_ms(record: dict, curves: dict, overheads: dict, target_pad=(), draft_pad=()) -> float:
    """Predicted milliseconds for all the work of a count record."""
    return forward_ms(record, curves, target_pad, draft_pad) + sum(
        overheads.get(name, 0.0) * n for name, n in zip(OVERHEADS, work(record)))


def fit_overheads(steps, curves: dict, query_ms: float, draft_pad=()) -> dict:
    """The overheads (ms) from timed decoding steps [(draft blocks, draft distributions, n-gram
    queries, ms outside the target's pass)]: that time beyond the draft's passes at the curve's costs
    and the queries at `query_ms`, per step, per step that ran the draft and per distribution
    (least squares, each >= 0). Fitted step by step, not on whole runs, whose steps and draft passes
    rise together and cannot be told apart."""
    features, y = [], []
    for blocks, dists, queries, ms in steps:
        draft = sum(pass_ms(curves, "draft", "cold" if i == 0 else "warm", k, draft_pad) for i, k in enumerate(blocks))
        features.append([1.0, float(bool(blocks)), float(dists)])
        y.append(ms - draft - query_ms * queries)
    features, y = np.array(features), np.array(y)
    free = [j for j in range(3) if features[:, j].any()]
    while True:  # a coefficient that comes out negative is fixed at 0 and the rest refitted
        x = np.zeros(3)
        if free:
            x[free] = np.linalg.lstsq(features[:, free], y, rcond=None)[0]
        if (x >= 0).all():
            break
        free = [j for j in free if x[j] > 0]
    return {"step": float(x[0]), "draft_step": float(x[1]), "draft_dist": float(x[2]), "ngram_query": float(query_ms)}
