"""What a decoding run did: one `Step` per target pass, built in one place (`Recorder`), and the
statistics derived from the steps (`Stats`). The decoding loop hands each step to the recorder and
does no bookkeeping of its own; the tools and the trace page (tools/trace.py) read the steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .kvcache import KVCache
from .tree import SOURCES, Tree


@dataclass
class Step:
    """What one decoding step did: the record every statistic is computed from."""

    tokens: list  # the tokens it emitted (after a cut at max_new_tokens or end-of-text)
    source: list  # per emitted token, who proposed it: an index into tree.SOURCES
    target_block: int  # rows in the target's pass: catch-up tokens and tree nodes
    draft_blocks: list  # rows in each of the draft's passes
    draft_dists: int  # the draft's rows processed into a distribution (stage 2's guesses mostly are not)
    ngram_queries: int
    seconds: tuple  # (drafting, the target's pass, verifying + compacting + emitting)
    # With keep_trees, what a trace shows (tools/trace.py); None otherwise.
    tree: Tree | None = None  # the verified tree and its accepted path
    path: list | None = None
    rule: str | None = None  # the verification rule that ran, and its checks (verify.Check)
    checks: list | None = None
    copied: bool | None = None  # the tree is stage 2's copy of a repeat (no draft pass)
    p_nodes: list | None = None  # per tree node, the target's probability of its token after its parent
    cache: tuple | None = None  # the target cache's length before the pass, catch-up rows, length after compacting
    p_rows: dict | None = None  # {node: the target's p [V] after it} where a child of node was rejected
    built_by: list | None = None  # per tree node, the draft pass (0, 1, ...) that proposed it (Proposal.built_by)


@dataclass
class Stats:
    """Totals over a run's steps. Weight traffic: bytes of weights read (every tensor once per
    forward pass) per emitted token, relative to autoregressive decoding (the paper's Table 1)."""

    steps: list = field(default_factory=list)
    target_weight_bytes: int = 0  # what one target pass reads
    draft_weight_bytes: int = 0

    target_passes = property(lambda self: len(self.steps))
    accepted = property(lambda self: [len(s.tokens) for s in self.steps])  # tokens emitted per target pass
    source = property(lambda self: [x for s in self.steps for x in s.source])
    # Emitted tokens by who proposed them, e.g. {"target": 18, "draft": 5, "ngram": 2, "copy": 103} (paper's Fig. 3).
    tally = property(lambda self: {name: self.source.count(i) for i, name in enumerate(SOURCES)})
    target_blocks = property(lambda self: [s.target_block for s in self.steps])
    draft_blocks = property(lambda self: [k for s in self.steps for k in s.draft_blocks])
    draft_passes = property(lambda self: sum(len(s.draft_blocks) for s in self.steps))
    draft_steps = property(lambda self: sum(bool(s.draft_blocks) for s in self.steps))  # steps that ran the draft
    draft_dists = property(lambda self: sum(s.draft_dists for s in self.steps))
    ngram_queries = property(lambda self: sum(s.ngram_queries for s in self.steps))
    time_draft = property(lambda self: sum(s.seconds[0] for s in self.steps))
    time_target = property(lambda self: sum(s.seconds[1] for s in self.steps))
    time_verify = property(lambda self: sum(s.seconds[2] for s in self.steps))
    target_bytes = property(lambda self: self.target_passes * self.target_weight_bytes)
    draft_bytes = property(lambda self: self.draft_passes * self.draft_weight_bytes)
    trees = property(lambda self: [(s.tree, s.path) for s in self.steps if s.tree is not None])

    @property
    def tokens_per_pass(self) -> float:
        return sum(self.accepted) / self.target_passes if self.steps else 0.0

    @property
    def weight_traffic(self) -> float:
        tokens = sum(self.accepted)
        return (self.target_bytes + self.draft_bytes) / (max(1, tokens) * self.target_weight_bytes)


@dataclass
class Result:
    tokens: list  # the new tokens (prompt excluded)
    stats: Stats
    stop_reason: str  # "eos", "max_new_tokens" or "context"
    target_cache: KVCache | None = None  # for inspection: holds the emitted sequence minus its last token
    draft_cache: KVCache | None = None


class Recorder:
    """Builds each step's `Step`: the time its phases took, what drafting cost, and with keep_trees
    what the trace shows. The phases are timed from when the step began (the previous `record`),
    when its Proposal was made and when the target's pass ended; `record(...)` closes the step."""

    def __init__(self, target_weight_bytes: int, draft_weight_bytes: int = 0, keep_trees: bool = False):
        self.stats = Stats(target_weight_bytes=target_weight_bytes, draft_weight_bytes=draft_weight_bytes)
        self.keep_trees = keep_trees
        self.began = time.perf_counter()

    def record(self, proposal, scored, verdict, tokens: list, source: list, cache_length: int) -> None:
        """One step: its Proposal (methods.py), the target's Scored pass, the rule's Verdict, the tokens
        it emitted and who proposed each, and the target cache's length after compacting."""
        t = (self.began, proposal.made, scored.made, time.perf_counter())
        tree = proposal.tree
        step = Step(tokens, source, scored.n_c + len(tree), proposal.draft_blocks, proposal.draft_dists,
                    proposal.ngram_queries, (t[1] - t[0], t[2] - t[1], t[3] - t[2]))
        if self.keep_trees:
            step.tree, step.path, step.rule, step.checks = tree, verdict.path, proposal.rule, verdict.checks
            step.copied, step.built_by = proposal.copied, proposal.built_by
            step.p_nodes = [1.0] + scored.p[tree.parents[1:], tree.tokens[1:]].tolist()
            step.cache = (scored.start, scored.n_c, cache_length)
            # Where a child was rejected, the residual the rule went on with is computed from these
            # rows (the trace page shows it); only these, as a full row is the vocabulary's size.
            rejected = {int(tree.parents[c.node]) for c in verdict.checks if c.test == "ratio" and not c.accepted}
            step.p_rows = {node: scored.p[node].copy() for node in sorted(rejected)}
        self.stats.steps.append(step)
        self.began = time.perf_counter()
