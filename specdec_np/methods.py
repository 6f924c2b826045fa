"""The decoding methods: what a step proposes to the target, and who proposed it.

A method is an object built once with its models and sampling settings (`make`), in the spirit of
Hugging Face's `CandidateGenerator` and Medusa's `generate_candidates`; the decoding loop
(`decode.generate`) asks it two things:

- `propose(seq, rand) -> Proposal`: a token tree rooted at seq[-1] (each node's proposer in
  `tree.source`), the lossless rule that verifies it (it follows from how the tree was drawn)
  and what drafting cost;
- `commit(keys)`: the accepted path's keys, so a drafter with a cache keeps only that path.

What a method is under a plan needs no model: its sizes, how its trees' children are chosen, the
rules lossless for it and its description are pure functions of (method name, plan), in the plan's terms.

| method        | class     | tree                                  | proposer            | runs the draft |
|---------------|-----------|---------------------------------------|---------------------|----------------|
| "ar"          | Plain     | the root alone                        | -                   | no             |
| "speculative" | Chain     | a chain of `chain` draft tokens       | draft               | yes            |
| "tree"        | DraftTree | best-first or fixed widths            | draft               | yes            |
| "staged"      | Staged    | as "tree", or stage 2's copy          | draft, n-gram, copy | yes            |
| "ngram"       | NgramTree | best-first over the Katz trigram      | n-gram              | no             |
| "lookup"      | Lookup    | the chain prompt lookup copies        | copy                | no             |
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import build, staged, verify
from .drafting import ModelDrafter, NgramDrafter
from .lookup import chain_tree, lookup_by_match
from .record import NO_RECORD
from .tree import DRAFT, NGRAM, Tree, path_key

METHODS = ("ar", "speculative", "tree", "staged", "ngram", "lookup")


# ----------------------------------------------------------------------------- what a method is under a plan

def runs_draft(method: str) -> bool:
    """Whether `method` runs the draft model."""
    return method in ("speculative", "tree", "staged")


def needs_ngram(method: str) -> bool:
    """Whether `method` reads the n-gram model."""
    return method in ("staged", "ngram")


def proposes_chain(method: str) -> bool:
    """Whether `method`'s trees are chains (one child per node)."""
    return method in ("speculative", "lookup")


def fixed_widths(method: str, plan) -> bool:
    """Whether `method`'s trees have plan.widths children per level (rather than a best-first budget)."""
    return method in ("tree", "staged") and (plan.shape == "fixed" or plan.sampled is not None)


def max_depth(method: str, plan) -> int:
    """The deepest node a step of `method` drafts."""
    if method == "lookup":
        return max(plan.lookup_chains or (plan.chain,))
    if method == "speculative":
        return plan.chain
    if method in ("tree", "staged"):
        return len(plan.widths) if fixed_widths(method, plan) else plan.depth
    return plan.depth if method == "ngram" else 0


def max_nodes(method: str, plan) -> int:
    """The most drafted nodes of a step's tree (its size in the target's pass, less the root)."""
    if method in ("tree", "staged"):
        return int(np.cumprod(plan.widths).sum()) if fixed_widths(method, plan) else plan.budget
    return plan.budget if method == "ngram" else max_depth(method, plan)


def max_block(method: str, plan) -> int:
    """The most tokens a step proposes to the target below the root: a tree, or stage 2's copy."""
    return max(max_nodes(method, plan), plan.copy_len if method == "staged" else 0)


def drafts(method: str, plan) -> bool:
    """Whether `method` proposes anything under `plan` (plain decoding does not)."""
    return max_nodes(method, plan) > 0


def draft_rows(method: str, plan) -> int:
    """The draft's scratch for one step, in KV cache rows: the root and the nodes it may feed (a
    best-first tree expands at most `budget` per level), each with stage 2's `guess_len` guesses."""
    best_first = method in ("tree", "staged") and not fixed_widths(method, plan)
    fed = plan.budget * plan.depth if best_first else max_nodes(method, plan)
    return (fed + 1) * (1 + (plan.guess_len if method == "staged" else 0))


def kind(method: str, plan, temperature: float) -> str:
    """How `method`'s trees' children are chosen (tree.KINDS), which decides the rules lossless on them.
    Speculative decoding draws its chain from q when sampling or when plan.sampled asks, with
    replacement whatever plan.sampled says: one child per node is the same draw either way."""
    if method == "speculative":
        return "with_replacement" if plan.sampled or temperature > 0 else "deterministic"
    sampled = plan.sampled if method in ("tree", "staged") else None
    return {None: "deterministic", "with": "with_replacement", "without": "without_replacement"}[sampled]


def lossless_rules(method: str, plan, temperature: float) -> tuple:
    """The rules (verify.RULES) plan.rule may name for `method`: lossless for how its trees are drawn
    (verify.LOSSLESS), 'greedy' only at temperature 0, 'chain' and 'block' only on chains."""
    rules = verify.LOSSLESS[kind(method, plan, temperature)][1]
    chains = proposes_chain(method) or fixed_widths(method, plan) and set(plan.widths) == {1}
    return tuple(r for r in rules if (r != "greedy" or temperature == 0) and (chains or r not in verify.CHAIN_RULES))


def check_rule(method: str, plan, temperature: float) -> None:
    """A ValueError, before any work, when plan.rule is not lossless for the trees `method` drafts
    under `plan` (the pairing `decode.accept` would refuse at the first step; verify.check_pairing)."""
    rule, allowed = plan.rule, lossless_rules(method, plan, temperature)
    if rule is None or rule in allowed or not drafts(method, plan):  # drafting nothing needs no rule
        return
    if rule == "greedy":  # not allowed: temperature > 0
        raise ValueError("plan: rule 'greedy' keeps the target's argmax, which is sampling only at "
                         f"temperature 0; at temperature {temperature} leave rule None (the rule the "
                         "tree's drafting needs)")
    if method == "speculative" and plan.sampled == "without":
        raise ValueError(f"plan: rule {rule!r} is not lossless for speculative's chain: it is drawn from q with "
                         f"replacement whatever sampled says (one child per node is the same draw); lossless: "
                         f"{', '.join(allowed)}")
    verify.check_pairing(kind(method, plan, temperature), rule)
    raise ValueError(f"rule {rule!r} verifies a chain: use method 'speculative', or widths of 1")


def words(plan, fields) -> str:
    """Plan fields as the messages name them, e.g. "budget=8, widths=2,2,1" (the CLI maps each to its option)."""
    values = [getattr(plan, name) for name in fields]
    return ", ".join(f"{name}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
                     for name, v in zip(fields, values))


def size_words(method: str, plan) -> str:
    """The plan fields that set how many tokens a step of `method` proposes, first the tree's, e.g.
    "budget=8, copy_len=12"."""
    tree = {"ar": (), "speculative": ("chain",), "ngram": ("budget",),
            "lookup": ("lookup_chains",) if plan.lookup_chains else ("chain",)}.get(method)
    if tree is None:
        tree = ("widths",) if fixed_widths(method, plan) else ("budget",)
    return words(plan, tree + (("copy_len",) if method == "staged" else ()))


def check_size(method: str, plan, n_ctx: int) -> None:
    """A ValueError naming the plan fields at fault, before any allocation, when a step of `method`
    outgrows a context of `n_ctx`: the target's block (its tree, or stage 2's copy); a depth (no node
    lies past the context); or the draft's scratch (draft_rows), at most n_ctx rows per position."""
    if max_block(method, plan) > n_ctx:
        raise ValueError(f"plan: up to {max_block(method, plan)} tokens per step ({size_words(method, plan)}) "
                         f"exceed the target's context (n_ctx={n_ctx})")
    # The other fields that set a depth (widths, chain, lookup_chains) size the block too.
    depths = {"depth": max_depth(method, plan), "guess_len": plan.guess_len if method == "staged" else 0}
    for name, depth in depths.items():
        if depth > n_ctx:
            raise ValueError(f"plan: {name}={depth} is deeper than the target's context (n_ctx={n_ctx}): "
                             "no node lies past it")
    rows = draft_rows(method, plan)
    if runs_draft(method) and rows > n_ctx * n_ctx:
        grown = ("widths",) if fixed_widths(method, plan) else ("budget", "depth")
        if method == "staged":
            grown += ("guess_len",)
        raise ValueError(f"plan: {words(plan, grown)} give the draft a scratch of {rows} rows per step, more than "
                         f"the target's context allows (n_ctx={n_ctx}: at most {n_ctx * n_ctx} rows)")


def describe(method: str, plan) -> str:
    """`plan` in words, as `method` uses it."""
    rule = f"; {plan.rule} verification" if plan.rule in ("block", "traversal") else ""  # the others are defaults
    if not drafts(method, plan):
        return "plain decoding (no drafts)"
    if method == "lookup" and plan.lookup_chains:
        k3, k2, k1 = plan.lookup_chains
        return f"a chain copied from the context, {k3} tokens after a match of 3, {k2} after 2, {k1} after 1" + rule
    if proposes_chain(method):
        return f"a chain of {plan.chain}" + (" copied from the context" if method == "lookup" else "") + rule
    widths = ",".join(map(str, plan.widths))
    if plan.sampled and fixed_widths(method, plan):
        text = f"widths {widths} drawn from the draft ({plan.sampled} replacement)"
    elif fixed_widths(method, plan):
        text = f"the draft's top tokens, widths {widths}"
    else:
        text = f"best-first, {plan.budget} nodes at most {plan.depth} deep"
    if method == "staged":
        guesses = (f"n-gram guesses {plan.guess_len} deep ({plan.guess_rows} rows)" if plan.guess_len
                   else "no n-gram guesses")
        text += f"; {guesses}; " + (f"copies of {plan.copy_len}" if plan.copy_len else "no copies")
    return text + rule


# ----------------------------------------------------------------------------- the methods

@dataclass
class Proposal:
    """One step's tree and what the loop needs to know about it."""

    tree: Tree  # node 0 = seq[-1]; tree.source says who proposed each node
    rule: str  # the verification rule for it (verify.RULES)
    copied: bool = False  # stage 2's copy of a repeat (no draft pass)
    draft_blocks: list = field(default_factory=list)  # rows of each draft pass it took
    draft_dists: int = 0  # draft rows processed into q
    ngram_queries: int = 0
    made: float = field(default_factory=time.perf_counter)  # when drafting ended (the recorder times phases)


def root_only(seq) -> Tree:
    """The tree of a step that drafts nothing: the root seq[-1] alone."""
    return Tree([seq[-1]], [-1], [1.0])


def room(seq, n_ctx: int, depth: int) -> int:
    """How deep a step's tree may go: a node at depth d sits at position len(seq) - 1 + d < n_ctx."""
    return min(depth, n_ctx - len(seq) - 1)


class Method:
    """What every method holds (each subclass sets its `name`): the plan, the temperature, the target's
    context (which bounds its trees), the n-gram; `commit` keeps nothing unless a drafter has a cache."""

    cache = None  # the drafter's KV cache, if any (decode returns it for inspection)

    def __init__(self, plan, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None,
                 recorder=NO_RECORD):
        self.plan, self.temperature, self.n_ctx, self.ngram = plan, temperature, target.config.n_ctx, ngram

    def proposal(self, tree: Tree, copied: bool = False, **costs) -> Proposal:
        """`tree` with its rule: the plan's, or (nothing drafted, or stage 2's copy) its kind's own."""
        rule = self.plan.rule
        if copied or rule is None or len(tree) == 1:
            rule = verify.default_rule(tree.kind, self.temperature, proposes_chain(self.name))
        return Proposal(tree, rule, copied, **costs)

    def commit(self, keys) -> None:
        """Nothing to keep: no drafter cache."""


class Plain(Method):
    """Autoregressive decoding: the target alone, one token per pass (a root-only tree)."""

    name = "ar"

    def propose(self, seq, rand) -> Proposal:
        return self.proposal(root_only(seq))


class Lookup(Method):
    """Prompt lookup: the chain that followed an earlier occurrence of the last 3, 2 or 1 tokens (a copy)."""

    name = "lookup"

    def propose(self, seq, rand) -> Proposal:
        depth = room(seq, self.n_ctx, max_depth(self.name, self.plan))
        lengths = self.plan.lookup_chains or (self.plan.chain,) * 3  # after matches of 3, 2 and 1 tokens
        chain = lookup_by_match(seq, [min(k, depth) for k in lengths]) if depth > 0 else []
        return self.proposal(chain_tree(seq[-1], chain))


class NgramTree(Method):
    """The Katz trigram drafts a best-first tree itself (no draft model)."""

    name = "ngram"

    def propose(self, seq, rand) -> Proposal:
        depth = room(seq, self.n_ctx, self.plan.depth)
        if depth <= 0:
            return self.proposal(root_only(seq))
        drafter = NgramDrafter(self.ngram, seq)
        tree = build.build_best_first(seq[-1], drafter.dist_fn, self.plan.budget, depth)
        tree.source[1:] = NGRAM
        return self.proposal(tree, ngram_queries=drafter.ngram_queries)


class DraftTree(Method):
    """A draft model's token tree: best-first (`budget` nodes at most `depth` deep) or fixed widths;
    children are the draft's top tokens, or drawn from q (`plan.sampled`)."""

    name = "tree"

    def __init__(self, plan, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None,
                 recorder=NO_RECORD):
        super().__init__(plan, target, draft, ngram, temperature)
        self.drafter = ModelDrafter(draft, temperature, top_k, top_p, ngram=ngram if needs_ngram(self.name) else None,
                                    guess_len=plan.guess_len, guess_rows=plan.guess_rows,
                                    rows=draft_rows(self.name, plan), recorder=recorder)
        self.cache = self.drafter.cache

    def propose(self, seq, rand) -> Proposal:
        d = self.drafter
        # The draft feeds nodes up to depth - 1, in its own context.
        depth = min(room(seq, self.n_ctx, max_depth(self.name, self.plan)), d.model.config.n_ctx - len(seq))
        if depth <= 0:
            return self.proposal(root_only(seq))
        d.begin(seq, depth)
        drawn = kind(self.name, self.plan, self.temperature) != "deterministic"
        tree = self.build(seq[-1], depth, rand if drawn else None)
        keys = [path_key(tree.tokens, tree.parents, i) for i in range(len(tree))]
        # The paper's Fig. 3 credit: stage 2 for a node it guessed (and the draft kept), else the draft.
        tree.source[1:] = [d.guessed.get(k, DRAFT) for k in keys[1:]]
        return self.proposal(tree, draft_blocks=d.block_sizes, draft_dists=d.dists, ngram_queries=d.ngram_queries)

    def build(self, root: int, depth: int, rand) -> Tree:
        """The tree below `root` from the drafter's q (children drawn with `rand`, or top tokens)."""
        if fixed_widths(self.name, self.plan):
            return build.build_fixed(root, self.drafter.dist_fn, self.plan.widths[:depth], rand=rand,
                                     replacement=self.plan.sampled != "without")
        return build.build_best_first(root, self.drafter.dist_fn, self.plan.budget, depth)

    def commit(self, keys) -> None:
        self.drafter.commit(keys)


class Chain(DraftTree):
    """Speculative decoding: a chain of `chain` draft tokens, drawn from q when sampling."""

    name = "speculative"

    def build(self, root, depth, rand):
        return build.build_chain(root, self.drafter.dist_fn, depth, rand=rand)


class Staged(DraftTree):
    """Staged decoding: a draft tree whose passes also evaluate stage 2's guesses, or, when the last
    three tokens recur, stage 2's copy of what followed them, verified with no draft pass."""

    name = "staged"

    def propose(self, seq, rand) -> Proposal:
        copy_len = min(self.plan.copy_len, self.n_ctx - len(seq) - 1)
        if copy_len <= 0:
            return super().propose(seq, rand)
        copy = staged.copied_chain(seq, copy_len)
        if copy is not None:
            return self.proposal(copy, copied=True, ngram_queries=1)
        proposal = super().propose(seq, rand)
        proposal.ngram_queries += 1  # the search for a repeat
        return proposal


CLASSES = {cls.name: cls for cls in (Plain, Chain, DraftTree, Staged, NgramTree, Lookup)}


def make(name: str, plan, target, draft=None, ngram=None, temperature=0.0, top_k=None, top_p=None,
         recorder=NO_RECORD):
    """The method `name` under `plan`, with its models and sampling settings, ready to propose; its
    drafter reports its passes to `recorder` (record.py)."""
    return CLASSES[name](plan, target, draft, ngram, temperature, top_k, top_p, recorder)
