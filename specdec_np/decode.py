"""The decoding loop: autoregressive, speculative (chain), tree, staged, n-gram and prompt lookup
decoding in one loop of the paper's five steps.

Each step: the method (an object of methods.py) proposes a token tree rooted at the last emitted
token (`propose`); the target scores every node in one tree-masked pass (`verify_pass`); a lossless
rule accepts a root-to-node path and adds one target token (`accept`); both KV caches keep only
the accepted path (`compact`); the step's tokens are emitted (`emit`). A `Recorder` (record.py)
turns each step into the `Step` every statistic is computed from. Autoregressive decoding is the
same loop with a root-only tree. How the tree is shaped, what stage 2 does and which rule verifies
travel in one `Plan`, whose defaults are constants: the output is a function of the arguments
only. The tools (`specdec_np.tools`) measure a machine and pass in the plan that is fastest there.

Stopping: at `<|endoftext|>` (emitted, then stop), at `max_new_tokens` (a longer accepted path is
cut), or when the sequence fills the target's context (`stop_reason == "context"`).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import methods, verify
from .fastpath import padded
from .gpt2 import GPT2, forward
from .kvcache import KVCache
from .ngram import Trigram
from .record import Recorder, Result, Stats, Step  # noqa: F401  (what the tools and the trace read)
from .sampling import Rand, check_settings, process
from .tree import TARGET, Tree, block, path_key

METHODS = tuple(methods.METHODS)
NEVER = "never"  # generate(..., eos=NEVER): decode up to max_new_tokens, whatever tokens are emitted


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


def generate(target: GPT2, prompt, max_new_tokens: int = 64, method: str = "ar", draft: GPT2 | None = None,
             ngram=None, plan: Plan | None = None, temperature: float = 0.0, top_k=None, top_p=None,
             seed: int = 0, rand=None, eos: int | None = None, keep_trees: bool = False) -> Result:
    """Decode up to `max_new_tokens` after `prompt` (token ids) and return the new tokens with statistics.

    method: "ar" (target alone), "speculative" (a draft chain), "tree" (a draft token tree),
      "staged" (a draft tree speculated by the n-gram, which also copies repeats to the target),
      "ngram" (the n-gram drafts the tree itself), "lookup" (prompt lookup's chain, no model);
      each is an object of methods.py.
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
    rand = Rand(seed) if rand is None else rand
    eos = target.config.n_vocab - 1 if eos is None else None if eos == NEVER else int(eos)
    method = methods.make(method, plan)
    method.start(target, draft, ngram, temperature, top_k, top_p)
    cache = methods.new_cache(target, method, plan.target_pad)
    recorder = Recorder(target.weight_bytes, draft.weight_bytes if method.runs_draft else 0, keep_trees)
    settings = (temperature, top_k, top_p)
    seq, stop = list(prompt), None
    while stop is None and len(seq) - len(prompt) < max_new_tokens and len(seq) < target.config.n_ctx:
        # Propose: a token tree rooted at seq[-1] (a draft tree or chain, or stage 2's copy of a repeat).
        proposal = recorder.lap(method.propose(seq, rand))
        # Verify: the target scores every node in one tree-masked pass; p[i] follows node i.
        scored = recorder.lap(verify_pass(target, cache, seq, proposal.tree, plan.target_pad, settings))
        # Accept: a lossless rule keeps a root-to-node path and draws one more token from the target.
        verdict = accept(proposal, scored.p, rand, keep_trees)
        # Compact: both caches keep only the accepted path, in contiguous slots.
        compact(cache, scored, proposal.tree, verdict.path, method)
        # Emit: the accepted tokens and the target's, cut at max_new_tokens or an end-of-text.
        tokens, source, stop = emit(proposal, verdict, max_new_tokens - (len(seq) - len(prompt)), eos)
        seq += tokens
        recorder.record(proposal, scored, verdict, tokens, source, cache.length)
    stop = stop or ("max_new_tokens" if len(seq) - len(prompt) >= max_new_tokens else "context")
    # A path cut by max_new_tokens/eos may have left unemitted tokens in the caches: drop them.
    cache.truncate(min(cache.length, len(seq) - 1))
    method.finish(len(seq))
    return Result(seq[len(prompt):], recorder.stats, stop, cache, method.cache)


class Scored(NamedTuple):
    """The target's pass over a step's tree: p [n, V], the processed distribution after each node;
    the cache slot `start` the block began at and its `n_c` catch-up rows (for `compact`)."""

    p: np.ndarray
    start: int
    n_c: int


class Verdict(NamedTuple):
    """What the rule accepted: the root-to-node `path`, the target's `token` after it, and with
    keep_trees the rule's `checks` (verify.Check), else None."""

    path: list
    token: int
    checks: list | None


def verify_pass(target: GPT2, cache: KVCache, seq, tree: Tree, pad=(), settings=(0.0, None, None)) -> Scored:
    """The target's processed distribution (temperature, top_k, top_p = `settings`) after every tree
    node, from one forward pass that also feeds the committed tokens its cache lacks."""
    start = cache.length
    tokens, positions, mask, n_c = block(seq, start, tree.tokens, tree.parents)
    logits = forward(target, tokens, cache, positions=positions, mask=mask, pad_to=padded(pad, len(tokens)),
                     logits_from=n_c)  # [len(tree), V]
    return Scored(process(logits, *settings), start, n_c)


def accept(proposal, p, rand, keep_checks: bool = False) -> Verdict:
    """The proposal's rule run on its tree against the target's p [n, V] (refused if the rule is not
    lossless for how the tree was drawn)."""
    verify.check_tree(proposal.tree, proposal.rule)
    checks = [] if keep_checks else None
    path, token = verify.RULES[proposal.rule](proposal.tree, p, rand, checks)
    return Verdict(path, token, checks)


def compact(cache: KVCache, scored: Scored, tree: Tree, path, method) -> None:
    """Keep the catch-up rows and the accepted path in the target's cache, and in the method's drafter."""
    cache.keep(scored.start, np.concatenate([np.arange(scored.n_c), scored.n_c + np.asarray(path, dtype=np.int64)]))
    method.commit([path_key(tree.tokens, tree.parents, node) for node in path[1:]])


def emit(proposal, verdict: Verdict, room: int, eos: int | None):
    """The tokens the step emits (at most `room`, up to an end-of-text `eos` unless it is None), who
    proposed each (the accepted nodes' proposers, then the target), and "eos" if it emitted an
    end-of-text, else None."""
    tokens = verify.emitted(proposal.tree, verdict.path, verdict.token)
    source = [proposal.proposers[i] for i in verdict.path[1:]] + [TARGET]
    stop = None
    if eos is not None and eos in tokens[:room]:
        room, stop = tokens.index(eos) + 1, "eos"
    return tokens[:room], source[:room], stop


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
    kind = methods.METHODS[method]
    if kind.runs_draft:
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
    if kind.needs_ngram:
        if ngram is None:
            raise ValueError(f"method {method!r} needs an n-gram model")
        if ngram.n_vocab != V:
            raise ValueError(f"ngram: the trigram's vocabulary ({ngram.n_vocab} tokens) is not the target's ({V})")
    # Padding sizes the caches' scratch: a block wider than the model's context is never needed.
    for name, model in (("target_pad", target), ("draft_pad", draft if kind.runs_draft else None)):
        pad = getattr(plan, name)
        if model is not None and pad and max(pad) > model.config.n_ctx:
            who = name.split("_")[0]
            raise ValueError(f"plan: {name} pads a block to {max(pad)} rows, more than the {who}'s context "
                             f"(n_ctx={model.config.n_ctx})")
    # A step's tree is one block of the target's pass: cap it at the context length, before any work.
    nodes = methods.make(method, plan).max_block()
    if nodes > target.config.n_ctx:
        raise ValueError(f"plan: up to {nodes} drafted tokens per step ({tree_size_words(plan, method)}) exceed the "
                         f"cap of n_ctx={target.config.n_ctx}")
    return prompt


def check_rule(plan: Plan, method: str, temperature: float) -> None:
    """A ValueError, before any work, when plan.rule is not lossless for the trees `method` drafts
    under `plan` (the pairing `accept` would refuse at the first step; verify.check_pairing)."""
    methods.make(method, plan).check_rule(temperature)


def tree_size_words(plan: Plan, method: str) -> str:
    """What sets a plan's drafted tokens per step, in the plan's terms."""
    return methods.make(method, plan).size_words()
