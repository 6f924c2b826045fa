"""The cost model: what a decoding run costs on this machine, from its counted work and a cost curve.

A run costs the measured cost curve (`costcurve.py`) of every forward pass it made (padded as
`pad_size` says), scaled by how much slower passes run inside the decoding loop than alone, where
the other model has just pushed their weights out of the cache (the target's single tokens, blocks
of up to WIDE rows and wider blocks apart; the draft's single tokens and blocks apart), plus a fixed
overhead per draft pass, per n-gram query and per step that runs the draft (its first pass reads
the draft's weights back from memory). The target's own fixed work per pass (masks, logits,
verifying, moving the cache) is in its scales: a per-pass term beside them is not identifiable,
since each size class costs about the same per pass.

`fit_overheads` fits those eight parameters on timed decoding runs; `predicted_ms` applies them.
"""

from __future__ import annotations

import functools

import numpy as np

from ..drafting import padded

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
    """What a pass of k tokens costs when padded as `pad_size` says (the `padding` table)."""
    return interp(curve, padded(padding(curve), k))


def padding(curve: dict | None, limit: int = 64) -> tuple:
    """The padding table a Plan takes (`target_pad`, `draft_pad`): entry k - 1 is the block size
    to compute k tokens as, for k = 1..limit; () without a curve (no padding)."""
    if not curve:
        return ()
    return _pad_table(tuple(sorted((int(k), float(v)) for k, v in curve.items())), limit)


@functools.lru_cache(maxsize=8)
def _pad_table(curve_items: tuple, limit: int) -> tuple:  # computed once per curve, not per call
    curve = dict(curve_items)
    return tuple(pad_size(curve, k) for k in range(1, limit + 1))


# ----------------------------------------------------------------------------- the cost model

# Target blocks padded to more than this many rows are scaled apart from smaller ones: in the
# decoding loop at top-k an 8-row block ran 12% slower than a 4-row one, against 4-6% on the
# curve (wider attention over contexts longer than the curve's 200-token prefix, and in-loop
# effects). With one scale for all blocks the model ranked wide sampled trees first; they ran last.
WIDE = 4
SIZES = ("step", "block", "wide")  # one token; 2..WIDE rows; more (after padding)


def size_class(curve: dict, k: int) -> str:
    return "step" if k == 1 else "block" if padded(padding(curve), k) <= WIDE else "wide"


def target_ms(stats, curves, size: str | None = None) -> float:
    """The target's passes at their curve cost: all, or those of one size class (SIZES)."""
    return sum(block_ms(curves["target"], k) for k in stats.target_blocks
               if size is None or size_class(curves["target"], k) == size)


def draft_ms(stats, curves, size: str | None = None) -> float:
    """The draft's passes at their curve cost: all, or those of one size ("step": one token,
    "block": more)."""
    return sum(block_ms(curves["draft"], k) for k in stats.draft_blocks
               if size is None or (k == 1) == (size == "step"))


# The draft's passes of one token and of several are scaled apart: in the decoding loop at top-k
# a 2-row draft pass (a node and stage 2's guess below it) took 1.7x a 1-row one, against 1.07x on
# the curve. With one scale for both the model valued stage 2's guesses at T=1 (a guess is right
# only as often as the draft samples it) above the chain, which ran faster.
DRAFT_SIZES = ("step", "block")


def predicted_ms(stats, curves, overheads=None) -> float:
    """Cost model: every pass at its (padded) measured cost, scaled by how much slower it runs
    inside the decoding loop than alone (the target's `step_scale` for one token, which the
    baseline runs back to back, `block_scale` for blocks of up to WIDE rows and `wide_scale` for
    wider ones, which follow a drafting gap: they suffer differently; the draft's
    `draft_step_scale` and `draft_block_scale`), plus fixed overheads per draft pass, n-gram query
    and step that runs the draft (none of these when not measured)."""
    o = overheads or {}
    return (sum(o.get(size + "_scale", 1.0) * target_ms(stats, curves, size) for size in SIZES)
            + sum(o.get(f"draft_{size}_scale", 1.0) * draft_ms(stats, curves, size) for size in DRAFT_SIZES)
            + o.get("draft_pass", 0.0) * stats.draft_passes
            + o.get("ngram_query", 0.0) * stats.ngram_queries + o.get("draft_cold", 0.0) * stats.draft_steps)


OVERHEADS = ("step_scale", "block_scale", "wide_scale", "draft_step_scale", "draft_block_scale", "draft_pass",
             "ngram_query", "draft_cold")


def nonnegative_lstsq(features, y):  # [runs, k], [runs] -> [k]
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


def fit_overheads(runs, curves) -> dict:
    """The cost model's eight parameters from timed runs [(method, stats, wall seconds)].

    Each side is fitted on its own clock (`Stats.time_draft` times the drafting), so that the
    target's and the draft's costs are not traded against each other: the wall time outside
    drafting against the target's curve time (per size class), and the drafting time against the
    draft's curve time (per size class) and the counts of draft passes, n-gram queries and steps
    that ran the draft (cold first passes).
    """
    target = nonnegative_lstsq(np.array([[target_ms(s, curves, size) for size in SIZES] for _, s, _ in runs], dtype=float),
                               np.array([1000 * (sec - s.time_draft) for _, s, sec in runs]))
    draft = nonnegative_lstsq(np.array([[*(draft_ms(s, curves, size) for size in DRAFT_SIZES), s.draft_passes,
                                         s.ngram_queries, s.draft_steps] for _, s, _ in runs], dtype=float),
                              np.array([1000 * s.time_draft for _, s, _ in runs]))
    return dict(zip(OVERHEADS, map(float, [*target, *draft])))


