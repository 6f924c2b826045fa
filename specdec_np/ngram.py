"""The Katz backoff trigram: the cheapest drafter, stage 2 of staged speculative decoding (`staged.py`).

Katz backoff trigram (Katz 1987), fitted from one token stream of ids 0..V-1:

    P1(w)     = (c(w) + 1) / (N + V)                               add-one unigram: every token > 0
    P2(w|v)   = d(c(v,w)) c(v,w) / c(v)          if c(v,w) > 0     discounted bigram
              = alpha(v) P1(w)                   otherwise         backoff
    P3(w|u,v) = d(c(u,v,w)) c(u,v,w) / c(u,v)    if c(u,v,w) > 0
              = alpha(u,v) P2(w|v)               otherwise

where c(h) is how often h occurred as a history (followed by a token), and the backoff weight hands the
mass taken by discounting to the unseen tokens in proportion to the lower order:

    beta(h)  = 1 - sum_{w seen after h} P*(w|h)                    leftover discounted mass
    alpha(h) = beta(h) / (1 - sum_{w seen after h} P_lower(w|h'))   so that sum_w P(w|h) = 1.

A history never seen backs off entirely: P3(.|u,v) = P2(.|v), P2(.|v) = P1.

Discounts (per order, from the count-of-counts n_r of that order's distinct n-grams, before pruning):
Katz's Good-Turing ratio for 1 <= r <= k (k = `katz_k`, 5 by default), counts above k are trusted (d = 1):

    r* = (r + 1) n_{r+1} / n_r,   A = (k + 1) n_{k+1} / n_1,   d_r = (r*/r - A) / (1 - A).

Fallbacks, where Katz + Good-Turing breaks down (all exercised in tests/core/test_ngram.py):
  1. Good-Turing undefined or out of range (n_1, n_r or n_{r+1} = 0, A >= 1, or d_r not in (0, 1)): that r
     uses absolute discounting, d_r = (r - D) / r, with Ney's D = n_1 / (n_1 + 2 n_2) in (0, 1) (0.5 when n_1
     or n_2 is 0), so 0 < d_r < 1.
  2. No mass left: a history whose continuations were all seen more than k times (none pruned) would keep
     beta(h) = 0; its counts are discounted absolutely instead, c - D, so beta(h) > 0.
  3. Nothing to back off to: a history that has seen every token (or whose seen tokens hold all the
     lower-order mass, up to 1e-12) has no unseen tokens to give beta(h) to, and alpha = beta / 0. It
     interpolates instead: P(w|h) = P*(w|h) + beta(h) P_lower(w|h'), which also sums to one.
With these every next-token distribution sums to one over the vocabulary and is positive everywhere.

`fit(..., min_count=m)` drops trigrams seen fewer than m times (default 1: keep all) to shrink the model;
their mass goes to the backoff (c(u,v) keeps counting them), as Katz's count cutoffs do.

Queries use the last two tokens of the context; `top_k` merges three short sorted lists (trigram-seen,
bigram-seen, unigram: `Trigram`) instead of sorting the full [V] distribution.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import numpy as np

from . import ngram_file

FULL_MASS_TOL = 1e-12  # lower-order mass of seen tokens this close to 1 counts as "all of it" (fallback 3)


@dataclass
class Trigram:
    """A fitted Katz trigram: its counts (what is saved) and the flat query arrays derived from them. Per
    order, history i owns entries ptr[i]:ptr[i+1] of tok/p, sorted by (p desc, tok asc), p the final
    P(tok|history); bow[i] is the factor applied to the lower order for every other token."""

    n_vocab: int
    katz_k: int
    min_count: int
    counts: dict            # the arrays saved (`ngram_file.SAVED`), all the rest derived from them
    p1: np.ndarray          # [V] unigram probabilities
    uni_order: np.ndarray   # [V] token ids by (p1 desc, id asc)
    uni_p: np.ndarray       # [V] p1[uni_order]
    bi_index: np.ndarray    # [V] history id of token v in the bigram arrays, -1 if v was never a history
    bi_ptr: np.ndarray      # [n_bi_ctx + 1]
    bi_tok: np.ndarray      # [n_bi]
    bi_p: np.ndarray        # [n_bi]
    bi_bow: np.ndarray      # [n_bi_ctx]
    tri_key: np.ndarray     # [n_tri_ctx] sorted history keys u * V + v
    tri_ptr: np.ndarray     # [n_tri_ctx + 1]
    tri_tok: np.ndarray     # [n_tri]
    tri_p: np.ndarray       # [n_tri]
    tri_bow: np.ndarray     # [n_tri_ctx]
    # top_k's answers by (bigram history, trigram history, k): a staged drafter asks the same ones again.
    memo: dict = field(default_factory=dict, repr=False, compare=False)


# ----------------------------------------------------------------------------- fitting
def katz_discounts(counts: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Discount ratios d[r] (r = 0..k+1, d[k+1] = 1 stands for every r > k) of one order, and Ney's D:
    Good-Turing as Katz corrected it where defined and inside (0, 1), else absolute discounting (fallback 1)."""
    n = np.bincount(np.minimum(counts, k + 2), minlength=k + 3).astype(np.float64)  # n[r] = #n-grams seen r times
    D = n[1] / (n[1] + 2 * n[2]) if n[1] > 0 and n[2] > 0 else 0.5
    A = (k + 1) * n[k + 1] / n[1] if n[1] > 0 else np.inf
    d = np.ones(k + 2)
    d[0] = 0.0
    for r in range(1, k + 1):
        dr = np.nan
        if n[r] > 0 and n[r + 1] > 0 and A < 1:
            r_star = (r + 1) * n[r + 1] / n[r]
            dr = (r_star / r - A) / (1 - A)
        d[r] = dr if 0 < dr < 1 else (r - D) / r   # nan fails the test too
    return d, float(D)


def _check_stream(tokens, n_vocab: int) -> np.ndarray:
    n_vocab = operator.index(n_vocab)
    if not 1 <= n_vocab <= 2**20:
        raise ValueError(f"n_vocab={n_vocab} must be in 1..{2**20}")
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0 or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"tokens must be a 1-D array of integer token ids, not an empty token stream "
                         f"(got shape {t.shape}, dtype {t.dtype})")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= n_vocab:
        bad = lo if lo < 0 else hi
        raise ValueError(f"tokens contains id {bad}, outside the vocabulary 0..{n_vocab - 1}")
    return t.astype(np.int64)


def _small_uint(a: np.ndarray) -> np.ndarray:
    """`a` (non-negative ints) in the smallest unsigned dtype that holds it, to keep files small."""
    return a.astype(np.min_scalar_type(int(a.max()) if a.size else 0))


def _count_level(keys: np.ndarray, V: int, min_count: int, k: int) -> dict:
    """Counts of one order from its n-gram keys (history * V + token): CSR by history, pruned to >= min_count."""
    key, count = np.unique(keys, return_counts=True)             # [E] sorted n-gram keys, their counts
    disc, D = katz_discounts(count, k)                           # from all n-grams, before pruning
    ctx, start = np.unique(key // V, return_index=True)          # [C] histories
    ctx_count = np.add.reduceat(count, start) if len(key) else count  # [C] c(h), pruned n-grams included
    keep = count >= min_count
    key, count = key[keep], count[keep]
    ctx_of = np.searchsorted(ctx, key // V)                      # [E'] history id of each kept n-gram
    lens = np.bincount(ctx_of, minlength=len(ctx))               # [C] kept continuations per history
    alive = lens > 0                                             # histories with nothing kept back off fully
    return {"ctx": _small_uint(ctx[alive]), "ctx_count": _small_uint(ctx_count[alive]),
            "len": _small_uint(lens[alive]), "tok": _small_uint(key % V), "count": _small_uint(count),
            "discount": disc, "abs_discount": np.float64(D)}


KATZ_K = 5  # Katz's k: counts above it are trusted


def max_katz_k(n_tokens: int) -> int:
    """The largest k `fit` takes for a stream of n_tokens (the default k always): no n-gram is seen more
    often than the stream is long, so a larger k discounts nothing more."""
    return max(n_tokens, KATZ_K)


def fit(tokens, n_vocab: int, *, katz_k: int = KATZ_K, min_count: int = 1) -> Trigram:
    """Katz backoff trigram of a token stream (1-D ints in 0..n_vocab-1); `min_count` prunes trigrams only."""
    t = _check_stream(tokens, n_vocab)                           # [N]
    if not 1 <= operator.index(katz_k) <= max_katz_k(len(t)):
        raise ValueError(f"katz_k={katz_k} must be in 1..{max_katz_k(len(t))} (no n-gram of a stream of {len(t)} "
                         "tokens is seen more often)")
    if operator.index(min_count) < 1:
        raise ValueError(f"min_count={min_count} must be >= 1")
    V = n_vocab
    levels = {"bi": _count_level(t[:-1] * V + t[1:], V, 1, katz_k),
              "tri": _count_level((t[:-2] * V + t[1:-1]) * V + t[2:], V, min_count, katz_k)}
    counts = {"uni_count": _small_uint(np.bincount(t, minlength=V))}
    counts |= {f"{order}_{name}": a for order, level in levels.items() for name, a in level.items()}
    return _build(counts, V, katz_k, min_count)


def _katz_level(ctx_count, lens, count, d, D, k, lower_p, denom, V):
    """Final P(w|h) of the seen entries and backoff weights of one order (fallbacks 2 and 3 applied), from
    lower_p [E], each entry's lower-order probability, and denom [C], the lower-order mass of each
    history's unseen tokens (1 - sum of lower_p over its entries)."""
    C = len(lens)
    start = np.cumsum(lens) - lens                               # [C] each history's first entry
    ctx_of = np.repeat(np.arange(C), lens)                       # [E]
    count = count.astype(np.int64)
    dc = d[np.minimum(count, k + 1)] * count                     # [E] discounted counts
    # Fallback 2: nothing discounted (all counts > k) and nothing pruned -> absolute discounting.
    stuck = (np.minimum.reduceat(count, start) > k) & (np.add.reduceat(count, start) == ctx_count)  # [C]
    dc = np.where(stuck[ctx_of], count - D, dc)
    h = ctx_count.astype(np.float64)                             # [C]
    p_star = dc / h[ctx_of]                                      # [E]
    beta = (h - np.add.reduceat(dc, start)) / h                  # [C] leftover mass
    # Fallback 3: no unseen tokens (or no lower-order mass on them) -> interpolate with the lower order.
    full = (lens == V) | (denom <= FULL_MASS_TOL)                # [C]
    bow = np.where(full, beta, beta / np.where(full, 1.0, denom))
    p = np.where(full[ctx_of], p_star + beta[ctx_of] * lower_p, p_star)
    return p, bow, ctx_of


def _by_p_then_token(of, p, tok):  # [E] history, probability, token -> [E] order
    """The order of entries by (history asc, p desc, token asc): `np.lexsort((tok, -p, of))`. When each history's
    tokens are already ascending (as counted), a stable argsort of the complex keys of - p*1j gives the same order
    (complex numbers sort by real part, then imaginary; stability keeps the tokens' order among equal p) in a
    third of the time: it matters for a bigram table of millions of entries, built at every load."""
    same = np.diff(of) == 0                                      # [E-1] neighbours in one history
    if np.all(np.diff(tok)[same] > 0):
        return np.argsort(of - 1j * p, kind="stable")
    return np.lexsort((tok, -p, of))


def _build(counts: dict, V: int, k: int, min_count: int) -> Trigram:
    """Derive the query arrays from the counts (fit and load share this, so a loaded model is identical)."""
    uni = counts["uni_count"].astype(np.int64)                   # [V]
    N = int(uni.sum())
    p1 = (uni + 1) / (N + V)                                     # [V] add-one unigram
    uni_order = np.lexsort((np.arange(V), -p1))                  # [V]

    # Bigram level: the unseen lower-order mass is exact in integers, sum over unseen w of (c(w) + 1).
    b_ctx, b_len, b_tok = (counts[f"bi_{x}"].astype(np.int64) for x in ("ctx", "len", "tok"))
    unseen = (N + V) - np.add.reduceat(uni[b_tok] + 1, np.cumsum(b_len) - b_len)  # [C2]
    b_p, b_bow, b_of = _katz_level(counts["bi_ctx_count"], b_len, counts["bi_count"], counts["bi_discount"],
                                   float(counts["bi_abs_discount"]), k, p1[b_tok], unseen / (N + V), V)

    # Trigram level: the lower order of (u,v,w) is the bigram entry (v,w), which exists since u,v,w occurred.
    t_ctx, t_len, t_tok = (counts[f"tri_{x}"].astype(np.int64) for x in ("ctx", "len", "tok"))
    t_of = np.repeat(np.arange(len(t_ctx)), t_len)               # [E3]
    b_key = b_ctx[b_of] * V + b_tok                              # [E2] sorted
    want = (t_ctx[t_of] % V) * V + t_tok                         # [E3] key of (v, w)
    at = np.minimum(np.searchsorted(b_key, want), max(len(b_key) - 1, 0))
    if want.size and (len(b_key) == 0 or np.any(b_key[at] != want)):
        raise ValueError("n-gram counts are inconsistent: a trigram (u,v,w) has no bigram (v,w)")
    lower = b_p[at]                                              # [E3] P2(w|v)
    denom = 1.0 - np.add.reduceat(lower, np.cumsum(t_len) - t_len)  # [C3]
    t_p, t_bow, t_of = _katz_level(counts["tri_ctx_count"], t_len, counts["tri_count"], counts["tri_discount"],
                                   float(counts["tri_abs_discount"]), k, lower, denom, V)

    # Sort each history's entries by (p desc, token asc): the order top_k relies on.
    b_order = _by_p_then_token(b_of, b_p, b_tok)
    t_order = _by_p_then_token(t_of, t_p, t_tok)
    bi_index = np.full(V, -1, np.int64)
    bi_index[b_ctx] = np.arange(len(b_ctx))
    return Trigram(
        n_vocab=V, katz_k=k, min_count=min_count, counts=counts, p1=p1, uni_order=uni_order, uni_p=p1[uni_order],
        bi_index=bi_index, bi_ptr=np.concatenate([[0], np.cumsum(b_len)]).astype(np.int64),
        bi_tok=b_tok[b_order], bi_p=b_p[b_order], bi_bow=b_bow,
        tri_key=t_ctx, tri_ptr=np.concatenate([[0], np.cumsum(t_len)]).astype(np.int64),
        tri_tok=t_tok[t_order], tri_p=t_p[t_order], tri_bow=t_bow)


# ----------------------------------------------------------------------------- queries
def _history(model: Trigram, context) -> tuple[int, int]:
    """Ids of the bigram history (last token) and trigram history (last two) of `context`; -1 if unseen."""
    ids = [operator.index(x) for x in context[-2:]]
    if bad := [t for t in ids if not 0 <= t < model.n_vocab]:
        raise ValueError(f"context token id {bad[0]} is outside the vocabulary 0..{model.n_vocab - 1}")
    if not ids:
        return -1, -1
    i2 = int(model.bi_index[ids[-1]])
    if len(ids) < 2 or i2 < 0:
        return i2, -1
    key = ids[0] * model.n_vocab + ids[1]
    i3 = int(np.searchsorted(model.tri_key, key))
    return i2, (i3 if i3 < len(model.tri_key) and model.tri_key[i3] == key else -1)


def _levels(model: Trigram, i2: int, i3: int) -> tuple:
    """(history id, ptr, tok, p, bow) of the trigram order, then the bigram order (`Trigram`'s arrays)."""
    return ((i3, model.tri_ptr, model.tri_tok, model.tri_p, model.tri_bow),
            (i2, model.bi_ptr, model.bi_tok, model.bi_p, model.bi_bow))


def dist(model: Trigram, context) -> np.ndarray:
    """P(. | last two tokens of `context`) as a [V] float64 vector (shorter contexts back off)."""
    p = model.p1.copy()                                          # [V]
    for i, ptr, tok, prob, bow in reversed(_levels(model, *_history(model, context))):
        if i < 0:  # an unseen bigram history has no trigram history either
            break
        p *= bow[i]
        p[tok[ptr[i]:ptr[i + 1]]] = prob[ptr[i]:ptr[i + 1]]
    return p


def _group_top(tok, val, scales, skip, n_skip, k, near_ties=True):
    """The tokens of one sorted group (val desc, tok asc) that can make the top k, and their probabilities,
    skipping the (at most n_skip) tokens of a higher order marked in `skip`. With `near_ties` it also takes
    those within rounding of the k-th: once scaled they may round to its probability and win on a lower id."""
    pos = np.flatnonzero(~skip[tok[:k + n_skip]])[:k]            # positions of the first (up to) k kept
    if near_ties and len(pos) == k:
        thr = val[pos[-1]] * (1 - 1e-12)
        end = pos[-1] + 1 + np.count_nonzero(val[pos[-1] + 1:] >= thr)    # val is sorted desc
        pos = np.flatnonzero(~skip[tok[:end]])
    p = val[pos]
    for s in scales:                                             # same float operations as dist()
        p = s * p
    return tok[pos], p


def top_k(model: Trigram, context, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely next tokens and their probabilities, ties broken by lower token id first. Every
    token is in one group (seen after (u,v), else after v, else unigram), each stored in probability order,
    so the first k of each group are the candidates."""
    if operator.index(k) < 1:
        raise ValueError(f"k={k} must be >= 1")
    k = min(k, model.n_vocab)
    i2, i3 = _history(model, context)
    found = model.memo.get((i2, i3, k))
    if found is None:
        if len(model.memo) >= 100_000:  # bounded: a long run must not grow it without end
            model.memo.clear()
        found = model.memo[(i2, i3, k)] = _top_k(model, i2, i3, k)
    return found


def _top_k(model: Trigram, i2: int, i3: int, k: int):
    skip = np.zeros(model.n_vocab, bool)                         # [V] tokens already in a higher group
    n_skip = 0
    toks, probs, scales = [], [], []
    for i, ptr, tok, prob, bow in _levels(model, i2, i3):
        if i >= 0:
            a, b = ptr[i], ptr[i + 1]
            t, p = _group_top(tok[a:b], prob[a:b], scales, skip, n_skip, k)
            toks.append(t)
            probs.append(p)
            skip[tok[a:b]] = True
            n_skip = b - a                                       # seen after (u,v) implies seen after v
            scales.insert(0, bow[i])                             # unigram probs: bow3 * (bow2 * p1)
    # Unigram values (c + 1) / (N + V) of different counts are far more than rounding apart: no near ties.
    t, p = _group_top(model.uni_order, model.uni_p, scales, skip, n_skip, k, near_ties=False)
    toks.append(t)
    probs.append(p)
    toks, probs = np.concatenate(toks), np.concatenate(probs)
    best = np.lexsort((toks, -probs))[:k]
    return toks[best], probs[best]


def greedy_continuation(model: Trigram, context, n: int) -> list[int]:
    """n steps of argmax decoding from `context` (ties to the lower id): the trigram's guess of what follows."""
    ctx = [operator.index(x) for x in context[-2:]]
    out = []
    for _ in range(n):
        t = int(top_k(model, ctx, 1)[0][0])
        out.append(t)
        ctx = [*ctx[-1:], t]
    return out


# ----------------------------------------------------------------------------- save / load
def save(model: Trigram, path) -> None:
    """Write the counts to one compressed .npz (`ngram_file`), atomically."""
    ngram_file.write(path, model.counts, n_vocab=model.n_vocab, katz_k=model.katz_k, min_count=model.min_count)


def load(path) -> Trigram:
    """Read a model written by save(); ValueError naming the file if it is not one (`ngram_file.read`)."""
    meta, counts = ngram_file.read(path)
    try:
        return _build(counts, meta["n_vocab"], meta["katz_k"], meta["min_count"])
    except ValueError as e:
        raise ValueError(f"{path}: not a valid n-gram model: {e}") from None
