"""The decoding loop: one loop for autoregressive, speculative (chain), tree and staged decoding.

Each step: a drafter proposes a token tree rooted at the last emitted token; the target scores
every node in one tree-masked pass; a verification rule accepts a root-to-node path and emits one
more token (correction or bonus); both KV caches keep only the accepted path. Autoregressive
decoding is the same loop with a root-only tree. In staged decoding the cheapest stage may also
propose to the target directly: when the context's last three tokens occurred earlier, the step's
tree is the chain of what followed them (prompt lookup; round the loop if the sequence is repeating
itself), and the draft model is not run at all.

Stopping: at `<|endoftext|>` (emitted, then stop), at `max_new_tokens` (a longer accepted path is
cut), or cleanly when the sequence fills the target's context (`stop_reason == "context"`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from . import build, verify
from .drafting import ModelDrafter, ngram_dist_fn
from .gpt2 import GPT2, KVCache, forward
from .ngram import prompt_lookup, repeat_continuation
from .sampling import Rand, check_settings, process
from .tree import Tree, attention_mask, depths
from .tuning import defaults, padding, tuned_curves

METHODS = ("ar", "speculative", "tree", "staged", "ngram", "lookup")
SOURCES = ("target", "draft", "ngram")  # who produced each emitted token (the paper's Fig. 3)


@dataclass
class Stats:
    target_passes: int = 0
    draft_passes: int = 0
    draft_steps: int = 0  # steps that ran the draft: their first pass is cold (the target evicted it)
    ngram_queries: int = 0
    accepted: list = field(default_factory=list)  # tokens emitted per target pass
    source: list = field(default_factory=list)  # per emitted token: index into SOURCES
    target_bytes: int = 0  # weight bytes read: every tensor once per forward pass
    draft_bytes: int = 0
    target_weight_bytes: int = 0  # what one target pass reads: the unit of weight traffic
    time_draft: float = 0.0  # seconds building trees (draft passes and n-gram queries)
    time_target: float = 0.0  # seconds in target forward passes
    time_verify: float = 0.0
    target_blocks: list = field(default_factory=list)  # tokens per target pass (for the cost model)
    draft_blocks: list = field(default_factory=list)  # tokens per draft pass
    trees: list = field(default_factory=list)  # (tree, accepted path) per step, if keep_trees

    @property
    def tokens_per_pass(self) -> float:
        return float(np.mean(self.accepted)) if self.accepted else 0.0

    @property
    def weight_traffic(self) -> float:
        """Weight bytes read (target + draft) per emitted token, relative to autoregressive decoding."""
        return (self.target_bytes + self.draft_bytes) / (max(1, len(self.source)) * self.target_weight_bytes)


@dataclass
class Result:
    tokens: list  # the new tokens (prompt excluded)
    stats: Stats
    stop_reason: str  # "eos", "max_new_tokens" or "context"
    target_cache: KVCache | None = None  # for inspection: holds the emitted sequence minus its last token
    draft_cache: KVCache | None = None


def verify_pass(target: GPT2, cache: KVCache, seq, tree: Tree, pad=None):
    """Target logits at every tree node [n, V]; feeds committed tokens the cache lacks, then the tree.

    The tree's root is `seq[-1]` at position len(seq) - 1; a node at depth d sits at len(seq)-1+d.
    Returns (logits, start, n_catch_up) so the caller can `keep` the accepted path afterwards.
    `pad(n)`: the block size to compute n tokens as (`tuning.padding`); default unpadded.
    """
    start, root_pos = cache.length, len(seq) - 1
    catch_up = list(seq[start:root_pos])
    n_c, n = len(catch_up), len(catch_up) + len(tree.tokens)
    mask = np.zeros((n, n), dtype=bool)
    mask[:n_c, :n_c] = np.tril(np.ones((n_c, n_c), dtype=bool))
    mask[n_c:, :n_c] = True
    mask[n_c:, n_c:] = attention_mask(tree)
    positions = np.concatenate([start + np.arange(n_c), root_pos + depths(tree)])
    logits = forward(target, catch_up + [int(t) for t in tree.tokens], cache, positions=positions, mask=mask,
                     pad_to=pad(n) if pad else None, logits_from=n_c)  # [len(tree), V]
    return logits, start, n_c


def default_rule(method: str, temperature: float, tree_kind: str) -> str:
    if temperature == 0:
        return "greedy"
    if method == "speculative" and tree_kind == "with_replacement":
        return "chain"  # classic speculative sampling (the recursive rule reduces to it on a chain)
    return {"deterministic": "point_mass", "with_replacement": "recursive",
            "without_replacement": "recursive_wor"}[tree_kind]


def check_inputs(target: GPT2, prompt, draft, method, max_new_tokens):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    bad = [t for t in prompt if not 0 <= t < target.config.n_vocab]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the target's vocabulary (0..{target.config.n_vocab - 1})")
    if len(prompt) >= target.config.n_ctx:
        raise ValueError(f"the prompt has {len(prompt)} tokens: it must be shorter than the context (n_ctx={target.config.n_ctx})")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if method in ("speculative", "tree", "staged"):
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model")
        if draft.config.n_vocab != target.config.n_vocab:
            raise ValueError(f"target and draft must share the tokenizer: vocab sizes {target.config.n_vocab} != {draft.config.n_vocab}")
    return prompt


def generate(target: GPT2, prompt, max_new_tokens: int = 64, method: str = "ar", draft: GPT2 | None = None,
             ngram=None, temperature: float = 0.0, top_k=None, top_p=None, seed: int = 0,
             budget: int | None = None, depth: int | None = None, tree: str | None = None,
             widths=None, sampled: str | None = None, rule: str | None = None, spec_len: int | None = None,
             spec_width: int = 1, spec_rows: int | str | None = None, lookup_depth: int | None = None,
             eos: int | None = None, keep_trees: bool = False) -> Result:
    """Decode up to `max_new_tokens` after `prompt` and return the new tokens with statistics.

    method: "ar" (target alone), "speculative" (draft chain of `depth` tokens), "tree" (draft
      token tree), "staged" (draft tree whose expansion is speculated by the n-gram), "ngram"
      (the n-gram drafts the tree itself), "lookup" (prompt-lookup chain, no model).
    budget, depth: drafted tokens per target pass (best-first trees only: chains and fixed-width
      trees have their size from depth and widths) and maximum depth (chain length for speculative
      and lookup); default: the shape the cost model predicts fastest for this pair, machine and
      setting (greedy or sampled; `bench --tune` stores it in weights/tuned.json), else budget 8,
      depth 6, chain 4 (see tuning.py). A fixed-width tree is len(widths) deep by default.
    tree: "best_first" (`budget` nodes, depth <= `depth`) or "fixed" (`widths` children per depth;
      default widths: tuned for the setting, else 2, 2, 1, 1, 1, 1, cut or extended with single
      children to an explicit `depth`). Default: "fixed" if widths are given, "best_first" if a
      budget is, else the kind the cost model found fastest (tuned; else best_first). Trees with
      sampled children always have fixed widths.
    sampled: None (deterministic children: the draft's top tokens, verified at temperature > 0 by
      the point-mass rule), "with" or "without" replacement (children drawn from q, verified by
      recursive rejection sampling; at temperature 1 they are accepted far more often than top
      tokens). At temperature > 0, `speculative` draws its chain from q (classic speculative
      sampling) unless sampled is given.
    spec_len, spec_width, spec_rows: stage 2 (staged only): below each node the draft evaluates,
      the n-gram guesses `spec_width` children continued to `spec_len` levels, evaluated in the
      same draft pass; at most `spec_rows` guessed nodes per pass ("pad": only as many as fill the
      rows a padded pass computes anyway); spec_len 0: no guesses (at T=1 on this CPU the draft's
      2-row passes cost more than the guesses it samples save). Default spec_len and spec_rows:
      tuned, else 3 and 4.
    lookup_depth: stage 2 proposing to the target (staged only): when the context's last three
      tokens occurred earlier in it, the step verifies the `lookup_depth` tokens that followed
      them (continuing round the loop when the match is recent), with no draft pass (code and
      small models repeat themselves, and a copy is free to draft); 0: the draft model drafts
      every step. Default: tuned, else 12.
    rule: the verification rule; by default greedy at temperature 0, else the lossless rule the
      tree's construction assumes (a mismatched explicit rule raises; staged's copied chains are
      deterministic trees, so a rule for sampled trees also needs lookup_depth=0).
    eos: the end-of-text id (default: the last vocabulary id, GPT-2's `<|endoftext|>`).
    """
    check_settings(temperature, top_k, top_p)
    prompt = check_inputs(target, prompt, draft, method, max_new_tokens)
    if method in ("staged", "ngram") and ngram is None:
        raise ValueError(f"method {method!r} needs an n-gram model")
    eos = target.config.n_vocab - 1 if eos is None else eos
    n_ctx = target.config.n_ctx
    if tree not in (None, "best_first", "fixed"):
        raise ValueError(f"unknown tree {tree!r}: choose best_first or fixed")
    if sampled not in (None, "with", "without"):
        raise ValueError(f"sampled={sampled!r}: choose None (deterministic children), with or without")
    if tree == "best_first" and widths is not None and sampled is None:
        raise ValueError("widths shape fixed-width trees: pass tree='fixed' (or no tree), or a budget for best_first")
    if method == "speculative" and temperature > 0 and sampled is None:
        sampled = "with"
    shape = defaults(target, draft, temperature)  # measured here by `bench --tune`, else constants
    if tree is None:
        tree = "fixed" if widths is not None else "best_first" if budget is not None else shape["tree"]
    chain = method in ("speculative", "lookup")
    fixed = method in ("tree", "staged") and (tree == "fixed" or sampled is not None)
    default_widths = widths is None
    widths = [int(w) for w in (shape["widths"] if default_widths else widths)]
    if depth is None:
        depth = shape["chain"] if chain else len(widths) if fixed else shape["depth"]
    elif default_widths:
        widths = (widths + [1] * depth)[:depth]
    budget = shape["budget"] if budget is None else budget
    spec_len = shape["spec_len"] if spec_len is None else spec_len
    spec_rows = shape["spec_rows"] if spec_rows is None else spec_rows
    lookup_depth = shape["lookup_depth"] if lookup_depth is None else lookup_depth
    for name, value in (("spec_len", spec_len), ("lookup_depth", lookup_depth)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0 (0 = off), got {value!r}")
    if method != "staged":
        lookup_depth = 0
    rand = Rand(seed)
    stats = Stats()
    # Blocks are padded to the cheapest measured size at least as large (no curve, no padding).
    curves = tuned_curves(target, draft) or {}
    pad_target, pad_draft = padding(curves.get("target")), padding(curves.get("draft"))
    drafter = None
    if method in ("speculative", "tree", "staged"):
        drafter = ModelDrafter(draft, temperature, top_k, top_p,
                               ngram=ngram if method == "staged" else None, spec_len=spec_len,
                               spec_width=spec_width, spec_rows=spec_rows, pad=pad_draft)
    tree_size = int(np.cumprod(widths[:depth]).sum()) if fixed else budget  # drafted nodes per pass, at most
    cache = KVCache(target.config, dtype=target.dtype, max_block=max(64, tree_size + 1, depth + 1, lookup_depth + 1))
    seq, new = list(prompt), []
    stop = "max_new_tokens"
    while len(new) < max_new_tokens:
        if len(seq) >= n_ctx:
            stop = "context"
            break
        d = min(depth, n_ctx - len(seq) - 1)  # keep every fed position and the result inside n_ctx
        if drafter:
            d = min(d, draft.config.n_ctx - len(seq))  # the draft feeds nodes up to depth d - 1

        t0 = time.perf_counter()
        copied, n_copy = [], min(lookup_depth, n_ctx - len(seq) - 1)
        if n_copy > 0:  # stage 2 proposes to the target directly, and the draft sits this step out
            copied = repeat_continuation(seq, n_copy)
            stats.ngram_queries += 1
        if copied:
            t = copied_chain(seq[-1], copied)
        else:
            passes_before = drafter.passes if drafter else 0
            if drafter:
                drafter.begin(seq, d)
            t = make_tree(method, seq, d, budget, fixed, widths, sampled, rand, drafter, ngram, stats)
            if drafter:
                stats.draft_passes += drafter.passes - passes_before
                stats.draft_steps += drafter.passes > passes_before
        t1 = time.perf_counter()
        logits, start, n_c = verify_pass(target, cache, seq, t, pad_target)
        t2 = time.perf_counter()
        p = process(logits, temperature, top_k, top_p)  # [n, V]
        r = rule or default_rule(method, temperature, t.kind)
        verify.check_tree(t, r)
        path, nxt = verify.RULES[r](t, p, rand)
        cache.keep(start, np.concatenate([np.arange(n_c), n_c + np.asarray(path, dtype=np.int64)]))
        emitted = verify.emitted(t, path, nxt)
        keys = [tuple(emitted[:j]) for j in range(1, len(path))]  # each accepted node's path key
        if drafter and not copied:  # after a copied step the draft's next pass catches its cache up
            drafter.commit(keys)
        t3 = time.perf_counter()

        credit = [credit_of(method, drafter, k, bool(copied)) for k in keys] + [0]
        stats.target_passes += 1
        stats.target_blocks.append(n_c + len(t.tokens))
        stats.time_draft += t1 - t0
        stats.time_target += t2 - t1
        stats.time_verify += t3 - t2
        if keep_trees:
            stats.trees.append((t, path))
        for tok, src in zip(emitted, credit):
            if len(new) == max_new_tokens:
                break
            new.append(tok)
            seq.append(tok)
            stats.source.append(src)
            if tok == eos:
                stop = "eos"
                break
        stats.accepted.append(len(emitted))
        if stop == "eos":
            break
    # A path cut by max_new_tokens/eos may have left unemitted tokens in the caches: drop them.
    cache.truncate(min(cache.length, len(seq) - 1))
    if drafter:
        drafter.cache.truncate(min(drafter.cache.length, len(seq) - 1))
        stats.ngram_queries += drafter.ngram_queries
        stats.draft_blocks = drafter.block_sizes
    stats.target_weight_bytes = target.weight_bytes
    stats.target_bytes = stats.target_passes * target.weight_bytes
    stats.draft_bytes = stats.draft_passes * (draft.weight_bytes if draft is not None else 0)
    return Result(new, stats, stop, cache, drafter.cache if drafter else None)


def credit_of(method, drafter, key, copied: bool = False) -> int:
    """The cheapest stage that proposed an accepted token: n-gram if it proposed the tree (a copied
    chain, or the ngram/lookup methods) or guessed the token (and the draft kept it in the tree),
    else the draft."""
    if copied or method in ("ngram", "lookup"):
        return 2
    return 2 if drafter is not None and key in drafter.guessed else 1


def copied_chain(root: int, tokens) -> Tree:
    """Prompt lookup's proposal as a deterministic chain below `root`: no draft probabilities
    (q = 1), every node proposed by the n-gram stage (source 1)."""
    n = len(tokens)
    return Tree(tokens=np.array([root] + [int(t) for t in tokens], dtype=np.int64),
                parents=np.arange(-1, n, dtype=np.int64), q=np.ones(n + 1), kind="deterministic",
                source=np.array([0] + [1] * n))


def make_tree(method, seq, depth, budget, fixed, widths, sampled, rand, drafter, ngram, stats) -> Tree:
    root = seq[-1]
    if method == "ar" or depth <= 0 or budget <= 0:
        return Tree(tokens=[root], parents=[-1], q=[1.0])
    if method == "lookup":
        return copied_chain(root, prompt_lookup(seq, k=depth))
    if method == "ngram":
        counter = [0]
        t = build.build_best_first(root, ngram_dist_fn(ngram, seq, counter), budget, depth)
        stats.ngram_queries += counter[0]
        return t
    fn = drafter.dist_fn
    r = rand if sampled else None
    if method == "speculative":
        return build.build_chain(root, fn, depth, rand=r)
    if fixed:  # tree="fixed", or sampled children
        return build.build_fixed(root, fn, widths[:depth], rand=r, replacement=sampled != "without")
    return build.build_best_first(root, fn, budget, depth)
