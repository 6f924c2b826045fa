"""The decoding loop: autoregressive, speculative (chain), tree, staged, n-gram, prompt lookup and EAGLE decoding in
one loop of the paper's five steps.

Each step: the method (methods.py) proposes a token tree rooted at the last emitted token (`propose`); the target
scores every node in one tree-masked pass (`verify_pass`); a lossless rule accepts a root-to-node path and adds one
target token (`accept`); both KV caches keep only the accepted path (`compact`; a drafter that reads the target's
features, EAGLE's, gets the path's); the step's tokens are emitted (`emit`) and recorded (record.py). Autoregressive
decoding is the same loop with a root-only tree. The tree's shape, stage 2 and the rule travel in one `Plan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import verify
from .checks import check_inputs, check_stop
from .gpt2 import GPT2, hidden, lm_head, new_cache
from .kvcache import KVCache
from .methods import METHODS, make
from .plan import Plan, constant
from .record import Recorder, Result
from .sampling import Rand, process
from .tree import TARGET, Tree, block, path_key
from .verify import Verdict

END_OF_TEXT = -1  # eos's default: the last vocabulary id, GPT-2's <|endoftext|>


def generate(target: GPT2, prompt, max_new_tokens: int = 64, method: str = "ar", draft: GPT2 | None = None,
             ngram=None, plan: Plan | None = None, temperature: float = 0.0, top_k=None, top_p=None,
             seed: int = 0, rand=None, eos: int | None = END_OF_TEXT, keep_trees: bool = False, stop=(),
             decode_fn=None) -> Result:
    """Decode up to `max_new_tokens` after `prompt` (token ids) and return the new tokens with statistics. It stops
    (`stop_reason`) at "eos" (emitted), "stop" (a stop string), "max_new_tokens" (a longer accepted path is cut) or
    "context" (the sequence fills the target's context).

    method: a name in methods.METHODS (each a class: what it drafts); plan: the tree's shape, stage 2 and the rule
      (default: `plan.constant(temperature)`).
    temperature, top_k, top_p: the target distribution to sample from; 0 = greedy (top_k and top_p must then be None).
    rand: the source of randomness (`sampling.Rand`, or the exact enumerator's; default `Rand(seed)`).
    eos: the end-of-text id, negative counting from the vocabulary's end (default END_OF_TEXT, the last id: GPT-2's
      `<|endoftext|>`); None: no end-of-text stop.
    keep_trees: keep each step's verified tree and path in `stats.steps` (for display).
    stop: strings that end the completion (as Hugging Face's stop_strings, vLLM's stop): decoding stops after the
      first token whose addition makes the completion's text (not the prompt's) hold one of them. The tokens hold the
      stop string (as they hold `eos`); the completion's text is theirs cut before it, `tokenizer.cut_at_stop`.
    decode_fn: token ids -> text, for `stop` (default: GPT-2's BPE for the target's vocabulary, tokenizer.py).
    """
    plan = constant(temperature) if plan is None else plan
    prompt = check_inputs(METHODS, target, prompt, max_new_tokens, method, draft, ngram, plan, temperature, top_k,
                          top_p, seed, eos, rand, keep_trees)
    stop, decode_fn = check_stop(stop, decode_fn, target.config.n_vocab)
    eos = None if eos is None else eos % target.config.n_vocab
    recorder = Recorder(target.weight_bytes, draft.weight_bytes if METHODS[method].drafts_with else 0, keep_trees)
    rand = recorder.watch(Rand(seed) if rand is None else rand)
    proposer = make(method, plan, target, draft, ngram, temperature, top_k, top_p, recorder)
    cache = new_cache(target, proposer.max_block(plan) + 1)  # scratch for the root and a step's block
    seq, produced, reason = list(prompt), 0, None
    ends = stop_finder(stop, decode_fn, seq, len(prompt)) if stop else None
    while reason is None and produced < max_new_tokens and len(seq) < target.config.n_ctx:
        proposal = recorder.lap(proposer.propose(seq, rand))  # the recorder notes when each phase ends
        scored = recorder.lap(verify_pass(target, cache, seq, proposal.tree, temperature, top_k, top_p,
                                          proposer.drafts_with == "head"))
        verdict = accept(proposal, scored.p, rand)
        compact(cache, scored, proposal.tree, verdict.path, proposer)
        tokens, source, reason = emit(proposal.tree, verdict, max_new_tokens - produced, eos, ends)
        seq += tokens
        produced += len(tokens)
        recorder.record(proposal, scored, verdict, tokens, source, cache.length)
    reason = reason or ("max_new_tokens" if produced >= max_new_tokens else "context")
    # A path cut by max_new_tokens/eos/a stop string may have left unemitted tokens in the caches: drop them.
    for kv in (cache, proposer.cache):
        if kv is not None:
            kv.truncate(min(kv.length, len(seq) - 1))
    return Result(seq[len(prompt):], recorder.stats, reason, cache, proposer.cache)


@dataclass(frozen=True)
class Scored:
    """The target's pass over a step's tree: p [n, V], the processed distribution after each node; the cache slot
    `start` the block began at and its `n_c` catch-up rows (for `compact`); `features` [n_c + n, n_embd], each row's
    feature, when the method reads them (else None)."""

    p: np.ndarray
    start: int
    n_c: int
    features: np.ndarray | None = None


def verify_pass(target: GPT2, cache: KVCache, seq, tree: Tree, temperature=0.0, top_k=None, top_p=None,
                features: bool = False) -> Scored:
    """The target's processed distribution (temperature, top_k, top_p) after every tree node, from one forward pass
    that also feeds the committed tokens its cache lacks (and every row's feature)."""
    start = cache.length
    tokens, positions, mask, n_c = block(seq, start, tree.tokens, tree.parents)
    x = hidden(target, tokens, cache, positions, mask, 0 if features else n_c)  # [(n_c +) len(tree), n_embd]
    logits = lm_head(target, x[n_c:] if features else x)  # [len(tree), V]
    return Scored(process(logits, temperature, top_k, top_p, whose="the target's"), start, n_c,
                  x if features else None)


def accept(proposal, p, rand) -> Verdict:
    """The proposal's rule run on its tree against the target's p [n, V] (refused if the rule is not lossless for how
    the tree was drawn): the path it accepted, the token after it and its tests."""
    verify.check_tree(proposal.tree, proposal.rule)
    return verify.RULES[proposal.rule](proposal.tree, p, rand)


def compact(cache: KVCache, scored: Scored, tree: Tree, path, proposer) -> None:
    """Keep the catch-up rows and the accepted path in the target's cache, and in the method's drafter (with their
    features, to a drafter that reads them)."""
    kept = np.concatenate([np.arange(scored.n_c), scored.n_c + np.asarray(path, dtype=np.int64)])
    cache.keep(scored.start, kept)
    keys = [path_key(tree.tokens, tree.parents, node) for node in path[1:]]
    if scored.features is None:
        proposer.commit(keys)
    else:
        proposer.commit(keys, scored.features[kept], scored.start)


def emit(tree: Tree, verdict: Verdict, left: int, eos: int | None, ends=None):
    """The tokens the step emits (at most `left`, up to an end-of-text `eos` unless it is None, up to the token that
    completes a stop string, `ends`: stop_finder's), who proposed each (the accepted nodes' sources, then the
    target), and "eos" or "stop" if it emitted an end-of-text or a stop string, else None."""
    tokens = verify.emitted(tree, verdict.path, verdict.token)
    source = [int(tree.source[i]) for i in verdict.path[1:]] + [TARGET]
    stop = None
    if eos is not None and eos in tokens[:left]:
        left, stop = tokens.index(eos) + 1, "eos"
    if ends is not None and (n := ends(tokens[:left - (stop == "eos")])) is not None:  # eos's text is no stop's
        left, stop = n, "stop"
    return tokens[:left], source[:left], stop


def stop_finder(stop, decode_fn, seq: list, n_prompt: int):
    """A step's tokens -> how many of them to emit, through the first after which the completion's text (that of
    `seq[n_prompt:]`, the sequence the loop extends, and them) holds one of the `stop` strings; None if none."""
    def holds(tokens) -> bool:
        text = decode_fn(seq[n_prompt:] + tokens)
        return any(s in text for s in stop)

    def ends(tokens):  # the first prefix that holds one (the tokens before this step's hold none)
        return next(n for n in range(1, len(tokens) + 1) if holds(tokens[:n])) if holds(tokens) else None
    return ends
