"""The decoding loop: autoregressive, speculative (chain), tree and staged decoding in one loop.

Each step: a drafter proposes a token tree rooted at the last emitted token (`propose`); the target
scores every node in one tree-masked pass (`verify_pass`); a lossless rule accepts a root-to-node
path and adds one target token (`accept`); both KV caches keep only the accepted path (`compact`).
Autoregressive decoding is the same loop with a root-only tree. How the tree is shaped, what stage
2 does and which rule verifies travel in one `Plan`, whose defaults are constants: the output is a
function of the arguments only. The tools (`specdec_np.tools`) measure a machine and pass in the
plan that is fastest there.

Stopping: at `<|endoftext|>` (emitted, then stop), at `max_new_tokens` (a longer accepted path is
cut), or when the sequence fills the target's context (`stop_reason == "context"`).
"""

from __future__ import annotations

import dataclasses
import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from . import build, staged, verify
from .drafting import ModelDrafter, ngram_dist_fn
from .fastpath import padded
from .gpt2 import GPT2, forward
from .kvcache import KVCache
from .ngram import Trigram
from .sampling import Rand, check_settings, process
from .tree import NGRAM, TARGET, Tree, block, path_key

METHODS = ("ar", "speculative", "tree", "staged", "ngram", "lookup")
NEVER = "never"  # generate(..., eos=NEVER): decode up to max_new_tokens, whatever tokens are emitted
DRAFTED = ("speculative", "tree", "staged")  # the methods that run the draft model
CHAINS = ("speculative", "lookup")  # the methods whose tree is a chain of `chain` (or lookup_chains) tokens


def integral(value) -> bool:
    """Whether value is an integer (a bool is not one here)."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


def whole(value, low: int) -> bool:
    """Whether value is an integer >= low."""
    return integral(value) and value >= low


def whole_tuple(value, low: int) -> tuple | None:
    """A list or tuple of integers >= low as a tuple of ints; None if it is anything else."""
    if not isinstance(value, (list, tuple)) or not all(whole(v, low) for v in value):
        return None
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class Plan:
    """How to decode: the draft tree's shape, stage 2's work, the verification rule, block padding.

    shape: "best_first" (the `budget` drafted nodes of highest cumulative draft probability, at most
      `depth` deep; cf. EAGLE-2) or "fixed" (`widths[d]` children under every node at depth d).
      Trees whose children are drawn from q (`sampled`) always have fixed widths.
    chain: drafted tokens per step of the chain methods (speculative, lookup).
    lookup_chains: prompt lookup's chain length by the match it copies from: (after the last 3
      tokens matched, after 2, after 1); 0 proposes nothing after a match that short (one token
      is weak evidence, and a one-row pass is cheap). () = `chain` after any match.
    sampled: None (children are the draft's top tokens) or "with" / "without" replacement
      (children drawn from q: at temperature 1 they are accepted far more often than top tokens).
    guess_len, guess_rows: stage 2 for the draft (staged): below each node the draft evaluates, the
      n-gram guesses `guess_len` levels, evaluated in the same pass, at most `guess_rows` guessed
      nodes per pass ("pad": as many as fill the rows a padded pass computes anyway); 0: none.
    copy_len: stage 2 for the target (staged): when the last three tokens occurred earlier, the
      step verifies the `copy_len` tokens that followed them, with no draft pass; 0: never.
    rule: the verification rule (verify.RULES); None: greedy at temperature 0, else the lossless
      rule the tree's construction assumes.
    target_pad, draft_pad: block sizes to compute passes of 1, 2, ... rows as (padding[k - 1] >= k;
      a measured cost curve can make a larger block cheaper); () = unpadded.
    """

    shape: str = "best_first"
    budget: int = 8
    depth: int = 6
    widths: tuple = (2, 2, 1, 1, 1, 1)
    chain: int = 4
    lookup_chains: tuple = ()
    sampled: str | None = None
    guess_len: int = 3
    guess_rows: int | str = 4
    copy_len: int = 12
    rule: str | None = None
    target_pad: tuple = ()
    draft_pad: tuple = ()

    def __post_init__(self):
        def integer(name, low):
            value = getattr(self, name)
            if not whole(value, low):
                raise ValueError(f"plan: {name} must be an integer >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))

        if self.shape not in ("best_first", "fixed"):
            raise ValueError(f"plan: shape must be 'best_first' or 'fixed', got {self.shape!r}")
        for name, low in (("budget", 1), ("depth", 1), ("chain", 1), ("guess_len", 0), ("copy_len", 0)):
            integer(name, low)
        widths = whole_tuple(self.widths, 1)
        if not widths:
            raise ValueError(f"plan: widths must be a non-empty list of integers >= 1, got {self.widths!r}")
        object.__setattr__(self, "widths", widths)
        chains = whole_tuple(self.lookup_chains, 0)
        if chains is None or (chains and (len(chains) != 3 or not any(chains))):
            raise ValueError("plan: lookup_chains must be () or 3 integers >= 0 (after matches of 3, 2, 1 tokens), "
                             f"not all 0, got {self.lookup_chains!r}")
        object.__setattr__(self, "lookup_chains", chains)
        if self.sampled not in (None, "with", "without"):
            raise ValueError(f"plan: sampled must be None, 'with' or 'without', got {self.sampled!r}")
        if self.guess_rows != "pad":
            integer("guess_rows", 0)
        if self.rule is not None and self.rule not in verify.RULES:
            raise ValueError(f"plan: unknown rule {self.rule!r}: choose one of {', '.join(verify.RULES)}")
        for name in ("target_pad", "draft_pad"):
            pad = whole_tuple(getattr(self, name), 1)
            if pad is None:
                raise ValueError(f"plan: {name} must be a list of integers >= 1 (block sizes), got "
                                 f"{getattr(self, name)!r}")
            if any(size < k for k, size in enumerate(pad, 1)):
                raise ValueError(f"plan: {name}[k - 1] must be >= k (a block is padded, never cut), got {pad}")
            object.__setattr__(self, name, pad)

    def fixed(self, method: str) -> bool:
        """Whether the draft tree of `method` has fixed widths (sampled trees always do)."""
        return method in ("tree", "staged") and (self.shape == "fixed" or self.sampled is not None)

    def lookup_lengths(self) -> tuple:
        """Prompt lookup's chain lengths after matches of 3, 2 and 1 tokens."""
        return self.lookup_chains or (self.chain,) * 3

    def max_depth(self, method: str) -> int:
        if method == "lookup":
            return max(self.lookup_lengths())
        if method == "speculative":
            return self.chain
        return len(self.widths) if self.fixed(method) else self.depth

    def max_nodes(self, method: str) -> int:
        """The most drafted nodes a step's tree can have (its size in the target's pass, less the root)."""
        if method == "ar":
            return 0
        if method in CHAINS:
            return self.max_depth(method)
        return int(np.cumprod(self.widths).sum()) if self.fixed(method) else self.budget

    def max_block(self, method: str) -> int:
        """The most tokens a step proposes to the target: its tree's, or stage 2's copy (staged)."""
        return max(self.max_nodes(method), self.copy_len if method == "staged" else 0)


@dataclass
class Step:
    """What one decoding step did: the record every statistic is computed from."""

    tokens: list  # the tokens it emitted (after a cut at max_new_tokens or end-of-text)
    source: list  # per emitted token, who proposed it: an index into tree.SOURCES
    target_block: int  # rows in the target's pass: catch-up tokens and tree nodes
    draft_blocks: list  # rows in each of the draft's passes
    draft_dists: int  # the draft's rows processed into a distribution (stage 2's guesses mostly are not)
    ngram_queries: int
    seconds: tuple  # (drafting, the target's pass, verifying, compacting and emitting)
    # With keep_trees, what a trace shows (tools/trace.py); None otherwise.
    tree: Tree | None = None  # the verified tree and its accepted path
    path: list | None = None
    rule: str | None = None  # the verification rule that ran, and its checks (verify.Check)
    checks: list | None = None
    proposers: list | None = None  # per tree node, who proposed it (credited as emitted tokens are)
    copied: bool | None = None  # the tree is stage 2's copy of a repeat (no draft pass)
    p_nodes: list | None = None  # per tree node, the target's probability of its token after its parent
    cache: tuple | None = None  # the target cache's length before the pass, catch-up rows, length after compacting


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


def generate(target: GPT2, prompt, max_new_tokens: int = 64, method: str = "ar", draft: GPT2 | None = None,
             ngram=None, plan: Plan | None = None, temperature: float = 0.0, top_k=None, top_p=None,
             seed: int = 0, rand=None, eos: int | None = None, keep_trees: bool = False) -> Result:
    """Decode up to `max_new_tokens` after `prompt` (token ids) and return the new tokens with statistics.

    method: "ar" (target alone), "speculative" (a draft chain), "tree" (a draft token tree),
      "staged" (a draft tree speculated by the n-gram, which also copies repeats to the target),
      "ngram" (the n-gram drafts the tree itself), "lookup" (prompt lookup's chain, no model).
    plan: the tree's shape, stage 2 and the rule (`Plan()`'s constants by default).
    temperature, top_k, top_p: the target distribution to sample from; 0 = greedy.
    rand: the source of randomness (`sampling.Rand`; the exact enumerator passes its own);
      default `Rand(seed)`. At temperature > 0 speculative draws its chain from q unless
      plan.sampled says otherwise (classic speculative sampling).
    eos: the end-of-text id (default: the last vocabulary id, GPT-2's `<|endoftext|>`), or NEVER
      to decode up to max_new_tokens whatever is emitted.
    keep_trees: keep each step's verified tree and path in `stats.steps` (for display).
    """
    plan = Plan() if plan is None else plan
    prompt = check_inputs(target, prompt, max_new_tokens, method, draft, ngram, plan, temperature, top_k, top_p, seed,
                          eos)
    if method == "speculative" and temperature > 0 and plan.sampled is None:
        plan = dataclasses.replace(plan, sampled="with")  # classic speculative sampling
    rand = Rand(seed) if rand is None else rand
    eos = target.config.n_vocab - 1 if eos is None else None if eos == NEVER else int(eos)
    drafter = None
    if method in DRAFTED:
        # Best-first expands at most `budget` nodes per level; other trees expand fewer than they hold.
        expanded = plan.max_nodes(method) if plan.fixed(method) or method == "speculative" else plan.budget * plan.depth
        drafter = ModelDrafter(draft, temperature, top_k, top_p, ngram=ngram if method == "staged" else None,
                               guess_len=plan.guess_len, guess_rows=plan.guess_rows, max_nodes=expanded,
                               pad=plan.draft_pad)
    copy_len = plan.copy_len if method == "staged" else 0
    widest = plan.max_block(method) + 1  # the most rows a step's tree feeds the target (root included)
    cache = KVCache(target.config, dtype=target.dtype, max_block=padded(plan.target_pad, widest))
    stats = Stats(target_weight_bytes=target.weight_bytes, draft_weight_bytes=draft.weight_bytes if drafter else 0)
    seq, new, stop = list(prompt), [], "max_new_tokens"
    while len(new) < max_new_tokens and stop == "max_new_tokens":
        if len(seq) >= target.config.n_ctx:
            stop = "context"
            break
        t0, queries = time.perf_counter(), ngram_queries(drafter)
        passes, dists = (len(drafter.block_sizes), drafter.dists) if drafter else (0, 0)
        # A draft tree rooted at seq[-1], or stage 2's copy of a repeat (then no draft pass).
        tree, copied, step_queries = propose(method, seq, plan, copy_len, target.config.n_ctx, drafter, ngram, rand)
        t1 = time.perf_counter()
        # The target scores every node in one tree-masked pass: p[i] follows node i.
        p, start, n_c = verify_pass(target, cache, seq, tree, plan.target_pad, temperature, top_k, top_p)
        t2 = time.perf_counter()
        # A lossless rule keeps a root-to-node path and draws one more token from the target.
        # The plan's rule verifies the drafts it was chosen for; stage 2's copies, and a tree with
        # nothing drafted (at the end of the context), take the rule their own kind needs.
        own = copied or plan.rule is None or len(tree) == 1
        rule = default_rule(method, temperature, tree.kind) if own else plan.rule
        checks = [] if keep_trees else None
        path, token = accept(tree, p, rule, rand, checks)
        # Both caches keep only the accepted path, in contiguous slots.
        keys = compact(cache, start, n_c, tree, path, None if copied else drafter)
        tokens, source, stop = emit(tree, path, token, keys, method, copied, drafter, max_new_tokens - len(new), eos)
        new += tokens
        seq += tokens
        t3 = time.perf_counter()
        step = Step(tokens, source, n_c + len(tree), drafter.block_sizes[passes:] if drafter else [],
                    drafter.dists - dists if drafter else 0, step_queries + ngram_queries(drafter) - queries,
                    (t1 - t0, t2 - t1, t3 - t2))
        if keep_trees:
            step.tree, step.path, step.rule, step.checks, step.copied = tree, path, rule, checks, copied
            step.proposers = [TARGET] + [proposer(path_key(tree.tokens, tree.parents, i), method, copied, drafter)
                                         for i in range(1, len(tree))]
            step.p_nodes = [1.0] + p[tree.parents[1:], tree.tokens[1:]].tolist()
            step.cache = (start, n_c, cache.length)
        stats.steps.append(step)
    # A path cut by max_new_tokens/eos may have left unemitted tokens in the caches: drop them.
    cache.truncate(min(cache.length, len(seq) - 1))
    if drafter:
        drafter.cache.truncate(min(drafter.cache.length, len(seq) - 1))
    return Result(new, stats, stop, cache, drafter.cache if drafter else None)


def propose(method, seq, plan: Plan, copy_len: int, n_ctx: int, drafter, ngram, rand) -> tuple[Tree, bool, int]:
    """The step's tree, whether it is stage 2's copy, and the n-gram queries spent outside the drafter."""
    room = n_ctx - len(seq) - 1  # a node at depth d sits at position len(seq) - 1 + d < n_ctx
    queries = 0
    if copy_len and room > 0:  # stage 2 looks for a repeat to copy straight to the target
        copied, queries = staged.copied_chain(seq, min(copy_len, room)), 1
        if copied is not None:
            return copied, True, queries
    root, depth = seq[-1], min(plan.max_depth(method), room)
    if drafter is not None:
        depth = min(depth, drafter.model.config.n_ctx - len(seq))  # the draft feeds nodes up to depth - 1
    if method == "ar" or depth <= 0:
        return Tree(tokens=[root], parents=[-1], q=[1.0]), False, queries
    if method == "lookup":  # prompt lookup's chain (a match of 3, 2 or 1 tokens), proposed by no model
        lengths = [min(k, depth) for k in plan.lookup_lengths()]
        return staged.chain_tree(root, staged.lookup_by_match(seq, lengths)), False, queries
    if method == "ngram":
        counter = [0]
        tree = build.build_best_first(root, ngram_dist_fn(ngram, seq, counter), plan.budget, depth)
        return tree, False, queries + counter[0]
    drafter.begin(seq, depth)
    r = rand if plan.sampled else None
    if method == "speculative":
        return build.build_chain(root, drafter.dist_fn, depth, rand=r), False, queries
    if plan.fixed(method):
        tree = build.build_fixed(root, drafter.dist_fn, plan.widths[:depth], rand=r, replacement=plan.sampled != "without")
    else:
        tree = build.build_best_first(root, drafter.dist_fn, plan.budget, depth)
    return tree, False, queries


def verify_pass(target: GPT2, cache: KVCache, seq, tree: Tree, pad=(), temperature=0.0, top_k=None, top_p=None):
    """The target's processed distribution after every tree node [n, V], from one forward pass that
    also feeds the committed tokens its cache lacks. Returns (p, start, n_catch_up): the block began
    at slot `start`, so `compact` can keep the accepted path afterwards."""
    start = cache.length
    tokens, positions, mask, n_c = block(seq, start, tree.tokens, tree.parents)
    logits = forward(target, tokens, cache, positions=positions, mask=mask, pad_to=padded(pad, len(tokens)),
                     logits_from=n_c)  # [len(tree), V]
    return process(logits, temperature, top_k, top_p), start, n_c


def accept(tree: Tree, p, rule: str, rand, log=None):
    """(path, next token): the rule's accepted root-to-node path and the target's token after it;
    with a list as `log`, the rule's checks (verify.Check) are appended to it."""
    verify.check_tree(tree, rule)
    return verify.RULES[rule](tree, p, rand, log)


def compact(cache: KVCache, start: int, n_c: int, tree: Tree, path, drafter) -> list[tuple]:
    """Keep the catch-up rows and the accepted path in the target's cache (and the drafter's);
    returns the accepted nodes' path keys. After a copied step (no drafter) the draft's next pass
    feeds what it missed as catch-up rows."""
    cache.keep(start, np.concatenate([np.arange(n_c), n_c + np.asarray(path, dtype=np.int64)]))
    keys = [path_key(tree.tokens, tree.parents, node) for node in path[1:]]
    if drafter is not None:
        drafter.commit(keys)
    return keys


def emit(tree: Tree, path, token, keys, method, copied, drafter, room: int, eos: int | None):
    """The tokens the step emits (at most `room`, up to an end-of-text `eos` unless it is None), who
    proposed each, and the stop reason ("max_new_tokens" while there is room left)."""
    tokens = verify.emitted(tree, path, token)
    source = [proposer(k, method, copied, drafter) for k in keys] + [TARGET]
    stop = "max_new_tokens"
    if eos is not None and eos in tokens[:room]:
        room, stop = tokens.index(eos) + 1, "eos"
    return tokens[:room], source[:room], stop


def proposer(key: tuple, method, copied, drafter) -> int:
    """Who proposed the drafted node at path `key` (tree.SOURCES; the paper's Fig. 3): the n-gram
    methods' own trees are the n-gram's, a staged tree's nodes the draft's or stage 2's."""
    if method in ("ngram", "lookup"):
        return NGRAM
    return staged.credit(key, copied, drafter.guessed if drafter else ())


def ngram_queries(drafter) -> int:
    return drafter.ngram_queries if drafter else 0


def default_rule(method: str, temperature: float, tree_kind: str) -> str:
    """Greedy at temperature 0; else the lossless rule for how the tree's children were chosen."""
    if temperature == 0:
        return "greedy"
    if method == "speculative" and tree_kind == "with_replacement":
        return "chain"  # classic speculative sampling (the recursive rule reduces to it on a chain)
    return {"deterministic": "point_mass", "with_replacement": "recursive",
            "without_replacement": "recursive_wor"}[tree_kind]


def check_inputs(target, prompt, max_new_tokens, method, draft, ngram, plan, temperature, top_k, top_p, seed,
                 eos=None):
    """The prompt as a list of ints, or a one-line ValueError/TypeError naming the bad argument."""
    # A name or a path where a model belongs would fail deep inside the loop: say what to pass.
    for name, value, kind, example in (("target", target, GPT2, "models.load_model('tiny-target')"),
                                       ("draft", draft, GPT2, "models.load_model('tiny-draft')"),
                                       ("ngram", ngram, Trigram, "models.load_ngram(path)")):
        if not isinstance(value, kind) and (value is not None or name == "target"):
            raise TypeError(f"{name} must be a loaded {kind.__module__.split('.')[-1]}.{kind.__name__} "
                            f"(e.g. {example}), got {type(value).__name__} {value!r:.60}")
    check_settings(temperature, top_k, top_p)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a decode.Plan, got {type(plan).__name__}")
    if isinstance(prompt, (str, bytes)):
        raise TypeError("prompt must be token ids, not text: encode it first, e.g. "
                        "tokenizer.encode(tokenizer.get_encoding(target.config.n_vocab), text)")
    try:
        prompt = list(prompt)
    except TypeError:
        raise TypeError(f"prompt must be a list of token ids, got {type(prompt).__name__} {prompt!r:.60}") from None
    bad = [t for t in prompt if not integral(t)]
    if bad:
        raise TypeError(f"prompt must be integer token ids, got {bad[0]!r}")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    bad = [t for t in prompt if not 0 <= t < target.config.n_vocab]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the target's vocabulary (0..{target.config.n_vocab - 1})")
    if len(prompt) >= target.config.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens: it must be shorter than the context "
                         f"(n_ctx={target.config.n_ctx})")
    if not whole(max_new_tokens, 0):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not whole(seed, 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    V = target.config.n_vocab
    if eos is not None and eos != NEVER and not (integral(eos) and 0 <= eos < V):
        # -1 is no "last id" here: it would never be emitted, and decoding would never stop at end-of-text.
        raise ValueError(f"eos must be a token id in 0..{V - 1}, None (the last id, <|endoftext|>) or "
                         f"decode.NEVER (no end-of-text stop), got {eos!r}")
    if method in DRAFTED:
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model")
        if draft.config.n_vocab != V:
            raise ValueError(f"target and draft must share the tokenizer: vocab sizes {V} != {draft.config.n_vocab}")
        # The draft feeds the prompt, then each step's tree below the last token: it must fit.
        if len(prompt) >= draft.config.n_ctx:
            raise ValueError(f"the prompt has {len(prompt)} tokens: the draft's context (n_ctx="
                             f"{draft.config.n_ctx}) must hold more; shorten it, or decode with method 'ar' or "
                             "'lookup'")
    check_rule(plan, method, temperature)
    if method in ("staged", "ngram"):
        if ngram is None:
            raise ValueError(f"method {method!r} needs an n-gram model")
        if ngram.n_vocab != V:
            raise ValueError(f"ngram: the trigram's vocabulary ({ngram.n_vocab} tokens) is not the target's ({V})")
    # Padding sizes the caches' scratch: a block wider than the model's context is never needed.
    for name, model in (("target_pad", target), ("draft_pad", draft if method in DRAFTED else None)):
        pad = getattr(plan, name)
        if model is not None and pad and max(pad) > model.config.n_ctx:
            who = name.split("_")[0]
            raise ValueError(f"plan: {name} pads a block to {max(pad)} rows, more than the {who}'s context "
                             f"(n_ctx={model.config.n_ctx})")
    # A step's tree is one block of the target's pass: cap it at the context length, before any work.
    nodes = plan.max_block(method)
    if nodes > target.config.n_ctx:
        raise ValueError(f"plan: up to {nodes} drafted tokens per step ({tree_size_words(plan, method)}) exceed the "
                         f"cap of n_ctx={target.config.n_ctx}")
    return prompt


def check_rule(plan: Plan, method: str, temperature: float) -> None:
    """A ValueError, before any work, when plan.rule is not lossless for the trees `method` drafts
    under `plan` (the pairing `accept` would refuse at the first step; verify.check_pairing)."""
    if plan.rule is None or method == "ar":  # plain decoding drafts nothing: its root-only trees need no rule
        return
    if plan.rule == "greedy":
        if temperature > 0:
            raise ValueError("plan: rule 'greedy' keeps the target's argmax, which is sampling only at temperature "
                             f"0; at temperature {temperature} leave rule None (the rule the tree's drafting needs)")
        return
    sampled = plan.sampled or ("with" if method == "speculative" and temperature > 0 else None)  # as generate does
    drafted_from_q = method in DRAFTED and sampled is not None
    verify.check_pairing({"with": "with_replacement", "without": "without_replacement"}[sampled]
                         if drafted_from_q else "deterministic", plan.rule)
    chain = method in CHAINS or plan.fixed(method) and set(plan.widths) == {1}
    if plan.rule in ("chain", "block") and not chain:
        raise ValueError(f"rule {plan.rule!r} verifies a chain: use method 'speculative', or widths of 1")


def tree_size_words(plan: Plan, method: str) -> str:
    """What sets a plan's drafted tokens per step, in the plan's terms."""
    if method == "lookup" and plan.lookup_chains:
        return f"lookup_chains={','.join(map(str, plan.lookup_chains))}"
    if method in CHAINS:
        return f"chain={plan.chain}"
    if plan.fixed(method):
        return f"widths={','.join(map(str, plan.widths))}"
    return f"budget={plan.budget}" + (f", copy_len={plan.copy_len}" if method == "staged" else "")
