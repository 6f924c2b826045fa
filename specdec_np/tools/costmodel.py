"""The cost model: what a decoding plan costs on this machine, from counted work and measured costs.

A plan's milliseconds per token = (every forward pass it makes, at this machine's cost curve for
its block size, padded as the model's table says, "cold" when the other model ran just before it and "warm"
otherwise (`costcurve.loop_curves`), plus the Python and NumPy work around the passes: a fixed
overhead per step, per step that drafts, per distribution the draft processes and per n-gram query)
/ the tokens it emits. The counts come from the pair's acceptance profile (`acceptance.py`) or from a
run's own statistics; the curve and the overheads from this machine (`calibration.py`, about ten
seconds).
"""

from __future__ import annotations

import functools

import numpy as np


def padded(table, n: int) -> int:
    """The block size a padding table computes n rows as: table[n - 1] when it covers n, else n
    (as `GPT2.padded` does with the model's own table)."""
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
    smaller), or k itself. OpenBLAS works in panels of 4 and 8 columns, so on this machine 5-7
    tokens cost more than 8 and 13-15 more than 16: padding with dummy rows is free speed."""
    best, best_ms = k, interp(curve, k)
    for size in sorted(int(x) for x in curve):
        if size > k and interp(curve, size) < best_ms:
            best, best_ms = size, interp(curve, size)
    return best


def padding(curve: dict | None, limit: int = 64) -> tuple:
    """The padding table a model takes (`GPT2.padding`, set by `costcurve.apply_layout`): entry k - 1 is
    the block size to compute k tokens as, for k = 1..limit; () without a curve (no padding)."""
    if not curve:
        return ()
    return _pad_table(tuple(sorted((int(k), float(v)) for k, v in curve.items())), limit)


def pads(curves: dict) -> dict:
    """The padding tables of measured cost curves ({"target_pad": ..., "draft_pad": ...}): the block
    size each model computes passes of 1, 2, ... rows as (`padding` of its warm curve)."""
    return {"target_pad": padding(curves["target"]["warm"]),
            "draft_pad": padding(curves["draft"]["warm"]) if "draft" in curves else ()}


@functools.lru_cache(maxsize=8)
def _pad_table(curve_items: tuple, limit: int) -> tuple:  # computed once per curve, not per call
    curve = dict(curve_items)
    return tuple(pad_size(curve, k) for k in range(1, limit + 1))


# ----------------------------------------------------------------------------- the cost model


def loop_scale(passes, curves: dict) -> dict:
    """{k: in-loop ms / curve ms} at each size k of the curve, from the target passes of timed
    decoding runs [(state, k, ms)]: the median ratio over the passes nearest to k, interpolated
    between sizes that had passes and held flat beyond them. The curve times pass after pass; in the
    loop Python work comes between passes (BLAS threads go idle), the pass builds its mask and
    processes its rows, and a VM's speed drifts between measurements: this measures what that adds."""
    sizes = sorted(int(k) for k in curves["warm"])
    ratios = {k: [] for k in sizes}
    for state, k, ms in passes:
        curve = curves.get(state) or curves["warm"]
        nearest = min(sizes, key=lambda size: (abs(size - k), size))
        ratios[nearest].append(ms / interp(curve, k))
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


OVERHEADS = ("step", "draft_step", "draft_dist", "ngram_query")


def work(record: dict) -> list:
    """The counts the overheads multiply: steps, steps that ran the draft (a step's first draft
    pass is its cold one), the draft's rows processed into a distribution (drawn from or ranked;
    stage 2's guessed rows are computed, priced by the curve, but mostly never processed),
    n-gram queries."""
    return [record["steps"], sum(record["draft"].get("cold", {}).values()), record["draft_dists"],
            record["ngram_queries"]]


def record_ms(record: dict, curves: dict, overheads: dict, target_pad=(), draft_pad=()) -> float:
    """Predicted milliseconds for all the work of a count record."""
    return forward_ms(record, curves, target_pad, draft_pad) + sum(
        overheads.get(name, 0.0) * n for name, n in zip(OVERHEADS, work(record)))


def nonnegative_lstsq(features, y):  # [n, k], [n] -> [k]
    """Least squares with every coefficient >= 0: one that comes out negative is fixed at 0 and
    the rest refitted."""
    free = [j for j in range(features.shape[1]) if features[:, j].any()]
    while True:
        x = np.zeros(features.shape[1])
        if free:
            x[free] = np.linalg.lstsq(features[:, free], y, rcond=None)[0]
        if (x >= 0).all():
            return x
        free = [j for j in free if x[j] > 0]


def fit_overheads(steps, curves: dict, query_ms: float, draft_pad=()) -> dict:
    """The fixed overheads (ms) from timed decoding steps [(draft blocks, draft distributions, n-gram
    queries, ms spent outside the target's pass)]: what that time holds beyond the draft's passes at
    the curve's costs and the queries at `query_ms`, as a cost per step, per step that ran the draft
    and per distribution the draft processed (least squares over the steps, each >= 0).

    Fitted step by step on the time outside the target's pass, not run by run on wall time: within
    a run, steps and draft passes rise together, so a fit on whole runs cannot tell them apart."""
    features, y = [], []
    for blocks, dists, queries, ms in steps:
        draft = sum(pass_ms(curves, "draft", "cold" if i == 0 else "warm", k, draft_pad) for i, k in enumerate(blocks))
        features.append([1.0, float(bool(blocks)), float(dists)])
        y.append(ms - draft - query_ms * queries)
    x = nonnegative_lstsq(np.array(features), np.array(y))
    return {"step": float(x[0]), "draft_step": float(x[1]), "draft_dist": float(x[2]), "ngram_query": float(query_ms)}
