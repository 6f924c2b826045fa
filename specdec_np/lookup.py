"""Prompt lookup: propose what followed the latest earlier occurrence of the context's last tokens.

No model at all: code repeats its own names, loops and boilerplate, and a repeat in the context is a free draft.
Prompt lookup decoding (method "lookup") verifies such a chain every step; stage 2 (`staged.py`) copies one, to the
target and for the draft, when the last *three* tokens recur.
"""

from __future__ import annotations

import numpy as np

from .tree import COPY, TARGET, Tree


def prompt_lookup(tokens, max_ngram: int = 3, min_ngram: int = 1, k: int = 10) -> list[int]:
    """Propose k tokens: what followed the most recent earlier occurrence of the last n tokens, for n = max_ngram down
    to min_ngram (a longer match is better evidence); [] when nothing matches. A match close to the end runs into the
    proposal: the sequence repeats a loop (its period the distance to the match), and the proposal goes around it."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    t = np.asarray(tokens, dtype=np.int64)  # [L]
    L = len(t)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        # Window i is t[i:i+n], i < L - n (never the suffix itself; always a next token): it matches the suffix
        # t[L-n:] if it agrees at every offset j, n shifted comparisons.
        hits = np.flatnonzero(np.all([t[j:L - n + j] == t[L - n + j] for j in range(n)], axis=0))  # [L-n] -> [hits]
        if len(hits):
            loop = t[hits[-1] + n:]  # [L - i - n]: what followed the match
            return np.resize(loop, k).tolist()  # repeated cyclically to k tokens
    return []


def lookup_by_match(tokens, lengths) -> list[int]:
    """Prompt lookup with the chain's length set by the evidence: lengths[0] tokens after a match of the last 3
    tokens, lengths[1] after 2, lengths[2] after 1 (0: nothing after a match that short; why: docs/performance.md);
    [] when nothing matches. Equal lengths k: `prompt_lookup(tokens, k=k)`."""
    tokens = np.asarray(tokens, dtype=np.int64)  # [L], converted once for the three searches
    for n, k in zip((3, 2, 1), lengths):
        proposal = prompt_lookup(tokens, max_ngram=n, min_ngram=n, k=max(k, 1))
        if proposal:
            return proposal[:k]
    return []


def repeat_continuation(tokens, k: int) -> list[int]:
    """Stage 2's copy: the k tokens that followed the latest earlier occurrence of the last *three* tokens ([] if they
    are new); a one- or two-token match is too weak evidence to act on."""
    return prompt_lookup(tokens, max_ngram=3, min_ngram=3, k=k)


def chain_tree(root: int, tokens) -> Tree:
    """`tokens`, copied from the context, as a deterministic chain below `root` (q = 1); maybe none."""
    n = len(tokens)
    return Tree([root, *tokens], np.arange(-1, n), np.ones(n + 1), source=[TARGET] + [COPY] * n)
