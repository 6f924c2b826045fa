"""`decode.generate`'s arguments checked before any work, each bad value refused with a one-line error
naming it (what a method needs and how large its steps grow are its own: methods.py)."""

from __future__ import annotations

from collections.abc import Mapping, Set

from . import verify
from .gpt2 import GPT2
from .methods import METHODS
from .ngram import Trigram
from .plan import Plan
from .sampling import check_settings
from .values import integral, whole


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
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a plan.Plan, got {type(plan).__name__}")
    if plan.rule is not None and plan.rule not in verify.RULES:
        raise ValueError(f"plan: unknown rule {plan.rule!r}: choose one of {', '.join(verify.RULES)}")
    prompt = check_prompt(prompt, target, draft if (m := METHODS[method]).runs_draft else None)
    if not whole(max_new_tokens, 0):
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not whole(seed, 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    V = target.config.n_vocab
    if eos is not None and not (integral(eos) and -V <= eos < V):
        raise ValueError(f"eos must be a token id in 0..{V - 1} (or -1 for the last, <|endoftext|>; a negative id "
                         f"counts from the vocabulary's end) or None (no end-of-text stop), got {eos!r}")
    if m.runs_draft:
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model")
        if draft.config.n_vocab != V:
            raise ValueError(f"target and draft must share the tokenizer: vocab sizes {V} != {draft.config.n_vocab}")
    m.check_rule(plan, temperature)
    if m.needs_ngram:
        if ngram is None:
            raise ValueError(f"method {method!r} needs an n-gram model")
        if ngram.n_vocab != V:
            raise ValueError(f"ngram: the trigram's vocabulary ({ngram.n_vocab} tokens) is not the target's ({V})")
    m.check_size(plan, target.config.n_ctx)
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
        other = ", ".join(name for name, m in METHODS.items() if not m.runs_draft)
        hint = f", or decode with a method that runs no draft ({other})" if model == "draft" else ""
        super().__init__(f"the prompt has {n_tokens} tokens: the {model}'s context (n_ctx={n_ctx}) must hold more; "
                         f"shorten it{hint}")
