"""What `decode.generate` is asked to do, checked before any work: the `Plan` (how to draft and
verify), the constant plan used when none is given (`constant`), and the arguments (`check_inputs`),
each bad value refused with a one-line error naming it.

The decoding loop (decode.py) trusts what passes here; the method-specific facts the checks read
(sizes, lossless rules) are pure functions of the method's name and the plan, in methods.py.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Set
from dataclasses import dataclass

from . import methods, verify
from .gpt2 import GPT2
from .ngram import Trigram
from .sampling import check_settings


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
    """How to decode: the draft tree's shape, stage 2's work, the verification rule.

    shape: "best_first" (the `budget` drafted nodes of highest cumulative draft probability, at most
      `depth` deep; cf. EAGLE-2) or "fixed" (`widths[d]` children under every node at depth d; so
      are trees drawn from q).
    chain: drafted tokens per step of the chain methods (speculative, lookup).
    lookup_chains: prompt lookup's chain lengths after a match of the last 3, 2, 1 tokens (0: none
      after a match that short, weak evidence); () = `chain` after any match.
    sampled: None (children are the draft's top tokens) or "with" / "without" replacement
      (children drawn from q: at temperature 1 they are accepted far more often than top tokens).
    guess_len, guess_rows: stage 2 for the draft (staged): the n-gram guesses `guess_len` levels below
      each node the draft evaluates, in the same pass, at most `guess_rows` per pass ("pad": as many
      as fill a padded pass's rows); 0: none.
    copy_len: stage 2 for the target (staged): when the last three tokens recur, the step verifies
      the `copy_len` tokens that followed them, with no draft pass; 0: never.
    rule: the verification rule (verify.RULES); None: greedy at temperature 0, else the lossless
      rule the tree's construction assumes.
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


def constant(temperature: float = 0.0) -> Plan:
    """The constant plan, the same on every machine: `Plan()` at temperature 0; when sampling, trees
    drawn from the draft without replacement, one child three deep (a child drawn from q is accepted
    far more often than a top token, and each level costs a draft pass), chains of 3, prompt lookup
    after matches of 2 or more tokens, copies of 3 and no stage-2 guesses. Chosen from the shipped
    acceptance profile priced by the cost model (docs/reference.md, "The constant plan")."""
    if temperature == 0:
        return Plan()
    return Plan(shape="fixed", widths=(1, 1, 1), sampled="without", chain=3, lookup_chains=(7, 3, 0), guess_len=0,
                guess_rows=0, copy_len=3)


def check_inputs(target, prompt, max_new_tokens, method, draft, ngram, plan, temperature, top_k, top_p, seed,
                 eos, rand=None, keep_trees=False) -> list:
    """generate's arguments checked: the prompt as a list of ints, or a one-line ValueError/TypeError
    naming the bad argument. top_k and top_p at temperature 0 are errors: greedy decoding keeps the
    argmax, which both always keep, so they would change nothing."""
    # A name or a path where a model belongs would fail deep inside the loop: say what to pass.
    for name, value, kind, example in (("target", target, GPT2, "models.load_model('tiny-target')"),
                                       ("draft", draft, GPT2, "models.load_model('tiny-draft')"),
                                       ("ngram", ngram, Trigram, "models.load_ngram(path)")):
        if not isinstance(value, kind) and (value is not None or name == "target"):
            raise TypeError(f"{name} must be a loaded {kind.__module__.split('.')[-1]}.{kind.__name__} "
                            f"(e.g. {example}), got {type(value).__name__} {value!r:.60}")
    check_settings(temperature, top_k, top_p)
    if temperature == 0 and (top_k is not None or top_p is not None):
        name = "top_k" if top_k is not None else "top_p"
        raise ValueError(f"{name} changes nothing at temperature 0 (greedy keeps the argmax, which top_k and top_p "
                         "always keep): leave it None, or sample with temperature > 0")
    # Rand's interface: coin(p) and draw(probs) (the exact enumerator's ScriptedRand has it too).
    if rand is not None and not (callable(getattr(rand, "coin", None)) and callable(getattr(rand, "draw", None))):
        raise TypeError(f"rand must be a sampling.Rand (e.g. sampling.Rand(seed), or sampling.Rand(generator) for a "
                        f"numpy Generator) or None, got {type(rand).__name__}")
    if not isinstance(keep_trees, bool):
        raise TypeError(f"keep_trees must be True or False, got {type(keep_trees).__name__} {keep_trees!r:.60}")
    if method not in methods.METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(methods.METHODS)}")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a plan.Plan, got {type(plan).__name__}")
    prompt = check_prompt(prompt, target, draft if methods.runs_draft(method) else None)
    if not whole(max_new_tokens, 0):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not whole(seed, 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    V = target.config.n_vocab
    if eos is not None and not (integral(eos) and -V <= eos < V):
        raise ValueError(f"eos must be a token id in 0..{V - 1} (or -1 for the last, <|endoftext|>; a negative id "
                         f"counts from the vocabulary's end) or None (no end-of-text stop), got {eos!r}")
    if methods.runs_draft(method):
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model")
        if draft.config.n_vocab != V:
            raise ValueError(f"target and draft must share the tokenizer: vocab sizes {V} != {draft.config.n_vocab}")
    methods.check_rule(method, plan, temperature)
    if methods.needs_ngram(method):
        if ngram is None:
            raise ValueError(f"method {method!r} needs an n-gram model")
        if ngram.n_vocab != V:
            raise ValueError(f"ngram: the trigram's vocabulary ({ngram.n_vocab} tokens) is not the target's ({V})")
    methods.check_size(method, plan, target.config.n_ctx)
    return prompt


def check_prompt(prompt, target, draft=None) -> list:
    """The prompt as a non-empty list of the target's token ids, shorter than the target's context
    and the draft's (given when the draft decodes)."""
    if isinstance(prompt, (str, bytes)):
        raise TypeError("prompt must be token ids, not text: encode it first, e.g. "
                        "tokenizer.encode(tokenizer.get_encoding(target.config.n_vocab), text)")
    if isinstance(prompt, (Mapping, Set)):  # list() would take a dict's keys, a set's ids in no order
        raise TypeError(f"prompt must be a sequence of token ids (a list, tuple or array), not a "
                        f"{type(prompt).__name__}")
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
    V = target.config.n_vocab
    bad = [t for t in prompt if not 0 <= t < V]
    if bad:
        raise ValueError(f"prompt token id {bad[0]} is outside the target's vocabulary (0..{V - 1})")
    for model in (target, draft):  # each feeds the whole prompt, then decodes below it
        if model is not None and len(prompt) >= model.config.n_ctx:
            raise ContextFilled("target" if model is target else "draft", len(prompt), model.config.n_ctx)
    return prompt


class ContextFilled(ValueError):
    """A prompt that fills the context of the `model` ("target" or "draft"): a one-line error whose
    fields let a caller name the model its own way (the CLI names the option that chose it)."""

    def __init__(self, model: str, n_tokens: int, n_ctx: int):
        self.model = model
        other = ", ".join(m for m in methods.METHODS if not methods.runs_draft(m))
        hint = f", or decode with a method that runs no draft ({other})" if model == "draft" else ""
        super().__init__(f"the prompt has {n_tokens} tokens: the {model}'s context (n_ctx={n_ctx}) must hold more; "
                         f"shorten it{hint}")
