"""The decoding methods: what a step proposes to the target, and who proposed it.

A method is its class (`METHODS`, by the name `generate` takes), built once with its models and sampling settings
(`make`), like Hugging Face's `CandidateGenerator`. The loop (`decode.generate`) asks it `propose(seq, rand) ->
Proposal` and `commit(keys)` (the accepted path, so a drafter with a cache keeps only that path). What a method is
needs no model: what it drafts with (class attributes); under a plan its sizes, the kind of its trees and the rules
lossless on them (class methods).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from . import build, verify
from .drafting import ModelDrafter, NgramDrafter
from .eagle import FeatureDrafter
from .lookup import chain_tree, lookup_by_match, repeat_continuation
from .record import NO_RECORD
from .tree import NGRAM, Tree, path_key
from .values import FieldError


@dataclass
class Proposal:
    """One step's tree, the lossless rule that verifies it and what drafting cost."""

    tree: Tree  # node 0 = seq[-1]; tree.source says who proposed each node
    rule: str  # the verification rule for it (verify.RULES)
    copied: bool = False  # stage 2's copy of a repeat (no draft pass)
    draft_blocks: list = field(default_factory=list)  # rows of each draft pass it took
    draft_dists: int = 0  # draft rows processed into q
    ngram_queries: int = 0


def depth_left(seq, n_ctx: int, depth: int) -> int:
    """How deep a step's tree may go: a node at depth d sits at position len(seq) - 1 + d < n_ctx."""
    return min(depth, n_ctx - len(seq) - 1)


class Method:
    """What every method is and holds (each subclass sets its `name` and facts): the plan, the target's context
    (which bounds its trees), the temperature and the n-gram model (if it reads one)."""

    drafts = True  # proposes tokens below the root (every method but plain decoding)
    drafts_with = None  # generate's draft: None, "draft" (gpt2.GPT2) or "head" (eagle.Head, fed target features)
    needs_ngram = False  # reads the n-gram model
    proposes_chain = False  # its trees are chains (one child per node)
    cache = None  # the drafter's KV cache, if any (decode returns it for inspection)

    def __init__(self, plan, n_ctx: int, temperature: float = 0.0, ngram=None):
        self.plan, self.n_ctx, self.temperature, self.ngram = plan, n_ctx, temperature, ngram

    # What it is under a plan, with no model (class methods; a subclass overrides what differs):
    max_depth = classmethod(lambda cls, plan: plan.depth)  # the deepest node a step drafts
    max_nodes = classmethod(lambda cls, plan: cls.max_depth(plan))  # a step's tree's drafted nodes, at most
    max_block = classmethod(lambda cls, plan: cls.max_nodes(plan))  # ... and tokens proposed (a tree, or a copy)
    size_fields = classmethod(lambda cls, plan: ("budget",))  # the plan fields that set those, the tree's first
    # How its trees' children are chosen (tree.KINDS) and whether they are chains: which rules are lossless on them.
    tree_kind = classmethod(lambda cls, plan, temperature: "deterministic")
    chains = classmethod(lambda cls, plan: cls.proposes_chain)
    draft_rows = classmethod(lambda cls, plan: 0)  # the draft's scratch for one step, in KV cache rows

    @classmethod
    def lossless(cls, plan, temperature: float) -> bool:
        """Whether plan.rule (None: the trees' own) verifies its trees losslessly (verify.lossless_rules)."""
        return plan.rule is None or not cls.drafts or plan.rule in verify.lossless_rules(
            cls.tree_kind(plan, temperature), temperature, cls.chains(plan))

    @classmethod
    def check_rule(cls, plan, temperature: float) -> None:
        """A ValueError before any work when plan.rule is not lossless for its trees (verify.check_pairing: why)."""
        if not cls.lossless(plan, temperature):
            verify.check_pairing(cls.tree_kind(plan, temperature), plan.rule, temperature, cls.chains(plan))

    @classmethod
    def nearest_lossless(cls, plan, temperature: float, then=lambda plan: plan):
        """The plan nearest `plan` whose rule is lossless on its trees: itself, else its trees drawn another way, else
        each of those as a chain; each as `then` makes it (a caller's changes, which win); None if none is."""
        drawn = [replace(plan, sampled=s) for s in dict.fromkeys((plan.sampled, None, "without", "with"))]
        plans = drawn + [replace(p, shape="fixed", widths=(1,) * len(plan.widths)) for p in drawn]
        return next((p for p in map(then, plans) if cls.lossless(p, temperature)), None)

    @classmethod
    def check_size(cls, plan, n_ctx: int) -> None:
        """A FieldError naming the plan fields at fault, before any allocation, when a step outgrows `n_ctx`: the
        target's block (tree or copy), a depth, or the draft's scratch (draft_rows, at most n_ctx rows per position)."""
        def fields(names):  # (names, their values)
            return tuple(names), tuple(getattr(plan, name) for name in names)
        block = cls.max_block(plan)
        if block > n_ctx:
            raise FieldError(*fields(cls.size_fields(plan)), f") exceed the target's context (n_ctx={n_ctx})",
                             lead=f"up to {block} tokens per step (")
        # The other fields that set a depth (widths, chain, lookup_chains) size the block too.
        staged_guesses = plan.guess_len if cls.drafts_with and cls.needs_ngram else 0
        for name, depth in {"depth": cls.max_depth(plan), "guess_len": staged_guesses}.items():
            if depth > n_ctx:
                raise FieldError(name, depth, f" is deeper than the target's context (n_ctx={n_ctx}): no node lies "
                                 "past it")
        rows = cls.draft_rows(plan)
        if rows > n_ctx * n_ctx:
            grown = ("budget", "depth") if plan.shape == "best_first" and not plan.sampled else ("widths",)
            grown += ("guess_len",) if cls.needs_ngram else ()
            raise FieldError(*fields(grown), f" give the draft a scratch of {rows} rows per step, more than the "
                             f"target's context allows (n_ctx={n_ctx}: at most {n_ctx * n_ctx} rows)")

    def proposal(self, tree: Tree, copied: bool = False, **costs) -> Proposal:
        """`tree` with its rule: the plan's, or (nothing drafted, or stage 2's copy) its kind's own."""
        rule = self.plan.rule
        if copied or rule is None or len(tree) == 1:
            rule = verify.default_rule(tree.kind, self.temperature, self.proposes_chain)
        return Proposal(tree, rule, copied, **costs)

    def commit(self, keys) -> None:
        """Nothing to keep: no drafter cache."""


class AR(Method):
    """Autoregressive decoding: the target alone, one token per pass (a root-only tree)."""

    name, drafts = "ar", False
    max_depth = classmethod(lambda cls, plan: 0)
    size_fields = classmethod(lambda cls, plan: ())

    def propose(self, seq, rand) -> Proposal:
        return self.proposal(chain_tree(seq[-1], []))


class Lookup(Method):
    """Prompt lookup: the chain that followed an earlier occurrence of the last 3, 2 or 1 tokens (a copy)."""

    name, proposes_chain = "lookup", True
    max_depth = classmethod(lambda cls, plan: max(plan.lookup_chains or (plan.chain,)))
    size_fields = classmethod(lambda cls, plan: ("lookup_chains",) if plan.lookup_chains else ("chain",))

    def propose(self, seq, rand) -> Proposal:
        depth = depth_left(seq, self.n_ctx, self.max_depth(self.plan))
        lengths = self.plan.lookup_chains or (self.plan.chain,) * 3  # after matches of 3, 2 and 1 tokens
        chain = lookup_by_match(seq, [min(k, depth) for k in lengths]) if depth > 0 else []
        return self.proposal(chain_tree(seq[-1], chain))


class Ngram(Method):
    """The Katz trigram drafts a best-first tree itself (no draft model)."""

    name, needs_ngram = "ngram", True
    max_nodes = classmethod(lambda cls, plan: plan.budget)

    def propose(self, seq, rand) -> Proposal:
        depth = depth_left(seq, self.n_ctx, self.plan.depth)
        if depth <= 0:
            return self.proposal(chain_tree(seq[-1], []))
        drafter = NgramDrafter(self.ngram, seq)
        tree = build.build_best_first(seq[-1], drafter.dist_fn, self.plan.budget, depth)
        tree.source[1:] = NGRAM
        return self.proposal(tree, ngram_queries=drafter.ngram_queries)


class TreeMethod(Method):
    """A draft model's token tree: best-first (`budget` nodes at most `depth` deep) or fixed widths; children are the
    draft's top tokens, or drawn from q (`plan.sampled`)."""

    name, drafts_with = "tree", "draft"

    # Plan.widths children per level (a fixed or a drawn tree), or a best-first budget.
    fixed_widths = classmethod(lambda cls, plan: plan.shape == "fixed" or plan.sampled is not None)
    max_depth = classmethod(lambda cls, plan: len(plan.widths) if cls.fixed_widths(plan) else plan.depth)
    max_nodes = classmethod(lambda cls, plan: int(np.cumprod(plan.widths).sum()) if cls.fixed_widths(plan)
                            else plan.budget)
    size_fields = classmethod(lambda cls, plan: ("widths",) if cls.fixed_widths(plan) else ("budget",))
    tree_kind = classmethod(lambda cls, plan, temperature: {None: "deterministic", "with": "with_replacement",
                                                            "without": "without_replacement"}[plan.sampled])
    chains = classmethod(lambda cls, plan: cls.fixed_widths(plan) and set(plan.widths) == {1})
    # The root and the nodes the draft may feed (a best-first tree expands at most `budget` per level).
    draft_rows = classmethod(lambda cls, plan: (cls.max_nodes(plan) if cls.fixed_widths(plan)
                                                else plan.budget * plan.depth) + 1)

    def __init__(self, plan, n_ctx: int, temperature: float = 0.0, draft=None, top_k=None, top_p=None,
                 recorder=NO_RECORD, ngram=None):
        super().__init__(plan, n_ctx, temperature)
        self.drafter = ModelDrafter(draft, temperature, top_k, top_p, ngram=ngram, guess_len=plan.guess_len,
                                    guess_rows=plan.guess_rows, rows=self.draft_rows(plan), recorder=recorder)
        self.cache = self.drafter.cache

    def propose(self, seq, rand) -> Proposal:
        d = self.drafter
        # The draft feeds nodes up to depth - 1, in its own context.
        depth = min(depth_left(seq, self.n_ctx, self.max_depth(self.plan)), d.model.config.n_ctx - len(seq))
        if depth <= 0:
            return self.proposal(chain_tree(seq[-1], []))
        d.begin(seq, depth)
        kind = self.tree_kind(self.plan, self.temperature)
        tree = self.build(seq[-1], depth, rand if kind != "deterministic" else None, kind)
        tree.source[1:] = [d.source(path_key(tree.tokens, tree.parents, i)) for i in range(1, len(tree))]  # Fig. 3
        return self.proposal(tree, **d.costs())

    def build(self, root: int, depth: int, rand, kind: str) -> Tree:
        """The tree below `root` from the drafter's q: top tokens, or drawn with `rand` as `kind` (tree_kind) says."""
        if self.fixed_widths(self.plan):
            return build.build_fixed(root, self.drafter.dist_fn, self.plan.widths[:depth], rand=rand,
                                     replacement=kind == "with_replacement", min_q=self.plan.min_q)
        return build.build_best_first(root, self.drafter.dist_fn, self.plan.budget, depth)

    def commit(self, keys, *kept) -> None:  # kept: the target's features of the kept tokens, to a head's drafter
        self.drafter.commit(keys, *kept)


class Speculative(TreeMethod):
    """Speculative decoding: a chain of `chain` draft tokens, drawn from q when sampling."""

    name, proposes_chain = "speculative", True
    max_depth = max_nodes = classmethod(lambda cls, plan: plan.chain)
    size_fields = classmethod(lambda cls, plan: ("chain",))
    chains = classmethod(lambda cls, plan: True)
    draft_rows = classmethod(lambda cls, plan: plan.chain + 1)

    @classmethod
    def tree_kind(cls, plan, temperature: float) -> str:
        """Its chain is drawn from q when sampling or when plan.sampled asks, with replacement whatever plan.sampled
        says: one child per node is the same draw either way."""
        return "with_replacement" if plan.sampled or temperature > 0 else "deterministic"

    def build(self, root, depth, rand, kind):
        return build.build_chain(root, self.drafter.dist_fn, depth, rand=rand, min_q=self.plan.min_q)


class Staged(TreeMethod):
    """Staged decoding: a draft tree whose passes also evaluate stage 2's guesses, or, when the last three tokens
    recur, stage 2's copy of what followed them, verified with no draft pass."""

    name, needs_ngram = "staged", True
    max_block = classmethod(lambda cls, plan: max(cls.max_nodes(plan), plan.copy_len))

    @classmethod
    def size_fields(cls, plan) -> tuple:
        return super().size_fields(plan) + ("copy_len",)

    @classmethod
    def draft_rows(cls, plan) -> int:
        return super().draft_rows(plan) * (1 + plan.guess_len)  # each fed node brings stage 2's guesses

    def propose(self, seq, rand) -> Proposal:
        copy_len = min(self.plan.copy_len, self.n_ctx - len(seq) - 1)
        copy = repeat_continuation(seq, copy_len) if copy_len > 0 else []  # to the target with no draft pass
        if copy:
            return self.proposal(chain_tree(seq[-1], copy), copied=True, ngram_queries=1)
        proposal = super().propose(seq, rand)
        proposal.ngram_queries += int(copy_len > 0)  # the search for a repeat
        return proposal


class Eagle(TreeMethod):
    """EAGLE: a small head (eagle.py, passed as the draft) drafts `tree`'s trees from the target's features; the
    first step, whose pass reads the prompt, drafts nothing."""

    name, drafts_with = "eagle", "head"

    def __init__(self, plan, n_ctx: int, temperature: float = 0.0, draft=None, top_k=None, top_p=None,
                 recorder=NO_RECORD):
        Method.__init__(self, plan, n_ctx, temperature)
        self.drafter = FeatureDrafter(draft, temperature, top_k, top_p, rows=self.draft_rows(plan), recorder=recorder)
        self.cache = self.drafter.cache

    def propose(self, seq, rand) -> Proposal:
        if not self.drafter.ready(seq):
            return self.proposal(chain_tree(seq[-1], []))
        return super().propose(seq, rand)


METHODS = {cls.name: cls for cls in (AR, Speculative, TreeMethod, Staged, Ngram, Lookup, Eagle)}


def make(name: str, plan, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None,
         recorder=NO_RECORD) -> Method:
    """The method `name` under `plan`, with the models and settings it uses; its drafter reports to `recorder`."""
    cls = METHODS[name]
    models = dict(draft=draft, top_k=top_k, top_p=top_p, recorder=recorder) if cls.drafts_with else {}
    return cls(plan, target.config.n_ctx, temperature, **models, **({"ngram": ngram} if cls.needs_ngram else {}))
