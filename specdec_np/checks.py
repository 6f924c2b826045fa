"""`decode.generate`'s arguments checked once, before any work: a bad one is a one-line error that starts with its
name (a method's own needs: methods.py; `gpt2.forward`'s are checked where it builds its block, `gpt2.inputs`)."""

from __future__ import annotations

from collections.abc import Mapping, Set

from . import verify
from .eagle import Head
from .gpt2 import GPT2
from .ngram import Trigram
from .plan import Plan, check_temperature
from .tokenizer import GPT2_N_VOCAB, decode, get_encoding
from .values import FieldError, integral, real, whole


def check_settings(temperature=1.0, top_k=None, top_p=None) -> None:
    """The sampling settings (sampling.py trusts them): a FieldError starting `name=value` unless temperature >= 0
    finite, top_k an integer >= 1 or None, 0 < top_p <= 1 or None."""
    check_temperature(temperature)
    if top_k is not None and not whole(top_k, 1):
        raise FieldError("top_k", top_k, " must be an integer >= 1", about="")
    if top_p is not None and not (real(top_p) and 0 < top_p <= 1):
        raise FieldError("top_p", top_p, " must be in (0, 1]", about="")


def needless(temperature, top_k=None, top_p=None) -> str | None:
    """"top_k" or "top_p" if given at temperature 0, where it changes nothing (greedy decoding keeps the argmax,
    which both always keep); else None."""
    return next((name for name, v in (("top_k", top_k), ("top_p", top_p)) if v is not None and temperature == 0), None)


def check_cuts(top_k, top_p, n_vocab: int | None = None) -> None:
    """A FieldError starting `name=value` for a top_k or top_p that keeps every token, so changes nothing: top_k at
    or above the vocabulary's `n_vocab` tokens (None: not known yet), top_p = 1. generate refuses them, and the
    command line in the same words, naming its option (options.as_option)."""
    if top_k is not None and n_vocab is not None and top_k >= n_vocab:
        raise FieldError("top_k", top_k, f": the target has {n_vocab} tokens, so it keeps them all and changes "
                         f"nothing: give fewer than {n_vocab}, or leave it off", about="")
    if top_p is not None and top_p == 1:
        raise FieldError("top_p", 1, " keeps every token, so it changes nothing: leave it off", about="")  # 1.0 too


def check_inputs(methods, target, prompt, max_new_tokens, method, draft, ngram, plan, temperature, top_k, top_p,
                 seed, eos, rand=None, keep_trees=False) -> list:
    """generate's arguments checked (`methods`: methods.METHODS): the prompt as a list of ints, or a one-line
    ValueError/TypeError naming the bad argument. What would change nothing is an error, as on the command line
    (`needless`, `check_cuts`, a draft or an n-gram the method never reads)."""
    # A name or a path where a model belongs would fail deep inside the loop: say what to pass.
    if isinstance(target, Head):
        raise TypeError("target: an EAGLE head is not a model: pass the target model, and the head as draft with "
                        "method 'eagle'")
    for name, value, kind, example in (("target", target, GPT2, "models.load_model('tiny-target')"),
                                       ("draft", draft, (GPT2, Head), "models.load_model('tiny-draft')"),
                                       ("ngram", ngram, Trigram, "models.load_ngram(path)")):
        if not isinstance(value, kind) and (value is not None or name == "target"):
            kind = "ngram.Trigram" if name == "ngram" else "gpt2.GPT2"
            raise TypeError(f"{name} must be a loaded {kind} (e.g. {example}), got {type(value).__name__} "
                            f"{value!r:.60}")
    check_settings(temperature, top_k, top_p)
    if name := needless(temperature, top_k, top_p):
        raise ValueError(f"{name} changes nothing at temperature 0 (greedy keeps the argmax, which top_k and top_p "
                         "always keep): leave it None, or sample with temperature > 0")
    check_cuts(top_k, top_p, target.config.n_vocab)
    # Rand's interface: coin(p) and draw(probs) (the exact enumerator's ScriptedRand has it too).
    if rand is not None and not (callable(getattr(rand, "coin", None)) and callable(getattr(rand, "draw", None))):
        raise TypeError(f"rand must be a sampling.Rand (e.g. sampling.Rand(seed), or sampling.Rand(generator) for a "
                        f"numpy Generator) or None, got {type(rand).__name__}")
    if not isinstance(keep_trees, bool):
        raise TypeError(f"keep_trees must be True or False, got {type(keep_trees).__name__} {keep_trees!r:.60}")
    if method not in methods:
        raise ValueError(f"unknown method {method!r}: choose one of {', '.join(methods)}")
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be a plan.Plan, got {type(plan).__name__}")
    if plan.rule is not None and plan.rule not in verify.RULES:
        raise FieldError("rule", plan.rule, f" {plan.rule!r}: choose one of {', '.join(verify.RULES)}", "unknown ",
                         valued=False)
    prompt = check_prompt(prompt, target, draft if (m := methods[method]).drafts_with else None, methods)
    for name, value in (("max_new_tokens", max_new_tokens), ("seed", seed)):
        if not whole(value, 0):
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    V = target.config.n_vocab
    if eos is not None and not (integral(eos) and -V <= eos < V):
        raise ValueError(f"eos must be a token id in 0..{V - 1} (or -1 for the last, <|endoftext|>; a negative id "
                         f"counts from the vocabulary's end) or None (no end-of-text stop), got {eos!r}")
    for name, model, reads in (("draft", draft, m.drafts_with), ("ngram", ngram, m.needs_ngram)):
        if model is not None and not reads:  # as the command line's --draft and --ngram
            users = ", ".join(k for k, c in methods.items() if (c.drafts_with if name == "draft" else c.needs_ngram))
            raise ValueError(f"{name} does nothing with method {method!r}: it applies to method {users} (leave it "
                             "None)")
    if m.drafts_with:
        if draft is None:
            raise ValueError(f"method {method!r} needs a draft model")
        if m.drafts_with == "head" and not isinstance(draft, Head):
            raise ValueError("method 'eagle' drafts with an EAGLE head (models.load_head), not a draft model")
        if m.drafts_with == "draft" and isinstance(draft, Head):
            raise ValueError(f"draft: an EAGLE head drafts only with method 'eagle' (method {method!r} drafts with a "
                             "draft model, models.load_model)")
        if draft.config.n_vocab != V:
            raise ValueError(f"target and draft must share the tokenizer: vocab sizes {V} != {draft.config.n_vocab}")
        if isinstance(draft, Head) and draft.n_feature != target.config.n_embd:
            raise ValueError(f"draft: an EAGLE head reads features of width {draft.n_feature}, the target's are "
                             f"{target.config.n_embd} wide (load the head with models.load_head(path, target))")
    m.check_rule(plan, temperature)
    if m.needs_ngram:
        if ngram is None:
            raise ValueError(f"method {method!r} needs an n-gram model")
        if ngram.n_vocab != V:
            raise ValueError(f"ngram: the trigram's vocabulary ({ngram.n_vocab} tokens) is not the target's ({V})")
    m.check_size(plan, target.config.n_ctx)
    return prompt


def check_stop(stop, decode_fn, n_vocab: int) -> tuple:
    """generate's stop strings as a tuple (one string is one stop string) and the function that decodes tokens for
    them (default: GPT-2's BPE for `n_vocab` tokens), or a one-line error naming the argument."""
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise TypeError(f"stop must be a list of non-empty strings (e.g. ['\\ndef']), got {stop!r:.60}")
    if decode_fn is not None and not callable(decode_fn):
        raise TypeError(f"decode_fn must be a function of token ids returning their text, got "
                        f"{type(decode_fn).__name__}")
    if not stop or decode_fn is not None:
        return tuple(stop), decode_fn
    if not 257 <= n_vocab <= GPT2_N_VOCAB:
        raise ValueError(f"stop: the target's {n_vocab} tokens have no GPT-2 tokenizer to decode them with: give "
                         "decode_fn, a function of token ids returning their text")
    enc = get_encoding(n_vocab)
    return tuple(stop), lambda tokens: decode(enc, tokens)


def check_prompt(prompt, target, draft=None, methods=None) -> list:
    """The prompt as a non-empty list of the target's token ids, shorter than the target's context
    and the draft's (given when the draft decodes; `methods`: see ContextFilled)."""
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
    if bad := [t for t in prompt if not integral(t)]:
        raise TypeError(f"prompt must be integer token ids, got {bad[0]!r}")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    V = target.config.n_vocab
    if bad := [t for t in prompt if not 0 <= t < V]:
        raise ValueError(f"prompt token id {bad[0]} is outside the target's vocabulary (0..{V - 1})")
    for name, model in (("target", target), ("draft", draft)):  # each feeds the whole prompt, then decodes below it
        if model is not None and len(prompt) >= model.config.n_ctx:
            raise ContextFilled(name, len(prompt), model.config.n_ctx, methods if name == "draft" else None)
    return prompt


class ContextFilled(ValueError):
    """A prompt that fills the context of the `model` ("target" or "draft"): a one-line error whose fields let a
    caller name the model its own way (the CLI names the option); a draft's names the `methods` that run none."""

    def __init__(self, model: str, n_tokens: int, n_ctx: int, methods=None):
        self.model = model
        other = ", ".join(name for name, m in (methods or {}).items() if not m.drafts_with)
        hint = f", or decode with a method that runs no draft ({other})" if other else ""
        super().__init__(f"the prompt has {n_tokens} tokens: the {model}'s context (n_ctx={n_ctx}) must hold more; "
                         f"shorten it{hint}")
