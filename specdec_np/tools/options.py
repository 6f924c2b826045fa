"""The command line's options in the plan's terms, and their checks, made before anything is loaded or measured.

The options that shape a plan set the `Plan` fields of the same names (`OPTIONS`). Which methods each
shapes follows from the methods' properties (`shapes`), where a rule is lossless from `verify.LOSSLESS`
(`lossless_on`); an option that would change nothing is an error.
"""

from __future__ import annotations

import dataclasses
import re

from .. import verify
from ..methods import METHODS
from ..plan import Plan
from .acceptance import PROFILED

# The Plan field each command-line option sets (--depth is also a chain's length).
OPTIONS = {"budget": "--budget", "depth": "--depth", "chain": "--depth", "lookup_chains": "--depth",
           "widths": "--widths", "sampled": "--sampled", "rule": "--rule", "copy_len": "--copy-len"}
SHAPING = ("budget", "depth", "widths", "sampled", "rule", "copy_len")  # the options' own fields, in order

# The core's tree kinds (verify.LOSSLESS's keys) in the command line's terms.
KINDS = {"deterministic": "trees of the draft's top tokens (no --sampled)",
         "with_replacement": "trees whose children are drawn from the draft with replacement (--sampled with, or "
                             "--method speculative at temperature > 0)",
         "without_replacement": "trees whose children are drawn from the draft without replacement (--sampled without)"}


def shapes(field: str, name: str) -> bool:
    """Whether the option setting plan `field` changes what method `name` drafts: a method that drafts
    has a depth and a rule, a tree a budget, the draft's trees widths and drawn children, staged copies."""
    m = METHODS[name]
    tree = m.drafts and not m.proposes_chain
    draft_tree = tree and m.runs_draft
    return {"depth": m.drafts, "rule": m.drafts, "budget": tree, "widths": draft_tree, "sampled": draft_tree,
            "copy_len": m.runs_draft and m.needs_ngram}[field]


def given(a) -> list[str]:
    """The plan fields the options given set, in SHAPING's order."""
    return [f for f in SHAPING if getattr(a, f) is not None]


def candidate_methods(a) -> tuple:
    """The methods the options allow: --method, else those every option given shapes (() when none
    narrows the choice): whether the options are valid never depends on what the measurement picks."""
    if a.method is not None:
        return (a.method,)
    return tuple(m for m in METHODS if all(shapes(f, m) for f in given(a))) if given(a) else ()


def profiled(name: str) -> bool:
    """Whether the machine's plan can price `name`: it drafts, and the acceptance profile holds it."""
    return METHODS[name].drafts and name in PROFILED


def reads(model: str, method: str | None, plan: str) -> bool:
    """Whether --method `method` (None: the machine's choice) with --plan `plan` reads the `model`
    ("draft" or "ngram"): it runs it, or its machine's plan is priced on the whole pair's profile."""
    m = METHODS.get(method)
    return m is None or (m.runs_draft if model == "draft" else m.needs_ngram) or plan == "machine" and profiled(method)


def resized(plan: Plan, method: str, budget: int | None = None, depth: int | None = None) -> Plan:
    """`plan` with --budget/--depth applied (None: unchanged): a chain's one length, or a best-first
    tree of the draft's top tokens (a drawn tree and the rule chosen for it do not carry over)."""
    if METHODS[method].proposes_chain:
        return plan if depth is None else dataclasses.replace(plan, chain=depth, lookup_chains=())
    if not METHODS[method].drafts or budget is None and depth is None:  # plain decoding has no tree to resize
        return plan
    return dataclasses.replace(plan, shape="best_first", sampled=None, rule=None,
                               budget=plan.budget if budget is None else budget,
                               depth=plan.depth if depth is None else depth)


def changed(plan: Plan, method: str, a) -> Plan:
    """`plan` with the options' changes: --budget/--depth resize it, the others set their fields."""
    change = {f: getattr(a, f) for f in ("sampled", "copy_len", "rule") if getattr(a, f) is not None}
    if a.widths is not None:
        change.update(shape="fixed", widths=parse_widths(a.widths))
    return dataclasses.replace(resized(plan, method, a.budget, a.depth), **change)


def check_fits(plan: Plan, method: str, n_ctx: int) -> None:
    """`Method.check_size` (a step's block within the target's context), its `field=value` as `--option value`."""
    try:
        METHODS[method].check_size(plan, n_ctx)
    except ValueError as e:
        raise ValueError(re.sub(r"\b([a-z_]+)=", lambda m: f"{OPTIONS[m[1]]} " if m[1] in OPTIONS else m[0],
                                str(e).removeprefix("plan: "))) from None


def lossless_on(rule: str) -> str:
    """Where `rule` is lossless (`verify.LOSSLESS`, `verify.CHAIN_RULES`), in the command line's terms."""
    if rule == "greedy":
        return "at --temperature 0"
    kinds = " or on ".join(KINDS[k] for k, (_, rules) in verify.LOSSLESS.items() if rule in rules)
    chain = " that are chains (--method speculative, or --widths 1,1,1)" if rule in verify.CHAIN_RULES else ""
    return f"on {kinds}{chain}"


def check_rule(plan: Plan, method: str, temperature: float) -> None:
    """Method.check_rule in the command line's terms, saying which options give such trees."""
    if not METHODS[method].lossless(plan, temperature):
        raise ValueError(f"--rule {plan.rule} is lossless only {lossless_on(plan.rule)}, not on the trees of method "
                         f"{method} ({describe(method, dataclasses.replace(plan, rule=None))})")


def check_rule_options(a) -> None:
    """--rule against what the other options already say of the trees, before any plan is chosen."""
    if a.rule is None or a.rule == "greedy":
        return
    m = METHODS.get(a.method)
    if m is not None and (m.proposes_chain or not m.runs_draft):  # a chain's trees, or the n-gram's: known now
        check_rule(changed(Plan(), a.method, a), a.method, a.temperature)
    if a.sampled is not None and a.rule not in verify.lossless_rules(f"{a.sampled}_replacement"):
        trees = f"trees drawn {a.sampled} replacement (--sampled {a.sampled})"
    elif a.rule in verify.CHAIN_RULES and a.widths is not None and max(parse_widths(a.widths)) > 1:
        trees = f"--widths {a.widths}"
    else:
        return
    raise ValueError(f"--rule {a.rule} is lossless only {lossless_on(a.rule)}, not on {trees}")


def parse_widths(text) -> list | None:
    """--widths "2,1,1" as [2, 1, 1]; None when not given."""
    widths = None if text is None else [int(w) if w.strip().isdecimal() else 0 for w in text.split(",")]
    if widths is not None and min(widths) < 1:
        raise ValueError(f"--widths {text!r}: give positive integers separated by commas, e.g. 2,1,1")
    return widths


def shown(value: str) -> str:
    """An option's value as an error shows it: a very long one cut short."""
    return value if len(value) <= 100 else f"{value[:60]}... ({len(value)} characters)"


def check_options(a) -> None:
    """One-line errors naming the option, before any model is loaded."""
    for option, value, low in (("--max-new-tokens", a.max_new_tokens, 0), ("--seed", a.seed, 0),
                               ("--top-k", a.top_k, 1), ("--budget", a.budget, 1), ("--depth", a.depth, 1),
                               ("--copy-len", a.copy_len, 0)):
        if value is not None and value < low:
            raise ValueError(f"{option} must be >= {low}, got {value}")
    if not a.temperature >= 0 or a.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0 (0 = greedy), got {a.temperature}")
    if a.top_p is not None and not 0 < a.top_p < 1:
        raise ValueError(f"--top-p must be in (0, 1) (1 keeps every token, changing nothing), got {a.top_p}")
    parse_widths(a.widths)
    for option, value in (("--file", a.file), ("--target", a.target), ("--draft", a.draft), ("--ngram", a.ngram)):
        if value is not None and not value.strip():
            raise ValueError(f"{option} is empty: give a {'file' if option == '--file' else 'file or model'} name")
    # Options that would change nothing are errors, whichever method the machine's plan picks later.
    if a.temperature == 0:
        # Nothing is drawn at temperature 0 unless --sampled draws the trees (greedy plans never do).
        for option, value in (("--top-k", a.top_k), ("--top-p", a.top_p), ("--seed", None if a.sampled else a.seed),
                              ("--rule", None if a.rule == "greedy" else a.rule)):
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
        for field in given(a):
            if not shapes(field, a.method):
                raise ValueError(f"{OPTIONS[field]} does nothing with --method {a.method}, whose plan is "
                                 f"{describe(a.method, Plan())}: it applies to --method "
                                 + ", ".join(m for m in METHODS if shapes(field, m)))
    # (A chain method's --depth is its length: --widths and --sampled do nothing with it, said above.)
    best_first = "--budget" if a.budget is not None else "--depth" if a.depth is not None else None
    fixed = "--widths" if a.widths is not None else "--sampled" if a.sampled is not None else None
    if best_first and fixed:
        raise ValueError(f"{best_first} asks for a best-first tree, {fixed} for a fixed-width one: give one")
    check_rule_options(a)


# ----------------------------------------------------------------------------- a plan in words

def describe(method: str, plan: Plan) -> str:
    """`plan` in words, as `method` uses it."""
    m = METHODS[method]
    rule = f"; {plan.rule} verification" if plan.rule in ("block", "traversal") else ""  # the others are defaults
    if not m.drafts:
        return "plain decoding (no drafts)"
    if method == "lookup" and plan.lookup_chains:
        k3, k2, k1 = plan.lookup_chains
        return f"a chain copied from the context, {k3} tokens after a match of 3, {k2} after 2, {k1} after 1" + rule
    if m.proposes_chain:
        return f"a chain of {plan.chain}" + (" copied from the context" if method == "lookup" else "") + rule
    widths = ",".join(map(str, plan.widths))
    if not (m.runs_draft and m.fixed_widths(plan)):
        text = f"best-first, {plan.budget} nodes at most {plan.depth} deep"
    elif plan.sampled:
        text = f"widths {widths} drawn from the draft ({plan.sampled} replacement)"
    else:
        text = f"the draft's top tokens, widths {widths}"
    if m.runs_draft and m.needs_ngram:
        guesses = (f"n-gram guesses {plan.guess_len} deep ({plan.guess_rows} rows)" if plan.guess_len
                   else "no n-gram guesses")
        text += f"; {guesses}; " + (f"copies of {plan.copy_len}" if plan.copy_len else "no copies")
    return text + rule
