"""The command line's options in the plan's terms, and their checks, made before anything is loaded or measured.

The options set the `Plan` fields and `generate` arguments the core's messages name (`OPTIONS`). Which methods each
shapes follows from the methods (`shapes`); whether a rule is lossless, from `Method.lossless` (words: `lossless_on`).
"""

from __future__ import annotations

from .. import verify
from ..checks import check_cuts, check_settings, needless
from ..methods import METHODS
from ..plan import Plan
from ..values import FieldError, field_is, value_is
from .acceptance import PROFILED
from .choice import changed, describe

# The option that sets each Plan field or `generate` argument (--depth is also a chain's length).
OPTIONS = {"budget": "--budget", "depth": "--depth", "chain": "--depth", "lookup_chains": "--depth",
           "widths": "--widths", "sampled": "--sampled", "rule": "--rule", "min_q": "--min-q", "copy_len": "--copy-len",
           "seed": "--seed", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
           "max_new_tokens": "--max-new-tokens"}
SHAPING = ("budget", "depth", "widths", "sampled", "rule", "min_q", "copy_len")  # the options' own fields, in order

# The core's tree kinds (verify.LOSSLESS's keys) in the command line's terms.
KINDS = {"deterministic": "trees of the draft's top tokens (no --sampled)",
         "with_replacement": "trees whose children are drawn from the draft with replacement (--sampled with, or "
                             "--method speculative at temperature > 0)",
         "without_replacement": "trees whose children are drawn from the draft without replacement (--sampled without)"}


def option_is(name: str, *value) -> str:
    """A field (and its value) as the command line words it: "--budget 8" (one no option sets: "guess_len=3")."""
    return " ".join([OPTIONS[name], *map(value_is, value)]) if name in OPTIONS else field_is(name, *value)


def as_option(error: FieldError) -> ValueError:
    """A core check's error (its field, value and why) naming the field by its option (`option_is`)."""
    return ValueError(error.words(option_is))


def shapes(field: str, name: str) -> bool:
    """Whether the option setting plan `field` changes what method `name` drafts."""
    m = METHODS[name]
    tree = m.drafts and not m.proposes_chain
    draft_tree = tree and m.drafts_with is not None
    return {"depth": m.drafts, "rule": m.drafts, "budget": tree, "widths": draft_tree, "sampled": draft_tree,
            "min_q": m.drafts_with is not None, "copy_len": m.drafts_with is not None and m.needs_ngram}[field]


def candidate_methods(a) -> tuple:
    """The methods the options allow: --method, else those every option given shapes (() when none narrows the
    choice): whether the options are valid never depends on what the measurement picks."""
    if a.method is not None:
        return (a.method,)
    return tuple(m for m in METHODS if all(shapes(f, m) for f in changes(a))) if changes(a) else ()


def changes(a) -> dict:
    """The plan fields the options given set, in SHAPING's order: their changes to the plan (`choice.changed`)."""
    return {f: parse_widths(a.widths) if f == "widths" else getattr(a, f) for f in SHAPING
            if getattr(a, f) is not None}


def profiled(name: str) -> bool:
    """Whether the machine's plan can price `name`: it drafts, and the acceptance profile holds it."""
    return METHODS[name].drafts and name in PROFILED


def reads(model: str, method: str | None, plan: str) -> bool:
    """Whether --method `method` (None: the machine's choice) with --plan `plan` runs or prices with `model`."""
    m = METHODS.get(method)
    runs = m is None or (m.drafts_with is not None if model == "draft" else m.needs_ngram)
    return runs or plan == "machine" and profiled(method)


def check_fits(plan: Plan, method: str, n_ctx: int) -> None:
    """`Method.check_size` (a step's block within the target's context), its fields named by their options."""
    try:
        METHODS[method].check_size(plan, n_ctx)
    except FieldError as e:
        raise as_option(e) from None


def lossless_on(rule: str) -> str:
    """Where `rule` is lossless (verify.lossless_rules: which kinds of tree, chains only?), in the options' words."""
    kinds = [KINDS[k] for k in verify.LOSSLESS if rule in verify.lossless_rules(k)]
    chains = not any(rule in verify.lossless_rules(k, chain=False) for k in verify.LOSSLESS)
    return "at --temperature 0" if rule == "greedy" else \
        "on " + " or on ".join(kinds) + " that are chains (--method speculative, or --widths 1,1,1)" * chains


def check_rule(plan: Plan, method: str, temperature: float) -> None:
    """Method.lossless's answer in the command line's terms, saying which options give such trees."""
    if not METHODS[method].lossless(plan, temperature):
        raise ValueError(f"--rule {plan.rule} is lossless only {lossless_on(plan.rule)}, not on the trees of method "
                         f"{method} ({describe(method, changed(plan, method, {'rule': None}))})")


def check_rule_options(a) -> None:
    """--rule against what the other options fix of the trees, before any plan is chosen: lossless on the trees of a
    method they allow under some plan (a chain or a tree; top tokens, or drawn with or without replacement)."""
    if a.rule in (None, "greedy") or any(METHODS[m].nearest_lossless(Plan(), a.temperature,
                                                                     lambda p, m=m: changed(p, m, changes(a)))
                                         for m in candidate_methods(a)):
        return
    fixed = [f"--method {a.method}"] * (a.method is not None) + [option_is(f, v) for f, v in changes(a).items()
                                                                   if f != "rule"]
    raise ValueError(f"--rule {a.rule} is lossless only {lossless_on(a.rule)}, not on the trees of {' '.join(fixed)}")


def parse_widths(text: str) -> tuple:
    """--widths "2,1,1" as (2, 1, 1)."""
    widths = tuple(int(w) if w.strip().isdecimal() else 0 for w in text.split(","))
    if min(widths) < 1:
        raise ValueError(f"--widths {text!r}: give positive integers separated by commas, e.g. 2,1,1")
    return widths


def at_least(low: int, **options) -> None:
    """Each option given (`max_new_tokens=...` for --max-new-tokens) at least `low`, else an error naming it."""
    for name, value in options.items():
        if value is not None and value < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def shown(value: str) -> str:
    """An option's value as an error shows it: a very long one cut short."""
    return value if len(value) <= 100 else f"{value[:60]}... ({len(value)} characters)"


def check_options(a) -> None:
    """One-line errors naming the option, before any model is loaded."""
    at_least(0, max_new_tokens=a.max_new_tokens, seed=a.seed)
    try:  # the core's checks of the sampling settings and the plan's fields, named by their options
        check_settings(a.temperature, a.top_k, a.top_p)
        check_cuts(a.top_k, a.top_p)  # top_k against the vocabulary once the target is loaded (cli.setup)
        Plan(**changes(a))
    except FieldError as e:
        raise as_option(e) from None
    for option, value in (("--file", a.file), ("--target", a.target), ("--draft", a.draft), ("--ngram", a.ngram)):
        if value is not None and not value.strip():
            raise ValueError(f"{option} is empty: give a {'file' if option == '--file' else 'file or model'} name")
    # Options that would change nothing are errors, whichever method the machine's plan picks later.
    if a.temperature == 0:  # nothing is drawn: --seed and --rule matter only where --sampled draws the trees
        given = {"--seed": None if a.sampled else a.seed, "--rule": None if a.rule == "greedy" else a.rule}
        if sampling := needless(0, a.top_k, a.top_p):
            given = {OPTIONS[sampling]: getattr(a, sampling)} | given
        for option, value in given.items():
            if value is not None:
                raise ValueError(f"{option} {value}: at temperature 0 decoding is greedy (the most likely token), so "
                                 "it changes nothing: give --temperature > 0 to sample")
    if a.recalibrate and (a.plan == "default" or a.method is not None and not profiled(a.method)):
        plan = "--plan default" if a.plan == "default" else f"--method {a.method}"
        raise ValueError(f"--recalibrate does nothing with {plan}: it decodes with the constant plan, unmeasured")
    for model in ("draft", "ngram"):
        if getattr(a, model) is not None and not reads(model, a.method, a.plan):
            raise ValueError(f"--{model} does nothing with --method {a.method} and --plan {a.plan}: it applies to "
                             f"--method {', '.join(m for m in METHODS if reads(model, m, a.plan))}")
    if a.method is not None:
        for field in changes(a):
            if not shapes(field, a.method):
                raise ValueError(f"{OPTIONS[field]} does nothing with --method {a.method}, whose plan is "
                                 f"{describe(a.method, Plan())}: it applies to --method "
                                 + ", ".join(m for m in METHODS if shapes(field, m)))
    best_first = "--budget" if a.budget is not None else "--depth" if a.depth is not None else None
    fixed = "--widths" if a.widths is not None else "--sampled" if a.sampled is not None else None
    if best_first and fixed:
        raise ValueError(f"{best_first} asks for a best-first tree, {fixed} for a fixed-width one: give one")
    if a.min_q is not None and not (fixed or a.method == "speculative"):  # a best-first tree has its own budget
        raise ValueError(f"--min-q {a.min_q} stops a fixed-width tree or a chain: give --widths or --sampled (or "
                         "--method speculative) with it")
    check_rule_options(a)
