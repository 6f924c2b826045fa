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
continuation (`ngram.py`). The lookup itself lives in `lookup.py`, which prompt lookup decoding
uses alone.
"""

from __future__ import annotations

from . import ngram as ngram_lib
from .lookup import chain_tree, repeat_continuation
from .tree import COPY, NGRAM, Tree


def guess(ngram, context, n: int) -> tuple[list[int], int, int]:
    """Stage 2's guess of the n tokens after `context`, who made it (tree.SOURCES) and the n-gram
    queries it took: the copy of a repeat if there is one (COPY), else the trigram's greedy
    continuation (NGRAM)."""
    copied = repeat_continuation(context, n)
    if copied:
        return copied, COPY, 1
    return ngram_lib.greedy_continuation(ngram, context, n), NGRAM, 1 + n


def speculate(ngram, seq, keys, guess_len: int, max_depth: int, room: int, known) -> tuple[dict, int]:
    """The guessed nodes the draft should evaluate alongside `keys` (path keys below the root of
    `seq`), at most `room` of them, skipping `known` ones, each with who guessed it ({key: COPY or
    NGRAM}, in order); and the n-gram queries spent.

    Each key gets the guess of the next min(guess_len, max_depth - 1 - depth) levels below it:
    nodes at depth max_depth are leaves, never expanded, so guessing past max_depth - 1 is waste.
    """
    extra, queries = {}, 0
    for k in keys:
        if len(extra) >= room:
            break
        n = min(guess_len, max_depth - 1 - len(k))
        if n <= 0:
            continue
        tokens, source, q = guess(ngram, list(seq) + list(k), n)
        queries += q
        for j in range(1, len(tokens) + 1):  # each guessed node, below its guessed parent
            g = k + tuple(tokens[:j])
            if g not in known and g not in extra and len(extra) < room:
                extra[g] = source
    return extra, queries


def copied_chain(seq, copy_len: int) -> Tree | None:
    """The step's tree when stage 2 proposes to the target directly: the chain of the `copy_len`
    tokens that followed the last three tokens' latest earlier occurrence below the root seq[-1]
    (None if they are new). Deterministic children with no draft probabilities (q = 1)."""
    tokens = repeat_continuation(seq, copy_len) if copy_len > 0 else []
    return chain_tree(seq[-1], tokens) if tokens else None
