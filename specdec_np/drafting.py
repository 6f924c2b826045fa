"""Drafters: who proposes the token tree, as `dist_fn` callbacks for the tree builders of `build.py`.

A builder asks "what is the draft's next-token distribution at these nodes of the partial tree?"
(one call per tree level). Three drafters answer it:

- `ModelDrafter`: the draft model. It expands a whole frontier in one tree-masked forward pass over
  its own KV cache, and after verification keeps only the accepted path, like the target.
- `ModelDrafter(..., ngram=...)`: the **staged** drafter (the paper's second stage). With every
  pass the draft also evaluates the n-gram's guess of the next few levels below each node it
  expands (what followed the same three tokens earlier in the context, else the trigram's).
  When the builder later asks for a node the n-gram guessed, its distribution is already there:
  no draft pass. The distributions are the draft's own, so the tree is *identical* to the
  unstaged one: stage 2 changes the cost, never the result (and sampled children stay exact
  samples of q, because the builder samples them from these same distributions).
- `ngram_dist_fn`: the Katz trigram drafts the tree directly (no draft model).
"""

from __future__ import annotations

import numpy as np

from . import ngram as ngram_lib
from .gpt2 import GPT2, KVCache, forward
from .sampling import process


def path_key(tokens, parents, node: int) -> tuple:
    """The tokens from the root (excluded) down to `node`: a node's identity across rebuilt trees."""
    out = []
    while node > 0:
        out.append(int(tokens[node]))
        node = int(parents[node])
    return tuple(out[::-1])


def draft_settings(temperature, top_k, top_p):
    """How the draft's logits are processed into q. At temperature 0 the *verification* is greedy,
    but a one-hot q would collapse every tree to a chain: rank alternatives by softmax(logits)."""
    if temperature == 0:
        return 1.0, None, None
    return temperature, top_k, top_p


class ModelDrafter:
    """The draft model (optionally staged with an n-gram) answering `dist_fn` queries.

    Per decoding step: `begin(seq)`, then the builder calls `dist_fn`, then `commit(accepted)`.
    The cache holds a prefix of the committed sequence; tree nodes evaluated in this step sit in
    scratch slots after it (`slot[key]`), each attending to the prefix, its ancestors and itself.
    """

    def __init__(self, model: GPT2, temperature=0.0, top_k=None, top_p=None, ngram=None,
                 spec_len: int = 3, spec_width: int = 1, spec_rows: int | str = "pad", max_scratch: int = 1024,
                 pad=None):
        self.model = model
        self.pad = pad  # block size to compute n tokens as (tuning.padding); None: unpadded
        self.cache = KVCache(model.config, dtype=model.dtype, max_block=max_scratch)
        self.settings = draft_settings(temperature, top_k, top_p)
        # Stage 2: below every node the draft evaluates, the n-gram guesses `spec_width` children,
        # each continued greedily to `spec_len` levels in all.
        self.ngram, self.spec_len, self.spec_width = ngram, spec_len, spec_width
        # At most spec_rows guessed nodes per pass; "pad": as many as fit in the rows the padded
        # block computes anyway (free on this machine's cost curve; none without padding).
        self.spec_rows = spec_rows
        self.passes = self.ngram_queries = 0
        self.block_sizes = []  # tokens fed per draft pass

    # -- one decoding step ---------------------------------------------------------------------
    def begin(self, seq, max_depth: int) -> None:
        """Start a step after the committed `seq`; the tree will be at most `max_depth` deep."""
        self.seq = [int(t) for t in seq]
        self.max_depth = max_depth
        self.root_pos = len(self.seq) - 1  # the root (last emitted token) sits at this position
        self.slot: dict[tuple, int] = {}  # path key -> cache slot of a node fed this step
        self.logits: dict[tuple, np.ndarray] = {}  # path key -> the draft's logits at that node
        self.dist: dict[tuple, np.ndarray] = {}  # path key -> draft distribution q (computed on demand)
        self.guessed: set[tuple] = set()  # keys the n-gram proposed (for the paper's Fig. 3 credit)
        self.cache.truncate(min(self.cache.length, self.root_pos))

    def dist_fn(self, tokens, parents, nodes):  # -> [len(nodes), V]
        keys = [path_key(tokens, parents, i) for i in nodes]
        missing = [k for k in dict.fromkeys(keys) if k not in self.logits]
        if missing:
            self._draft_pass(missing)
        # Softmax only the rows asked for: most n-gram guesses are never needed (or needed once).
        todo = [k for k in dict.fromkeys(keys) if k not in self.dist]
        if todo:
            for k, q in zip(todo, process(np.stack([self.logits[k] for k in todo]), *self.settings)):
                self.dist[k] = q
        return np.stack([self.dist[k] for k in keys])

    def commit(self, accepted_keys) -> None:
        """Keep the root and the accepted nodes that were fed, in contiguous slots; drop the rest."""
        if () not in self.slot:  # nothing fed this step (e.g. budget 0): the prefix stays as it was
            return
        kept = [()] + [k for k in accepted_keys if k in self.slot]
        # Fed nodes of a path form a prefix of it (a node is fed only after its parent).
        kept = kept[:next((i for i, k in enumerate(kept) if k not in self.slot), len(kept))]
        self.cache.keep(self.root_pos, [self.slot[k] - self.root_pos for k in kept])

    # -- the forward pass ----------------------------------------------------------------------
    def _guesses(self, context, n: int) -> list[list[int]]:
        """Stage 2's guesses of the n tokens after `context`, `spec_width` of them: first what
        followed the latest earlier occurrence of the context's last three tokens (prompt lookup:
        code repeats its own names, which no corpus statistic knows), then the trigram's best next
        tokens; each guess continued greedily by the trigram to n tokens."""
        out = []
        copied = ngram_lib.repeat_continuation(context, n)  # [] if the last three tokens are new
        self.ngram_queries += 1
        if copied:
            out.append(copied)
        if len(out) < self.spec_width:  # the trigram fills the places the copy left
            firsts, _ = ngram_lib.top_k(self.ngram, context, self.spec_width)
            self.ngram_queries += 1
            out += [[int(t)] for t in firsts if not copied or int(t) != copied[0]]
            out = out[:self.spec_width]
        for g in out:
            missing = n - len(g)
            g += ngram_lib.greedy_continuation(self.ngram, context + g, missing)
            self.ngram_queries += missing
        return out

    def _speculate(self, keys, room: int):
        """Stage 2: for each key to evaluate, the guesses of the next levels below it (at most
        `room` guessed nodes in all)."""
        extra = []
        if self.ngram is None or self.spec_len <= 0:
            return extra
        for k in keys:
            # Leaves (depth max_depth) are never expanded: guessing below depth max_depth - 1 is waste.
            if len(extra) >= room:
                break
            n = min(self.spec_len, self.max_depth - 1 - len(k))
            if n <= 0:
                continue
            for guess in self._guesses(self.seq + list(k), n):
                for j in range(1, len(guess) + 1):  # each guessed node, below its guessed parent
                    g = k + tuple(guess[:j])
                    if g not in self.logits and g not in extra and len(extra) < room:
                        extra.append(g)
                        self.guessed.add(g)
        return extra

    def _draft_pass(self, keys) -> None:
        start = self.cache.length
        catch_up = []
        if () in keys:  # first pass of the step: also feed committed tokens the cache lacks
            catch_up = self.seq[start:self.root_pos]
        room = self.spec_rows
        if room == "pad":  # guesses fill the rows the padded block computes anyway
            n_real = len(catch_up) + len(keys)
            room = (self.pad(n_real) if self.pad else n_real) - n_real
        keys = keys + self._speculate(keys, room)
        n_c, n = len(catch_up), len(catch_up) + len(keys)
        new_slot = {k: start + n_c + i for i, k in enumerate(keys)}
        tokens = catch_up + [k[-1] if k else self.seq[-1] for k in keys]
        positions = np.concatenate([start + np.arange(n_c),
                                    [self.root_pos + len(k) for k in keys]]).astype(np.int64)
        mask = np.zeros((n, start + n), dtype=bool)
        mask[:, :min(start, self.root_pos)] = True  # committed prefix: seen by everyone
        mask[:n_c, start:start + n_c] = np.tril(np.ones((n_c, n_c), dtype=bool))
        mask[n_c:, start:start + n_c] = True
        for i, k in enumerate(keys):  # a node sees its ancestors (root included) and itself
            for j in range(len(k) + 1):
                anc = k[:j]
                mask[n_c + i, self.slot.get(anc, new_slot.get(anc))] = True
        logits = forward(self.model, tokens, self.cache, positions=positions, mask=mask,
                         pad_to=self.pad(n) if self.pad else None, logits_from=n_c)  # [len(keys), V]
        for k, row in zip(keys, logits):
            self.slot[k] = new_slot[k]
            self.logits[k] = row
        self.passes += 1
        self.block_sizes.append(n)


def ngram_dist_fn(model, seq, counter: list | None = None):
    """dist_fn of the Katz trigram drafting the tree itself (no draft model)."""
    seq = [int(t) for t in seq]

    def dist_fn(tokens, parents, nodes):
        if counter is not None:
            counter[0] += len(nodes)
        return np.stack([ngram_lib.dist(model, seq + list(path_key(tokens, parents, i))) for i in nodes])

    return dist_fn
