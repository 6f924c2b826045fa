"""Drafters: who proposes the token tree, as `dist_fn` callbacks for the tree builders of `build.py`.

A builder asks "what is the draft's next-token distribution at these nodes of the partial tree?" (one call per tree
level); a drafter answers, counting what its step cost. Those with a model and a KV cache are a `Drafter`:
`ModelDrafter` (the draft model: a whole frontier in one tree-masked pass; with an n-gram model the **staged**
drafter, whose passes also evaluate stage 2's guesses, so later levels often need no pass) and eagle.FeatureDrafter.
"""

from __future__ import annotations

import numpy as np

from . import ngram as ngram_lib
from . import staged
from .gpt2 import forward, new_cache
from .record import NO_RECORD
from .sampling import process
from .tree import DRAFT, block, path_key


class Drafter:
    """A drafter with a model and its own KV cache (`rows` of scratch, Method.draft_rows): `dist_fn` answered from the
    logits of the nodes its passes fed (`draft_pass`, each subclass's own, reported to `recorder`). Per step: `begin`,
    `dist_fn` calls, `commit(...)`; the nodes fed form a tree in feed order (`tokens`, `parents`)."""

    def __init__(self, model, temperature=0.0, top_k=None, top_p=None, rows: int = 256, recorder=NO_RECORD):
        self.model, self.recorder = model, recorder
        # At temperature 0 the *verification* is greedy, but a one-hot q would collapse every tree to a chain: the
        # drafter ranks alternatives by softmax(logits).
        self.settings = (1.0, None, None) if temperature == 0 else (temperature, top_k, top_p)
        self.cache = new_cache(model, rows)  # new_cache adds the padding rows
        self.index: dict[tuple, int] = {}  # path key -> node fed this step (empty until `begin`)

    def begin(self, seq, max_depth: int) -> None:
        """Start a step after the committed `seq`; the tree will be at most `max_depth` deep."""
        self.seq, self.max_depth = [int(t) for t in seq], max_depth
        self.root = len(self.seq) - 1  # the root (last emitted token) sits at this position
        self.tokens, self.parents, self.index = [], [], {}  # the nodes fed this step, in feed order; key -> node
        self.logits: dict[tuple, np.ndarray] = {}  # path key -> the drafter's logits after that node
        self.dist: dict[tuple, np.ndarray] = {}  # path key -> q (computed on demand)
        self.block_sizes, self.dists = [], 0  # this step's costs: rows of each pass, rows processed into q

    def dist_fn(self, tokens, parents, nodes):  # -> [len(nodes), V]
        keys = [path_key(tokens, parents, i) for i in nodes]
        if missing := [k for k in dict.fromkeys(keys) if k not in self.logits]:
            self.draft_pass(missing)
        # Softmax only the rows asked for: most of stage 2's guesses are never needed (or once).
        if todo := [k for k in dict.fromkeys(keys) if k not in self.dist]:
            self.dists += len(todo)
            self.dist.update(zip(todo, process(np.stack([self.logits[k] for k in todo]), *self.settings,
                                               whose="the draft's")))
        return np.stack([self.dist[k] for k in keys])

    def feed(self, keys) -> None:
        """Add the nodes `keys` (their parents fed already, or earlier in `keys`) to this step's fed tree."""
        for k in keys:
            self.index[k] = len(self.tokens)
            self.tokens.append(k[-1] if k else self.seq[-1])
            self.parents.append(self.index[k[:-1]] if k else -1)

    def costs(self) -> dict:
        """What this step's drafting cost, as a Proposal holds it."""
        return {"draft_blocks": self.block_sizes, "draft_dists": self.dists}

    def source(self, key) -> int:
        """Who proposed the node `key` (tree.SOURCES): the drafter."""
        return DRAFT


class ModelDrafter(Drafter):
    """The draft model (optionally staged): node i of the step's fed tree at cache slot root + i (`tree.block`); after
    verification it keeps only the accepted path. Stage 2 adds at most `guess_rows` guesses per pass ("pad": those the
    padding holds)."""

    def __init__(self, model, temperature=0.0, top_k=None, top_p=None, ngram=None,
                 guess_len: int = 0, guess_rows: int | str = 0, rows: int = 256, recorder=NO_RECORD):
        super().__init__(model, temperature, top_k, top_p, rows, recorder)
        self.ngram, self.guess_rows = ngram, guess_rows
        self.guess_len = guess_len if ngram is not None else 0

    def begin(self, seq, max_depth: int) -> None:
        super().begin(seq, max_depth)
        self.guessed, self.ngram_queries = {}, 0  # key stage 2 proposed -> NGRAM or COPY (Fig. 3's credit); queries
        self.cache.truncate(min(self.cache.length, self.root))

    def costs(self) -> dict:
        return super().costs() | {"ngram_queries": self.ngram_queries}

    def source(self, key) -> int:
        """Stage 2 for a node it guessed (and the draft kept), else the draft."""
        return self.guessed.get(key, DRAFT)

    def commit(self, accepted_keys) -> None:
        """Keep the root and the accepted nodes that were fed, in contiguous slots; drop the rest."""
        # Fed nodes of a path form a prefix of it (a node is fed only after its parent).
        kept = [k for k in [(), *accepted_keys] if k in self.index]
        if kept:  # else nothing was fed this step: the prefix stays as it was
            self.cache.keep(self.root, [self.index[k] for k in kept])
        # The step is over: a later step that feeds nothing (its tree drafted nothing, e.g. past the end of the
        # draft's context) must not keep this step's nodes again.
        self.index = {}

    def draft_pass(self, keys) -> None:
        """One forward pass over the nodes `keys` (their parents fed already, or earlier in `keys`), plus stage 2's
        guesses below them, and on the step's first pass the catch-up rows."""
        first = len(self.tokens)
        if self.guess_len > 0:
            most = self.guess_rows
            if most == "pad":  # guesses fill the rows the padded block computes anyway (fastpath.Layout)
                n = len(keys) + (self.root - self.cache.length if first == 0 else 0)
                most = self.model.layout.rows(n) - n
            guesses, queries = staged.speculate(self.ngram, self.seq, keys, self.guess_len, self.max_depth, most,
                                                self.logits)
            self.ngram_queries += queries
            self.guessed.update(guesses)
            keys = keys + list(guesses)
        self.feed(keys)
        tokens, positions, mask, n_c = block(self.seq, self.cache.length, self.tokens, self.parents, first)
        logits = forward(self.model, tokens, self.cache, positions, mask, logits_from=n_c)  # [len(keys), V]
        self.logits.update(zip(keys, logits))
        self.block_sizes.append(len(tokens))
        self.recorder.draft_pass(keys, [self.guessed.get(k, DRAFT) for k in keys], len(tokens))


class NgramDrafter:
    """The Katz trigram answering `dist_fn` queries after the committed `seq` (no draft model)."""

    def __init__(self, model, seq):
        self.model, self.seq = model, [int(t) for t in seq]
        self.ngram_queries = 0  # one per node asked for

    def dist_fn(self, tokens, parents, nodes):  # -> [len(nodes), V]
        self.ngram_queries += len(nodes)
        return np.stack([ngram_lib.dist(self.model, self.seq + list(path_key(tokens, parents, i))) for i in nodes])
