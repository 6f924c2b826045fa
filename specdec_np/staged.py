"""Stage 2 of staged speculative decoding: the cheapest drafter, speculating for the draft and the target.

Spector & Re (2023) speculate the draft model itself with an n-gram model. Here stage 2 does two
things, both from the same guess of what comes next:

- **Guesses for the draft** (`speculate`): below every node the draft model evaluates, stage 2
  guesses the next `guess_len` tokens, and the draft evaluates them in the same forward pass.
  When the tree builder later asks for a guessed node, its distribution is already there: no
  draft pass. The distributions are the draft's own, so the tree is identical to the one the
  draft builds alone: stage 2 changes the cost, never the result.
- **Copies for the target** (`copied_chain`): when the context's last three tokens occurred
  earlier, the step's tree is simply the chain of what followed them, verified by the target with
  no draft pass at all (code and small models repeat themselves, and a copy is free to draft).

A guess is what followed the latest earlier occurrence of the last three tokens (prompt lookup:
code repeats its own names, which no corpus statistic knows), else the Katz trigram's greedy
continuation (`ngram.py`).
"""

from __future__ import annotations

import numpy as np

from . import ngram as ngram_lib
from .tree import DRAFT, NGRAM, TARGET, Tree


def prompt_lookup(tokens, max_ngram: int = 3, min_ngram: int = 1, k: int = 10) -> list[int]:
    """Propose k tokens: what followed the most recent earlier occurrence of the last n tokens.

    Tries n = max_ngram down to min_ngram (a longer match is better evidence); [] when nothing matches.
    A match close to the end runs into the tokens being proposed: the sequence is then repeating a
    loop (period = distance to the match), and the proposal goes on around that loop.
    """
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    t = np.asarray(tokens, dtype=np.int64)  # [L]
    L = len(t)
    for n in range(max_ngram, min_ngram - 1, -1):
        if L < n + 1:
            continue
        # Window i is t[i:i+n], for i < L - n: windows of t[:-1] exclude the suffix itself and
        # always have a next token. It matches the suffix t[L-n:] if it agrees at every offset j:
        # n shifted comparisons (a sliding_window_view costs more than the search, per call).
        match = t[:L - n] == t[L - n]  # [L-n]
        for j in range(1, n):
            match &= t[j:L - n + j] == t[L - n + j]
        hits = np.flatnonzero(match)
        if len(hits):
            loop = t[hits[-1] + n:]  # [L - i - n]: what followed the match
            return np.resize(loop, k).tolist()  # repeated cyclically to k tokens
    return []


def lookup_by_match(tokens, lengths) -> list[int]:
    """Prompt lookup with the chain's length set by the evidence: lengths[0] tokens after a match of
    the last 3 tokens, lengths[1] after 2, lengths[2] after 1 (0: nothing after a match that short);
    [] when nothing matches. Equal lengths k give `prompt_lookup(tokens, k=k)`."""
    # Side by side on the 164 HumanEval prompts (AMD EPYC, 2 cores, 32 MB L3): greedy, lengths
    # (15, 7, 0) got 4.81 tokens per target pass against 4.40 for chains of 7 after any match, and
    # 1.09x (1.07-1.12) their tokens/s; at top-k 50, (7, 3, 0) against chains of 3, 1.07x
    # (1.06-1.09) the tokens/s with 0.93x the tokens per pass: where a single token matched, a
    # pass of one row costs less than a chain that is seldom accepted.
    tokens = np.asarray(tokens, dtype=np.int64)  # [L], converted once for the three searches
    for n, k in zip((3, 2, 1), lengths):
        proposal = prompt_lookup(tokens, max_ngram=n, min_ngram=n, k=max(k, 1))
        if proposal:
            return proposal[:k]
    return []


def repeat_continuation(tokens, k: int) -> list[int]:
    """Stage 2's copy: the k tokens that followed the latest earlier occurrence of the last *three*
    tokens ([] if they are new); a one- or two-token match is too weak evidence to act on."""
    return prompt_lookup(tokens, max_ngram=3, min_ngram=3, k=k)


def guess(ngram, context, n: int) -> tuple[list[int], int]:
    """Stage 2's guess of the n tokens after `context`, and the n-gram queries it took: the copy
    of a repeat if there is one, else the trigram's greedy continuation."""
    copied = repeat_continuation(context, n)
    if copied:
        return copied, 1
    return ngram_lib.greedy_continuation(ngram, context, n), 1 + n


def speculate(ngram, seq, keys, guess_len: int, max_depth: int, room: int, known) -> tuple[list[tuple], int]:
    """The guessed nodes the draft should evaluate alongside `keys` (path keys below the root of
    `seq`), at most `room` of them, skipping `known` ones; and the n-gram queries spent.

    Each key gets the guess of the next min(guess_len, max_depth - 1 - depth) levels below it:
    nodes at depth max_depth are leaves, never expanded, so guessing past max_depth - 1 is waste.
    """
    extra, queries = [], 0
    for k in keys:
        if len(extra) >= room:
            break
        n = min(guess_len, max_depth - 1 - len(k))
        if n <= 0:
            continue
        tokens, q = guess(ngram, list(seq) + list(k), n)
        queries += q
        for j in range(1, len(tokens) + 1):  # each guessed node, below its guessed parent
            g = k + tuple(tokens[:j])
            if g not in known and g not in extra and len(extra) < room:
                extra.append(g)
    return extra, queries


def copied_chain(seq, copy_len: int) -> Tree | None:
    """The step's tree when stage 2 proposes to the target directly: the chain of the `copy_len`
    tokens that followed the last three tokens' latest earlier occurrence below the root seq[-1]
    (None if they are new). Deterministic children with no draft probabilities (q = 1)."""
    tokens = repeat_continuation(seq, copy_len) if copy_len > 0 else []
    return chain_tree(seq[-1], tokens) if tokens else None


def chain_tree(root: int, tokens) -> Tree:
    """`tokens` as a deterministic chain below `root`, proposed by stage 2 (q = 1: no draft
    probabilities); the root alone if there are none."""
    n = len(tokens)
    return Tree(tokens=np.array([root] + list(tokens), dtype=np.int64), parents=np.arange(-1, n, dtype=np.int64),
                q=np.ones(n + 1), kind="deterministic", source=np.array([TARGET] + [NGRAM] * n))


def credit(key: tuple, copied: bool, guessed) -> int:
    """Who proposed an accepted drafted token (the paper's Fig. 3): stage 2 if it copied the chain
    or guessed the token (and the draft kept it in the tree), else the draft model."""
    return NGRAM if copied or key in guessed else DRAFT
