"""Sampling: logits -> the processed next-token distribution, and the one source of randomness.

Draft and target go through the same `process`, so the speculative rules compare like with like:
verification is lossless with respect to the *processed* target distribution, and every q the
rules divide by must be exactly the processed distribution a draft token was drawn from.

All randomness of the engine goes through `Rand.coin` and `Rand.draw`. The exact enumerator
(`proofs/exact.py`) replaces `Rand` with a scripted stand-in that explores every branch, which is how the
tests prove the verification rules lossless instead of sampling them.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .fastpath import kth_largest, softmax_


def check_settings(temperature=1.0, top_k=None, top_p=None) -> None:
    """Raise ValueError naming the bad argument: temperature >= 0 finite, top_k >= 1, 0 < top_p <= 1."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise ValueError(f"top_k must be an integer >= 1 (or None = off), got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (None or 1.0 = off), got {top_p!r}")


def top_ids(probs, k: int):  # [V] -> [min(k, V)]
    """Ids of the k most probable tokens, most probable first, ties to the lower id.

    O(V) with a partition (the full vocabulary can be 50257 wide), then a small stable sort.
    """
    V = probs.size
    if k == 1:  # a chain's step: argmax already breaks ties to the lower id
        return np.array([np.argmax(probs)])
    if k < V:
        kth = kth_largest(probs, k)[0]
        ids = np.flatnonzero(probs >= kth)  # ascending ids, every tie at kth included
    else:
        ids = np.arange(V)
    return ids[np.argsort(-probs[ids], kind="stable")][:k]


def top_k_ids(values, k: int):  # [V] -> [k]
    """Ids of the k largest values, ascending (exactly k: ties at the k-th largest to the lower ids)."""
    kth = kth_largest(values, k)[0]
    ids = np.flatnonzero(values >= kth)  # [>= k]
    if ids.size > k:  # ties at the k-th largest: all above it, then the lowest tied ids
        above = ids[values[ids] > kth]
        ids = np.sort(np.concatenate([above, ids[values[ids] == kth][:k - above.size]]))
    return ids


def nucleus(row, top_p: float):  # [V] -> [n_kept]
    """Ids of the nucleus of one distribution: most probable first (ties by id) until the mass reaches top_p."""
    k = 64
    while True:
        # Only the nucleus needs sorting: try the top k (an O(V) partition) and widen if their
        # mass falls short. The same tokens are summed in the same order as in a full sort.
        ids = top_ids(row, k)
        cum = np.cumsum(row[ids])  # [k]
        if cum[-1] >= top_p or k >= row.size:
            break
        k *= 8
    mass_before = np.concatenate([[0.0], cum[:-1]])
    # In the nucleus iff the more probable tokens before it have not reached top_p yet; the first
    # token has mass_before 0 < top_p, so the nucleus is never empty.
    ids = ids[mass_before < top_p]
    return ids[row[ids] > 0]


def keep_top_p(probs, top_p: float):  # [..., V] -> [..., V]
    """Nucleus: keep the smallest set of most probable tokens whose mass reaches top_p; renormalise."""
    if top_p >= 1.0:
        return probs
    V = probs.shape[-1]
    kept = np.zeros(probs.shape, dtype=np.float64)
    for row, out in zip(probs.reshape(-1, V), kept.reshape(-1, V)):
        ids = nucleus(row, top_p)
        out[ids] = row[ids]
    return kept / kept.sum(axis=-1, keepdims=True)


def greedy(logits):  # [..., V] -> [..., V]
    """Temperature 0: a one-hot distribution on the argmax (ties -> lowest id, as np.argmax)."""
    out = np.zeros(logits.shape, dtype=np.float64)
    np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
    return out


def process(logits, temperature=1.0, top_k=None, top_p=None):  # [..., V] -> [..., V] float64
    """The processed next-token distribution: temperature, then top-k, then top-p, renormalised.

    Works on a single row [V] or a batch [n, V]; computed in float64 so that draft and target
    probabilities compare exactly (near-ties flip in float32).
    """
    check_settings(temperature, top_k, top_p)
    logits = np.asarray(logits)
    if not np.issubdtype(logits.dtype, np.floating):
        logits = logits.astype(np.float64)
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [V] or [n, V] with V >= 1, got shape {logits.shape}")
    row_max = logits.max(axis=-1, keepdims=True)  # NaN if a row has a NaN, +inf if +inf, -inf if all -inf
    if not np.isfinite(row_max).all():
        raise ValueError("logits contain NaN or +inf, or a row is all -inf (no token possible)")
    if temperature == 0:
        return greedy(logits)
    # softmax((logits - max) / T) in float64 (this runs per tree node); the shifted maximum is 0,
    # so softmax_'s own shift changes nothing.
    V = logits.shape[-1]
    if top_k is not None and top_k < V:
        # Top-k of the logits is top-k of the probabilities (exp and 1/T are monotone): only the k
        # kept logits are converted and exponentiated (cheaper than masking all V), the rest are zeros.
        z = np.zeros(logits.shape, dtype=np.float64)  # [..., V]
        for row, m, out in zip(logits.reshape(-1, V), row_max.reshape(-1), z.reshape(-1, V)):
            ids = top_k_ids(row, top_k)  # [k]
            kept = row[ids].astype(np.float64) - m  # [k]
            if temperature != 1:
                with np.errstate(over="ignore"):  # see below: a tiny temperature
                    kept /= temperature
            out[ids] = softmax_(kept)
    else:
        z = logits.astype(np.float64)  # [..., V], in place from here
        z -= row_max
        if temperature != 1:
            # A tiny temperature (down to the subnormal 5e-324) sends every logit below the maximum to
            # -inf, whose exp is 0: the exact limit, greedy over the maxima. The maximum stays 0.
            with np.errstate(over="ignore"):
                z /= temperature
        softmax_(z)
    if top_p is not None:
        z = keep_top_p(z, top_p)
    return z


# A coin's probability within this of 1 (of 0) counts as 1 (as 0), and draws no uniform number.
# Such a value is 1 or 0 in exact arithmetic (a rule's test of a path that must be kept), and
# rounding (the BLAS, the order of a sum) puts it on either side: had it decided whether a number
# is drawn, a seed's every later draw would shift from one machine to another. The distribution
# moves by at most this much per coin (how often it matters: docs/performance.md).
SURE = 1e-12


class Rand:
    """The engine's only source of randomness: a coin and a categorical draw over an explicit Generator."""

    def __init__(self, seed_or_generator=None):
        if isinstance(seed_or_generator, np.random.Generator):
            self.rng = seed_or_generator
        else:
            self.rng = np.random.default_rng(seed_or_generator)

    def coin(self, p: float) -> bool:
        """True with probability p (p <= 0: never, p >= 1: always, no random number consumed; within
        SURE of 0 or 1 counts as 0 or 1)."""
        if p != p:
            raise ValueError("coin: probability is NaN")
        if p >= 1.0 - SURE:
            return True
        if p <= SURE:
            return False
        return self.rng.random() < p

    def draw(self, probs) -> int:
        """A token id drawn with probability probs[i] / sum(probs) (zero-probability ids never come out)."""
        probs = np.asarray(probs, dtype=np.float64)  # [V]
        # Only positive entries can come out, and after top-k they are few: sum only those.
        ids = np.flatnonzero(probs > 0)  # [n]
        cum = np.cumsum(probs[ids])  # [n]: the partial sums over all of probs at these ids (zeros add nothing)
        total = cum[-1] if cum.size else 0.0
        if not total > 0 or not (probs >= 0).all():  # a negative or NaN entry
            raise ValueError(f"draw: probabilities must be >= 0 with a positive sum (sum={total})")
        u = self.rng.random() * total  # in [0, total)
        # The first id whose cumulative mass exceeds u; if u rounded up to total, the last one.
        return int(ids[min(int(np.searchsorted(cum, u, side="right")), ids.size - 1)])
