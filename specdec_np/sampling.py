"""Sampling: logits -> the processed next-token distribution, and the one source of randomness.

Draft and target go through the same `process`, so the speculative rules compare like with like: verification is
lossless with respect to the *processed* target distribution, and every q the rules divide by must be exactly the
processed distribution a draft token was drawn from. All randomness goes through `Rand.coin` and `Rand.draw`: the
exact enumerator (`proofs/exact.py`) replaces `Rand` with a stand-in that explores every branch. The functions here
run on every step and trust their settings (`checks.check_settings` refuses bad ones once).
"""

from __future__ import annotations

import numpy as np

from .fastpath import kth_largest, softmax_


def top_ids(probs, k: int):  # [V] -> [min(k, V)]
    """Ids of the k most probable tokens, most probable first, ties to the lower id: an O(V) selection, a small sort."""
    V = probs.size
    if k == 1:  # a chain's step: argmax already breaks ties to the lower id
        return np.array([np.argmax(probs)])
    if k < V:
        kth = kth_largest(probs, k)
        ids = np.flatnonzero(probs >= kth)  # ascending ids, every tie at kth included
    else:
        ids = np.arange(V)
    return ids[np.argsort(-probs[ids], kind="stable")][:k]


def keep_top_p(probs, top_p: float):  # [..., V] -> [..., V]
    """Nucleus: keep the smallest set of most probable tokens (ties by id) whose mass reaches top_p; renormalise."""
    if top_p >= 1.0:
        return probs
    V = probs.shape[-1]
    kept = np.zeros(probs.shape, dtype=np.float64)
    for row, out in zip(probs.reshape(-1, V), kept.reshape(-1, V)):
        k = 64
        while True:  # sort only the top k, widened if their mass falls short: the same sums as a full sort
            ids = top_ids(row, k)
            cum = np.cumsum(row[ids])  # [k]
            if cum[-1] >= top_p or k >= V:
                break
            k *= 8
        # In the nucleus iff the tokens before it have not reached top_p (never empty: the first has 0).
        ids = ids[np.concatenate([[0.0], cum[:-1]]) < top_p]
        out[ids] = row[ids]
    return kept / kept.sum(axis=-1, keepdims=True)


def tempered_softmax_(z, temperature: float):  # [..., k] -> [..., k], in place
    """softmax(z / T) in float64 of logits z shifted to a maximum of 0 (which 1/T keeps at 0, so softmax_'s own shift
    changes nothing). A tiny temperature (down to the subnormal 5e-324) sends every logit below the maximum to -inf,
    whose exp is 0: the exact limit, greedy over the maxima."""
    if temperature != 1:
        with np.errstate(over="ignore"):
            z /= temperature
    return softmax_(z)


def process(logits, temperature=1.0, top_k=None, top_p=None, whose="the"):  # [..., V] -> [..., V] float64
    """The processed next-token distribution of a row [V] or a batch [n, V] (settings trusted): temperature, top-k,
    top-p, renormalised; in float64 so that draft and target compare exactly (near-ties flip in float32). `whose`
    names the model in the error on logits that give no distribution ("the target's")."""
    logits = np.asarray(logits)
    if not np.issubdtype(logits.dtype, np.floating):
        logits = logits.astype(np.float64)
    if logits.ndim not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"logits must be [V] or [n, V] with V >= 1, got shape {logits.shape}")
    row_max = logits.max(axis=-1, keepdims=True)  # NaN if a row has a NaN, +inf if +inf, -inf if all -inf
    if not np.isfinite(row_max).all():
        raise ValueError(f"{whose} logits contain NaN or +inf, or a row is all -inf (no token possible)")
    if temperature == 0:  # greedy: a one-hot distribution on the argmax (ties to the lowest id)
        out = np.zeros(logits.shape, dtype=np.float64)
        np.put_along_axis(out, logits.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return out
    V = logits.shape[-1]
    if top_k is not None and top_k < V:
        # Top-k of the logits is top-k of the probabilities (exp and 1/T are monotone): only the k kept logits are
        # exponentiated, the rest are zeros.
        z = np.zeros(logits.shape, dtype=np.float64)  # [..., V]
        for row, m, out in zip(logits.reshape(-1, V), row_max.reshape(-1), z.reshape(-1, V)):
            ids = np.sort(top_ids(row, top_k))  # [k] ascending
            out[ids] = tempered_softmax_(row[ids].astype(np.float64) - m, temperature)
    else:
        z = logits.astype(np.float64)  # [..., V], in place from here
        z -= row_max
        tempered_softmax_(z, temperature)
    if top_p is not None:
        z = keep_top_p(z, top_p)
    return z


# A coin's probability within this of 1 (of 0) counts as 1 (as 0) and draws no uniform number: such a value is 1 or 0
# in exact arithmetic, and rounding (the BLAS, a sum's order) puts it on either side; had it decided whether a number
# is drawn, a seed's later draws would differ from one machine to another. The distribution moves by at most this
# much per coin (docs/performance.md).
SURE = 1e-12


def certain(p: float) -> bool | None:
    """A coin's outcome where it is certain, and so draws no uniform number: True for p within SURE of 1 (or above),
    False within SURE of 0 (or below); None where the coin must be tossed. NaN is an error."""
    if p != p:
        raise ValueError("coin: probability is NaN")
    return True if p >= 1.0 - SURE else False if p <= SURE else None


class Rand:
    """The engine's only source of randomness: a coin and a categorical draw over an explicit Generator."""

    def __init__(self, seed_or_generator=None):
        self.rng = np.random.default_rng(seed_or_generator)  # a Generator is used as it is

    def coin(self, p: float) -> bool:
        """True with probability p; a `certain` coin consumes no random number."""
        sure = certain(p)
        return self.rng.random() < p if sure is None else sure

    def draw(self, probs) -> int:
        """A token id drawn with probability probs[i] / sum(probs) (zero-probability ids never come out)."""
        ids, cum = support(probs)
        u = self.rng.random() * cum[-1]  # in [0, total)
        # The first id whose cumulative mass exceeds u; if u rounded up to total, the last one.
        return int(ids[min(int(np.searchsorted(cum, u, side="right")), ids.size - 1)])


def support(probs):  # [V] -> ([n], [n])
    """The ids a draw from `probs` can give (few after top-k) and the running sums of their probabilities, the last
    the total; a ValueError unless probs >= 0 with a positive sum."""
    probs = np.asarray(probs, dtype=np.float64)  # [V]
    ids = np.flatnonzero(probs > 0)  # [n]
    cum = np.cumsum(probs[ids])  # [n]: zeros add nothing
    total = cum[-1] if cum.size else 0.0
    if not total > 0 or not (probs >= 0).all():  # a negative or NaN entry
        raise ValueError(f"draw: probabilities must be >= 0 with a positive sum (sum={total})")
    return ids, cum
