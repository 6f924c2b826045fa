"""The decoding methods, one object each: what a step proposes to the target, and who proposed it.

Every method answers one small interface (in the spirit of Hugging Face's `CandidateGenerator` and
Medusa's `generate_candidates`), which is all the decoding loop (`decode.generate`) asks of it:

- `propose(seq, rand) -> Proposal`: a token tree rooted at seq[-1], who proposed each node, the
  lossless rule that verifies it (it follows from how the tree was drawn) and what drafting cost;
- `commit(keys)`: the accepted path's keys, so a drafter with a cache keeps only that path;
- its sizes: `max_depth()`, `max_nodes()` (drafted nodes of a tree), `max_block()` (the most
  tokens a step proposes to the target, which sizes the target's cache scratch).

| method        | class     | tree                                  | proposer        | runs the draft |
|---------------|-----------|---------------------------------------|-----------------|----------------|
| "ar"          | Plain     | the root alone                        | -               | no             |
| "speculative" | Chain     | a chain of `chain` draft tokens       | draft           | yes            |
| "tree"        | DraftTree | best-first or fixed widths            | draft           | yes            |
| "staged"      | Staged    | as "tree", or stage 2's copy          | draft, n-gram   | yes            |
| "ngram"       | Ngram     | best-first over the Katz trigram      | n-gram          | no             |
| "lookup"      | Lookup    | the chain prompt lookup copies        | n-gram          | no             |

A method is built from the plan alone (its sizes and checks need no model); `start(...)` gives it
the models and the sampling settings before decoding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import build, staged, verify
from .drafting import ModelDrafter, NgramDrafter
from .fastpath import padded
from .kvcache import KVCache
from .lookup import chain_tree, lookup_by_match
from .tree import DRAFT, NGRAM, TARGET, Tree, path_key

KIND_OF = {None: "deterministic", "with": "with_replacement", "without": "without_replacement"}  # plan.sampled


@dataclass
class Proposal:
    """One step's tree and what the loop needs to know about it.

    tree: the token tree (node 0 = seq[-1]); rule: the verification rule for it (verify.RULES);
    proposers: [n] who proposed each node (tree.SOURCES; the root TARGET); copied: stage 2's copy of
    a repeat (no draft pass); draft_blocks: rows of each draft pass it took; draft_dists: draft rows
    processed into q; ngram_queries: n-gram queries it took; built_by: [n] per node, the draft pass
    (0, 1, ...) whose output proposed it (the pass that fed its parent), None for the root and
    where no draft model ran.
    """

    tree: Tree
    rule: str
    proposers: list
    copied: bool = False
    draft_blocks: list = field(default_factory=list)
    draft_dists: int = 0
    ngram_queries: int = 0
    built_by: list | None = None


class Plain:
    """Autoregressive decoding: the target alone, one token per pass (a root-only tree)."""

    # Whether it needs the draft model, whether it needs the n-gram, whether its trees are chains.
    runs_draft = needs_ngram = chain = False

    def __init__(self, plan):
        self.plan = plan
        self.temperature, self.n_ctx, self.cache = 0.0, None, None

    # -- sizes ---------------------------------------------------------------------------------
    def fixed(self) -> bool:
        """Whether its trees have fixed widths (`plan.widths`) rather than a best-first budget."""
        return False

    def max_depth(self) -> int:
        return 0

    def max_nodes(self) -> int:
        """The most drafted nodes a step's tree can have (its size in the target's pass, less the root)."""
        return 0

    def max_block(self) -> int:
        """The most tokens a step proposes to the target."""
        return self.max_nodes()

    def kind(self, temperature: float) -> str:
        """How its trees' children are chosen (tree.KINDS), which decides the rules lossless on them."""
        return "deterministic"

    def size_words(self) -> str:
        """What sets its drafted tokens per step, in the plan's terms."""
        return f"budget={self.plan.budget}"

    def check_rule(self, temperature: float) -> None:
        """A ValueError, before any work, when plan.rule is not lossless for the trees this method drafts."""
        rule = self.plan.rule
        if rule is None or not self.max_nodes():  # drafting nothing, its root-only trees need no rule
            return
        if rule == "greedy":
            if temperature > 0:
                raise ValueError("plan: rule 'greedy' keeps the target's argmax, which is sampling only at "
                                 f"temperature 0; at temperature {temperature} leave rule None (the rule the "
                                 "tree's drafting needs)")
            return
        verify.check_pairing(self.kind(temperature), rule)
        if rule in ("chain", "block") and not (self.chain or self.fixed() and set(self.plan.widths) == {1}):
            raise ValueError(f"rule {rule!r} verifies a chain: use method 'speculative', or widths of 1")

    # -- decoding ------------------------------------------------------------------------------
    def start(self, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None) -> None:
        """Get ready to decode for `target` (its context bounds the trees) with these models and settings."""
        self.n_ctx, self.temperature, self.ngram = target.config.n_ctx, temperature, ngram

    def propose(self, seq, rand) -> Proposal:
        """The step's tree rooted at seq[-1]: a node at depth d sits at position len(seq) - 1 + d < n_ctx."""
        depth = min(self.max_depth(), self.n_ctx - len(seq) - 1)
        return (self.draft(seq, depth, rand) if depth > 0 else None) or self.proposal(Tree([seq[-1]], [-1], [1.0]))

    def draft(self, seq, depth: int, rand) -> Proposal | None:
        """The drafted tree at most `depth` (>= 1) deep, as a Proposal (None: nothing to draft)."""
        return None

    def proposal(self, tree: Tree, proposer: int | list = DRAFT, copied: bool = False, **costs) -> Proposal:
        """A Proposal of `tree`, its nodes proposed by `proposer` (one source, or a list per node), verified by the plan's rule if it
        was drafted as the plan says, else (nothing drafted, or stage 2's copy) by the rule its own
        kind needs."""
        own = copied or self.plan.rule is None or len(tree) == 1
        rule = verify.default_rule(tree.kind, self.temperature, self.chain) if own else self.plan.rule
        proposers = proposer if isinstance(proposer, list) else [TARGET] + [proposer] * (len(tree) - 1)
        return Proposal(tree, rule, proposers, copied, **costs)

    def commit(self, keys) -> None:
        """The accepted path's keys (tokens below the root), after verification."""

    def finish(self, length: int) -> None:
        """Decoding ended with `length` tokens: drop cached rows past length - 1."""


class Lookup(Plain):
    """Prompt lookup: the chain that followed an earlier occurrence of the last 3, 2 or 1 tokens."""

    chain = True

    def lengths(self) -> tuple:
        """Chain lengths after matches of 3, 2 and 1 tokens."""
        return self.plan.lookup_chains or (self.plan.chain,) * 3

    def max_depth(self) -> int:
        return max(self.lengths())

    def max_nodes(self) -> int:
        return self.max_depth()

    def size_words(self) -> str:
        chains = self.plan.lookup_chains
        return f"lookup_chains={','.join(map(str, chains))}" if chains else f"chain={self.plan.chain}"

    def draft(self, seq, depth, rand):
        return self.proposal(chain_tree(seq[-1], lookup_by_match(seq, [min(k, depth) for k in self.lengths()])),
                             NGRAM)


class Ngram(Plain):
    """The Katz trigram drafts a best-first tree itself (no draft model)."""

    needs_ngram = True

    def max_depth(self) -> int:
        return self.plan.depth

    def max_nodes(self) -> int:
        return self.plan.budget

    def draft(self, seq, depth, rand):
        drafter = NgramDrafter(self.ngram, seq)
        tree = build.build_best_first(seq[-1], drafter.dist_fn, self.plan.budget, depth)
        return self.proposal(tree, NGRAM, ngram_queries=drafter.ngram_queries)


class DraftTree(Plain):
    """A draft model's token tree: best-first (`budget` nodes at most `depth` deep) or fixed widths;
    children are the draft's top tokens, or drawn from q (`plan.sampled`)."""

    runs_draft = True

    def fixed(self) -> bool:
        return self.plan.shape == "fixed" or self.plan.sampled is not None

    def sampled(self, temperature: float) -> str | None:
        """How children are drawn from q: None (top tokens), "with" or "without" replacement."""
        return self.plan.sampled

    def kind(self, temperature):
        return KIND_OF[self.sampled(temperature)]

    def max_depth(self) -> int:
        return len(self.plan.widths) if self.fixed() else self.plan.depth

    def max_nodes(self) -> int:
        return int(np.cumprod(self.plan.widths).sum()) if self.fixed() else self.plan.budget

    def expanded(self) -> int:
        """The most nodes the draft expands a step: a best-first tree expands at most `budget` per level."""
        return self.max_nodes() if self.fixed() else self.plan.budget * self.plan.depth

    def size_words(self) -> str:
        return f"widths={','.join(map(str, self.plan.widths))}" if self.fixed() else f"budget={self.plan.budget}"

    def start(self, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None):
        super().start(target, draft, ngram, temperature, top_k, top_p)
        plan = self.plan
        self.drafter = ModelDrafter(draft, temperature, top_k, top_p, ngram=ngram if self.needs_ngram else None,
                                    guess_len=plan.guess_len, guess_rows=plan.guess_rows, max_nodes=self.expanded(),
                                    pad=plan.draft_pad)
        self.cache = self.drafter.cache

    def draft(self, seq, depth, rand):
        d = self.drafter
        depth = min(depth, d.model.config.n_ctx - len(seq))  # the draft feeds nodes up to depth - 1
        if depth <= 0:
            return None
        d.begin(seq, depth)
        tree = self.build(seq[-1], depth, rand if self.sampled(self.temperature) else None)
        keys = [path_key(tree.tokens, tree.parents, i) for i in range(len(tree))]
        # The paper's Fig. 3 credit: stage 2 for a node it guessed (and the draft kept), else the draft.
        proposers = [TARGET] + [NGRAM if keys[i] in d.guessed else DRAFT for i in range(1, len(tree))]
        # Which draft pass built each node: the one that fed its parent (a parent stage 2 guessed was
        # fed ahead of time, in the pass that fed the guess's own parent).
        built_by = [None] + [d.fed_in.get(keys[int(tree.parents[i])]) for i in range(1, len(tree))]
        return self.proposal(tree, proposers, draft_blocks=d.block_sizes, draft_dists=d.dists,
                             ngram_queries=d.ngram_queries, built_by=built_by)

    def build(self, root: int, depth: int, rand) -> Tree:
        """The tree below `root` from the drafter's q (children drawn with `rand`, or top tokens)."""
        if self.fixed():
            return build.build_fixed(root, self.drafter.dist_fn, self.plan.widths[:depth], rand=rand,
                                     replacement=self.plan.sampled != "without")
        return build.build_best_first(root, self.drafter.dist_fn, self.plan.budget, depth)

    def commit(self, keys):
        self.drafter.commit(keys)

    def finish(self, length):
        self.cache.truncate(min(self.cache.length, length - 1))


class Chain(DraftTree):
    """Speculative decoding: a chain of `chain` draft tokens, drawn from q when sampling."""

    chain = True

    def fixed(self) -> bool:
        return False

    def sampled(self, temperature):
        return self.plan.sampled or ("with" if temperature > 0 else None)  # classic speculative sampling

    def max_depth(self) -> int:
        return self.plan.chain

    def max_nodes(self) -> int:
        return self.plan.chain

    def expanded(self) -> int:
        return self.plan.chain

    def size_words(self) -> str:
        return f"chain={self.plan.chain}"

    def build(self, root, depth, rand):
        return build.build_chain(root, self.drafter.dist_fn, depth, rand=rand)


class Staged(DraftTree):
    """Staged decoding: a draft tree whose passes also evaluate stage 2's guesses, or, when the last
    three tokens recur, stage 2's copy of what followed them, verified with no draft pass."""

    needs_ngram = True

    def max_block(self) -> int:
        return max(self.max_nodes(), self.plan.copy_len)

    def size_words(self) -> str:
        return super().size_words() + ("" if self.fixed() else f", copy_len={self.plan.copy_len}")

    def propose(self, seq, rand):
        """Stage 2's copy of a repeat if the last three tokens recur (one n-gram query), else the
        draft's tree."""
        room = self.n_ctx - len(seq) - 1
        if not (self.plan.copy_len and room > 0):
            return super().propose(seq, rand)
        copy = staged.copied_chain(seq, min(self.plan.copy_len, room))
        if copy is not None:
            return self.proposal(copy, NGRAM, copied=True, ngram_queries=1)
        proposal = super().propose(seq, rand)
        proposal.ngram_queries += 1  # the search for a repeat
        return proposal


METHODS = {"ar": Plain, "speculative": Chain, "tree": DraftTree, "staged": Staged, "ngram": Ngram, "lookup": Lookup}


def make(name: str, plan):
    """The method object for `name` under `plan` (the one place a method's name is read)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name](plan)


def new_cache(target, method, pad=()) -> KVCache:
    """The target's cache, with scratch for the widest block a step of `method` feeds (root included)."""
    return KVCache(target.config, dtype=target.dtype, max_block=padded(pad, method.max_block() + 1))
