"""The cost model: what a decoding plan costs on this machine, from counted work and measured costs.

A plan's ms per token = (its forward passes, each at this machine's cost for its padded block size, "cold" after the
other model's pass, else "warm" (`step_passes`), plus OVERHEADS per step, per step that drafts, per draft
distribution and per n-gram query) / the tokens it emits; the counts from an acceptance profile or a run's statistics.
"""

from __future__ import annotations

import numpy as np

from ..fastpath import Layout
from ..methods import METHODS

OVERHEADS = ("step", "draft_step", "draft_dist", "ngram_query")


def interp(curve: dict, k: int) -> float:
    """Cost of a k-token pass: linear between measured sizes and past the last two (a prefill outgrows trees)."""
    ks = sorted(int(x) for x in curve)
    ms = [curve[x] if x in curve else curve[str(x)] for x in ks]
    if k > ks[-1] and len(ks) > 1:
        return ms[-1] + (k - ks[-1]) * (ms[-1] - ms[-2]) / (ks[-1] - ks[-2])
    return float(np.interp(k, ks, ms))


PAD_SLACK = 0.03  # neighbouring sizes of one measured curve differ by about this much from noise alone


def pad_size(curve: dict, k: int, slack: float = PAD_SLACK) -> int:
    """The block size to compute k tokens as: the smallest of k and the larger measured sizes whose cost is within
    `slack` of the cheapest of them. OpenBLAS works in panels of 4 and 8 columns: where 5-7 tokens cost more than 8,
    dummy rows are free speed; but a larger size measured a noise's worth cheaper is no saving, and padding to it
    costs its rows wherever the noise, not the kernel, made it cheaper (docs/performance.md). One token is never
    padded: how its row is multiplied is raced on its own (`Layout.one_row`; "pair" reads it as two rows without a
    second row's layer norms and attention), and a curve whose larger block beat it was bent by noise."""
    if k == 1:
        return 1
    ms = {size: interp(curve, size) for size in [k] + [size for size in sorted(int(x) for x in curve) if size > k]}
    cheapest = min(ms.values())
    return next(size for size, cost in ms.items() if cost <= cheapest * (1 + slack))


def padding(curve: dict | None) -> tuple:
    """A model's padding table (`Layout.padding`): `pad_size(curve, k)` for k up to the largest measured size."""
    return tuple(pad_size(curve, k) for k in range(1, max(int(x) for x in curve) + 1)) if curve else ()


def pads(curves: dict) -> dict:
    """The padding tables of measured cost curves, from each model's warm curve (computed anew on each call)."""
    return {f"{m}_pad": padding(curves[m]["warm"]) if m in curves else () for m in ("target", "draft")}


def machine_layout(costs: dict) -> dict:
    """The layout the models run with on the machine `costs` measured (`costcurve.apply_layout`'s argument): its
    measured ways of multiplying and the padding tables of its curves."""
    return costs["layout"] | pads(costs["curves"])


def loop_scale(passes, curves: dict) -> dict:
    """{k: in-loop ms / curve ms} at each size k of the curve, from timed target passes [(state, k, ms)]: the median
    over those nearest to k (if three), interpolated between (Python work between passes idles the BLAS threads)."""
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


def step_passes(draft_blocks, target_block) -> list[tuple[str, str, int]]:
    """A step's passes, [(model, state, rows)]: "cold" right after the other model's (its weights out of cache)."""
    return [("draft", "warm" if i else "cold", k) for i, k in enumerate(draft_blocks)] + [
        ("target", "cold" if draft_blocks else "warm", target_block)]


def pass_ms(curves: dict, model: str, state: str, k: int, pad=()) -> float:
    """One pass of `model` over k tokens, padded, "cold" or "warm" (a curve without the state: warm). Past the
    curve's sizes (a prompt's prefill) a cold pass is the warm one plus the gap at the largest size: a block that
    large reads each weight once either way, the rest is arithmetic, which the slope between two noisy cold sizes
    does not measure (docs/performance.md, "Prefills")."""
    warm = curves[model]["warm"]
    curve, rows = curves[model].get(state) or warm, Layout(padding=pad).rows(int(k))
    last = max(int(size) for size in curve)
    if rows <= last or curve is warm:
        return interp(curve, rows)
    return interp(warm, rows) + interp(curve, last) - interp(warm, last)


def record_ms(record: dict, curves: dict, overheads: dict, target_pad=(), draft_pad=(), method=None) -> float:
    """Predicted ms of a count record (`acceptance.counts`) of `method`: its passes, padded (an EAGLE head's on
    curves["head"], unpadded), and OVERHEADS times its steps, steps that ran the draft, rows the draft processed into
    distributions (not stage 2's guesses) and queries."""
    if method is not None and METHODS[method].drafts_with == "head":
        curves, draft_pad = curves | {"draft": curves["head"]}, ()
    passes = sum(n * pass_ms(curves, model, state, k, pad)
                 for model, pad in (("target", target_pad), ("draft", draft_pad))
                 for state, blocks in record[model].items() for k, n in blocks.items())
    counts = [record["steps"], sum(record["draft"].get("cold", {}).values()), record["draft_dists"],
              record["ngram_queries"]]
    return passes + sum(overheads.get(name, 0.0) * n for name, n in zip(OVERHEADS, counts))


def fit_overheads(steps, curves: dict, query_ms: float, draft_pad=()) -> dict:
    """The overheads (ms) per step, drafting step and distribution: least squares (each >= 0) on timed steps' time
    beyond their draft passes and queries, step by step (in whole runs steps and draft passes rise together), fitted
    again without the steps far slower than the fit (`slow`): a step the host stopped is not what a step costs."""
    features, y = step_terms(steps, curves, query_ms, draft_pad)
    kept = np.ones(len(y), dtype=bool)
    for _ in range(5):  # until the steps left out are those the fit on the rest leaves out
        x = nonnegative_fit(features[kept], y[kept])
        fits = ~slow(y - features @ x)
        if (fits == kept).all():
            break
        kept = fits
    return {"step": float(x[0]), "draft_step": float(x[1]), "draft_dist": float(x[2]), "ngram_query": float(query_ms)}


def step_terms(steps, curves: dict, query_ms: float, draft_pad=()):  # -> [n, 3], [n]
    """What the overheads are fitted on: each timed step's (1, whether it drafted, distributions) and its ms beyond its
    draft passes (priced on the curves, padded) and n-gram queries."""
    def draft_ms(blocks):  # a step's draft passes
        return sum(pass_ms(curves, m, state, k, draft_pad) for m, state, k in step_passes(blocks, 0) if m == "draft")
    features = np.array([[1.0, float(bool(blocks)), float(dists)] for blocks, dists, _, _ in steps])
    return features, np.array([ms - draft_ms(blocks) - query_ms * queries for blocks, _, queries, ms in steps])


def nonnegative_fit(features, y):  # [n, terms], [n] -> [terms], each >= 0
    free = [j for j in range(features.shape[1]) if features[:, j].any()]
    while True:  # a coefficient that comes out negative is fixed at 0 and the rest refitted
        x = np.zeros(features.shape[1])
        x[free] = np.linalg.lstsq(features[:, free], y, rcond=None)[0]  # none free: all fixed at 0
        if (x >= 0).all():
            return x
        free = [j for j in free if x[j] > 0]


def slow(residuals, spread: float = 5.0, floor_ms: float = 1.0):  # [n] -> [n] bool
    """The steps slower than the fit by more than `spread` robust standard deviations (1.4826 x the median absolute
    deviation) and `floor_ms`: on a shared host a few steps wait 2-100 ms for the CPU (a scheduler's time slice and
    more), and least squares would spread their wait over every step's price."""
    mid = np.median(residuals)
    return residuals > mid + max(spread * 1.4826 * np.median(np.abs(residuals - mid)), floor_ms)
