"""What a decoding run did: one `Step` per target pass, built in one place (`Recorder`), and the statistics derived
from the steps (`Stats`). With keep_trees a step also keeps what a trace (tools/trace.py) shows (`Trace`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .kvcache import KVCache
from .sampling import certain
from .tree import DRAFT, NGRAM, SOURCES, TARGET, Tree, children
from .verify import Check


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
    trace: Trace | None = None  # with keep_trees, what a trace shows (tools/trace.py); None otherwise


@dataclass
class DraftPass:
    """One forward pass of the draft model, as the drafter reports it (by default to `NO_RECORD`)."""

    keys: list  # the nodes it fed, as path keys (() is the root)
    source: list  # who proposed each (tree.SOURCES): DRAFT for the builder's, NGRAM or COPY for stage 2's guesses
    rows: int  # its rows: first the catch-up tokens the cache lacked


@dataclass
class Trace:
    """What a trace shows of a step, kept with keep_trees."""

    tree: Tree  # the verified tree (tree.source: who proposed each node)
    path: list  # its accepted path, root first
    rule: str  # the verification rule that ran
    checks: list  # the rule's tests in the order it made them (verify.Check)
    copied: bool  # the tree is stage 2's copy of a repeat (no draft pass)
    passes: list  # the step's draft passes (DraftPass), in order
    p_nodes: list  # per tree node, the target's probability of its token after its parent
    cache: tuple  # the target cache's length before the pass, catch-up rows, length after compacting
    p_rows: dict  # {node: the target's p [V] after it} where a child of node was rejected


@dataclass
class Stats:
    """Totals over a run's steps. Weight traffic: bytes of weights read per emitted token, relative to
    autoregressive decoding (the paper's Table 1)."""

    steps: list = field(default_factory=list)
    target_weight_bytes: int = 0  # what one target pass reads
    draft_weight_bytes: int = 0

    target_passes = property(lambda self: len(self.steps))
    accepted = property(lambda self: [len(s.tokens) for s in self.steps])  # tokens emitted per target pass
    source = property(lambda self: [x for s in self.steps for x in s.source])
    # Emitted tokens by who proposed them, {"target": n, "draft": n, "ngram": n, "copy": n} (the paper's Fig. 3).
    tally = property(lambda self: {name: self.source.count(i) for i, name in enumerate(SOURCES)})
    # Emitted tokens by PARTS: stage 2's guesses for the draft apart from its copies sent to the target.
    parts = property(lambda self: tokens_by_part(self.steps))
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
    trees = property(lambda self: [(s.trace.tree, s.trace.path) for s in self.steps if s.trace is not None])
    tokens_per_pass = property(lambda self: sum(self.accepted) / self.target_passes if self.steps else 0.0)
    weight_traffic = property(lambda self: (self.target_bytes + self.draft_bytes)
                              / (max(1, sum(self.accepted)) * self.target_weight_bytes))


# Where emitted tokens came from, the parts of a speedup apart: the draft's; stage 2's guesses the draft kept, the
# trigram's or a copy of a repeat (each saves the draft a pass); copies of a repeat sent to the target with no draft
# pass (stage 2's copied chains, prompt lookup); the target's own token ending each step.
PARTS = ("draft", "ngram_guess", "copy_guess", "copied", "target")


def tokens_by_part(steps) -> dict:
    """Emitted tokens by `PARTS`: a COPY token is copied in a step that ran no draft pass, a guess in one that did. The
    method `ngram` (the trigram drafting alone) counts its tokens as ngram_guess."""
    out = dict.fromkeys(PARTS, 0)
    for s in steps:
        for src in s.source:
            out["target" if src == TARGET else "draft" if src == DRAFT else "ngram_guess" if src == NGRAM
                else "copy_guess" if s.draft_blocks else "copied"] += 1
    return out


@dataclass
class Result:
    tokens: list  # the new tokens (prompt excluded)
    stats: Stats
    stop_reason: str  # "eos", "stop", "max_new_tokens" or "context"
    target_cache: KVCache | None = None  # for inspection: holds the emitted sequence minus its last token
    draft_cache: KVCache | None = None


class Uniforms:
    """A random generator noting the uniform numbers it gave in a step, for the trace."""

    def __init__(self, rng):
        self.rng, self.given = rng, []

    def random(self) -> float:
        self.given.append(float(self.rng.random()))
        return self.given[-1]


class Recorder:
    """Builds each step's `Step`: its phases' times (`lap`), what drafting cost, and with keep_trees what the drafter
    reported (`draft_pass`) and the tests in the rule's Verdict; `record(...)` closes the step."""

    def __init__(self, target_weight_bytes: int, draft_weight_bytes: int = 0, keep_trees: bool = False):
        self.stats = Stats(target_weight_bytes=target_weight_bytes, draft_weight_bytes=draft_weight_bytes)
        self.keep_trees, self.passes, self.uniforms = keep_trees, [], None
        self.times = [time.perf_counter()]  # when this step began, then when each of its phases ended

    def lap(self, done):
        """`done` (what a phase made: the Proposal, the target's Scored pass), noting when the phase ended."""
        self.times.append(time.perf_counter())
        return done

    def watch(self, rand):
        """`rand`, with keep_trees drawing through `Uniforms` (the same numbers) so each test shows its u; a
        stand-in without a generator (the exact enumerator's) is returned as it is."""
        if not self.keep_trees or not hasattr(rand, "rng"):
            return rand
        watched = copy.copy(rand)
        watched.rng = self.uniforms = Uniforms(rand.rng)
        return watched

    def draft_pass(self, keys: list, source: list, rows: int) -> None:
        """A drafter ran a pass over `rows` rows feeding the nodes `keys` (DraftPass)."""
        if self.keep_trees:
            self.passes.append(DraftPass(list(keys), list(source), int(rows)))

    def record(self, proposal, scored, verdict, tokens: list, source: list, cache_length: int) -> None:
        """One step: its Proposal (methods.py), the target's Scored pass, the rule's Verdict, the tokens it emitted
        and who proposed each, and the target cache's length after compacting."""
        t = (*self.times[:3], time.perf_counter())
        tree = proposal.tree
        step = Step(tokens, source, scored.n_c + len(tree), proposal.draft_blocks, proposal.draft_dists,
                    proposal.ngram_queries, (t[1] - t[0], t[2] - t[1], t[3] - t[2]))
        if self.keep_trees:
            checks = argmax_tests(tree, scored.p, verdict) if proposal.rule == "greedy" else self.with_u(verdict.tests)
            # Where a child was rejected, the trace page shows the residual the rule went on with, from these rows
            # (only these: a row is the vocabulary's size).
            rejected = {int(tree.parents[c.node]) for c in checks if c.test == "ratio" and not c.accepted}
            p_nodes = [1.0] + scored.p[tree.parents[1:], tree.tokens[1:]].tolist()
            step.trace = Trace(tree, verdict.path, proposal.rule, checks, proposal.copied, self.passes, p_nodes,
                               (scored.start, scored.n_c, cache_length),
                               {node: scored.p[node].copy() for node in sorted(rejected)})
        self.stats.steps.append(step)
        self.times, self.passes = [time.perf_counter()], []
        if self.uniforms is not None:
            self.uniforms.given = []

    def with_u(self, tests: list) -> list:
        """The rule's tests, each coin's with the uniform number u that decided it. Verifying is a step's last use of
        randomness, and Rand draws one number per draw and one per coin not `certain`: the step's last numbers."""
        if self.uniforms is None:
            return list(tests)
        drew = [c.test == "draw" or certain(c.value) is None for c in tests]
        numbers = iter(self.uniforms.given[len(self.uniforms.given) - sum(drew):])
        u = [next(numbers) if d else None for d in drew]
        return [c if c.test == "draw" else replace(c, u=x) for c, x in zip(tests, u)]


NO_RECORD = Recorder(0)  # the recorder a drafter reports to by default: it keeps nothing (keep_trees False)


def argmax_tests(tree: Tree, p, verdict) -> list:
    """Greedy's tests, from p [n, V] and the path: each child on it against the argmax, then the argmax after it."""
    tests = []
    for node in verdict.path:
        best, kids = int(np.argmax(p[node])), children(tree, node)
        tests += [Check(int(c), int(x), "argmax", float(best), bool(x == best), float(p[node, x]))
                  for c, x in zip(kids, tree.tokens[kids])]
    return tests + [Check(int(node), int(verdict.token), "draw", 1.0, not kids.size)]
