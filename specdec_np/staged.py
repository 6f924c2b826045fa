"""Stage 2 of staged speculative decoding: the cheapest drafter, speculating for the draft and the target.

Spector & Re (2023) speculate the draft model itself with an n-gram model. Here stage 2 does two things, both from
the same guess of what comes next:

- **Guesses for the draft** (`speculate`): below every node the draft evaluates, stage 2 guesses the next
  `guess_len` tokens, evaluated in the same forward pass, so a guessed node the builder asks for later needs no pass.
  The distributions are the draft's own: stage 2 changes the cost, never the tree.
- **Copies for the target** (methods.Staged): when the last three tokens occurred earlier, the step's tree is the
  chain of what followed them (`lookup.repeat_continuation`), verified with no draft pass at all.
"""

from __future__ import annotations

from . import ngram as ngram_lib
from .lookup import repeat_continuation
from .tree import COPY, NGRAM


def guess(ngram, context, n: int) -> tuple[list[int], int, int]:
    """Stage 2's guess of the n tokens after `context`, who made it (tree.SOURCES) and the n-gram queries it took: the
    copy of what followed the last three tokens' latest earlier occurrence if there is one (COPY: code repeats its own
    names, which no corpus statistic knows), else the Katz trigram's greedy continuation (NGRAM, `ngram.py`)."""
    copied = repeat_continuation(context, n)
    if copied:
        return copied, COPY, 1
    return ngram_lib.greedy_continuation(ngram, context, n), NGRAM, 1 + n


def speculate(ngram, seq, keys, guess_len: int, max_depth: int, most: int, known) -> tuple[dict, int]:
    """The guessed nodes the draft should evaluate alongside `keys` (path keys below the root of `seq`), at most
    `most`, not `known`, each with who guessed it ({key: COPY or NGRAM}, in order); and the n-gram queries spent. Each
    key gets min(guess_len, max_depth - 1 - depth) levels: nodes at depth max_depth are leaves, never expanded."""
    extra, queries = {}, 0
    for k in keys:
        if len(extra) >= most:
            break
        n = min(guess_len, max_depth - 1 - len(k))
        if n <= 0:
            continue
        tokens, source, q = guess(ngram, list(seq) + list(k), n)
        queries += q
        for j in range(1, len(tokens) + 1):  # each guessed node, below its guessed parent
            g = k + tuple(tokens[:j])
            if g not in known and g not in extra and len(extra) < most:
                extra[g] = source
    return extra, queries
