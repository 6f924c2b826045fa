"""The plan that runs, and why: the one home of every command's plan (`choose`), and a plan in words (`describe`).

Sequoia-style, from the pair's acceptance profile (`acceptance.py`) and this machine's costs (`calibration.py`): the
candidate with the fewest predicted ms per token whose rule is lossless once the user's options change it; else the
constant plan with them, and why. eagle's plans are priced with its EAGLE head's cost curve in the draft's place.
"""

from __future__ import annotations

import dataclasses
import sys

from ..methods import METHODS
from ..plan import Plan, constant
from . import acceptance
from .cache import cache_path, read_json, store, writable
from .calibration import Busy, calibration, priced, with_head
from .costcurve import apply_layout
from .costmodel import machine_layout, pads, pass_ms, record_ms
from .machine import settle_threads

MARGIN = 1.10  # a drafting plan must be predicted this much faster than plain decoding (the model errs by ~10%)
PROFILE_SECONDS = 120  # a pair with no shipped profile is profiled on first use in about this long
PROFILE_SIZES = ((12, 128), (6, 96), (4, 64), (3, 48), (2, 32))  # (prompts, new tokens), largest first
# Why a plan is the constant one, in the words every command prints (Choice.constant): CONSTANT_BECAUSE + why.
CONSTANT_BECAUSE = "the constant plan: "
NO_HEAD = "no EAGLE head to measure"
SAME_TREE = "the head against the draft on the same tree"  # why a head runs its draft twin's plan (`on_twins_tree`)


def no_plans(methods) -> str:
    """Why `methods` (names) run the constant plan: the acceptance profile holds none of their plans."""
    return f"the acceptance profile holds no {', '.join(methods)} plans"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A method and its plan, the cost model's prediction (ms per token) and plain decoding's, and why (`reason`)."""

    method: str
    plan: Plan
    ms_per_token: float = float("nan")
    baseline_ms_per_token: float = float("nan")
    layout: dict = dataclasses.field(default_factory=dict)  # slab rows and padding tables: `apply_layout`
    constant: str = ""  # why the plan is the constant one, in words ("" when measured)
    among: tuple = ()  # the methods it was the fastest of, when asked for several
    changed: bool = False  # the options the user gave changed the plan

    @property
    def speedup(self) -> float:
        return self.baseline_ms_per_token / self.ms_per_token

    def reason(self) -> str:
        """Why it runs: measured (among which methods), or the constant plan and why; and whether options changed it."""
        among = f" of {', '.join(self.among)}" if len(self.among) > 1 else ""
        why = self.constant or f"this machine's measured plan{among}, predicted {self.speedup:.2f}x plain decoding"
        return why + ", changed by options" * self.changed

    def models(self, target, draft):
        """(target, draft) laid out as this machine multiplies them fastest (`apply_layout`)."""
        return apply_layout(self.layout, target, draft)


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def changed(plan: Plan, method: str, changes: dict) -> Plan:
    """`plan` as `method` runs it with the fields the user set (`changes`, e.g. {"budget": 16}): a depth is a chain's
    length; a budget or a depth makes a tree best-first, of top tokens (no drawn children, no rule chosen for them)."""
    m, new = METHODS[method], dict(changes)
    sizes = {f: new.pop(f) for f in ("budget", "depth") if f in new}
    if m.proposes_chain and "depth" in sizes:
        new |= {"chain": sizes["depth"], "lookup_chains": ()}
    elif m.drafts and not m.proposes_chain and sizes:
        new = {"shape": "best_first", "sampled": None, "rule": None} | sizes | new
    return dataclasses.replace(plan, **new | ({"shape": "fixed"} if "widths" in new else {}))


def choose(target, draft, ngram, enc, temperature=0.0, asked=(None,), plan="machine", changes=None, recalibrate=False,
           costs=None, keep=None, progress=None, head=None) -> dict:
    """{each asked (a method; methods: the fastest of them; None: of all): the Choice that runs}: this
    machine's fastest plan `keep(profile record)` keeps, lossless with the user's `changes`, priced on `costs`
    (default: `calibration`'s), else the constant plan with them. A head's unmeasured plan is its draft twin's."""
    twins = {key: draft_twin(key) for key in asked if isinstance(key, str) and METHODS[key].drafts_with == "head"}
    got = choose_each(target, draft, ngram, enc, temperature, tuple(dict.fromkeys((*asked, *twins.values()))), plan,
                      changes, recalibrate, costs, keep, progress, head)
    return {key: on_twins_tree(got[key], got[twins[key]]) if key in twins and got[key].constant else got[key]
            for key in asked}


def draft_twin(method: str) -> str:
    """The method whose trees `method` drafts with a head: its class's nearest base that drafts with the draft."""
    return next(c.name for c in METHODS[method].__mro__ if getattr(c, "drafts_with", None) == "draft")


def on_twins_tree(own: Choice, twin: Choice) -> Choice:
    """A head's Choice where none of its plans is measured (`own`): its draft twin's plan instead, and why."""
    why = f"{twin.method}'s plan, {SAME_TREE} ({own.constant})"
    why += f"; {twin.method}'s: {twin.constant}" if twin.constant and twin.constant != own.constant else ""
    return Choice(own.method, twin.plan, layout=twin.layout, constant=why, among=own.among, changed=twin.changed)


def choose_each(target, draft, ngram, enc, temperature, asked, plan, changes, recalibrate, costs, keep, progress,
                head) -> dict:
    """`choose`'s choices, a head's unmeasured one the constant plan."""
    changes, among = changes or {}, {key: (key,) if isinstance(key, str) else key for key in asked}

    def unmeasured(methods) -> str:  # why these methods run the constant plan unmeasured ("": measure them)
        heads_only = bool(methods) and all(METHODS[m].drafts_with == "head" for m in methods)
        return ("the baseline" if methods and not any(METHODS[m].drafts for m in methods) else
                "the constant plan, as --plan default asks" if plan == "default" else
                CONSTANT_BECAUSE + NO_HEAD if heads_only and head is None else
                CONSTANT_BECAUSE + no_plans(methods) if methods and not set(methods) & set(acceptance.PROFILED) else
                CONSTANT_BECAUSE + "no draft model, no pair to measure" if draft is None else
                # Only the shipped profile holds a head's plans (a first-use profile has no head): none to measure.
                CONSTANT_BECAUSE + no_plans(methods) if heads_only and (acceptance.shipped() or {}).get("models")
                != acceptance.pair_key(target, draft, ngram) else "")

    def const(methods, why):  # the first of `methods` with a lossless plan nearest the constant plan, changed
        base = constant(temperature)
        nearest = ((m, METHODS[m].nearest_lossless(base, temperature, lambda p, m=m: changed(p, m, changes)))
                   for m in methods)
        m, p = next(((m, p) for m, p in nearest if p), (methods[0], changed(base, methods[0], changes)))
        return Choice(m, p, constant=why, among=tuple(methods), changed=p != base)

    def fell_back(why: str) -> dict:  # the rest's constant plans, said in one line (None: lookup, greedy; else ar)
        rest = {key: const(among[key] or (("lookup",) if temperature == 0 else ("ar",)), CONSTANT_BECAUSE + why)
                for key in asked}
        used = "; ".join(f"{c.method} with {describe(c.method, c.plan)}" for c in rest.values())
        slow = ", which may be slower than plain decoding" * any(METHODS[c.method].drafts for c in rest.values())
        sys.stderr.write(f"note: {why}; using {used} (the constant plan{slow})\n")
        return out | rest
    out = {key: const(among[key] or ("staged",), why) for key in asked if (why := unmeasured(among[key]))}
    if not (asked := [key for key in asked if key not in out]):
        return out
    threads, prompts, setting = settle_threads(), acceptance.calibration_prompts(enc), setting_name(temperature)
    given = costs is not None
    try:
        costs = costs or calibration(target, draft, ngram, prompts, recalibrate)[0]
    except Busy as e:
        if recalibrate:
            raise ValueError(f"--recalibrate: {e}; rerun it when the machine is quieter") from None
        return fell_back(str(e))
    if threads:
        sys.stderr.write(f"note: this machine is busy ({threads}): BLAS uses one thread\n")
    profile = acceptance_profile(target, draft, ngram, prompts, setting, costs, progress)
    if setting not in profile["settings"]:
        return fell_back(f"{acceptance.PROFILE_FILE} has no {setting} profile")
    no_head = head_missing(profile, setting, head)
    if head is not None and not no_head and not priced(costs, head):
        try:  # measured once, kept with this machine's cached costs (not with costs given)
            costs = with_head(costs, target, head) if given else calibration(target, draft, ngram, prompts,
                                                                              head=head)[0]
        except Busy as e:
            no_head = CONSTANT_BECAUSE + str(e)
    for key in asked:
        if among[key] and all(METHODS[m].drafts_with == "head" for m in among[key]) and no_head:
            out[key] = const(among[key], no_head)
            continue
        ran = tuple(m for m in among[key] or () if not no_head or METHODS[m].drafts_with != "head")  # it can run
        try:
            chosen = fastest(profile, costs, temperature, among[key], draft is not None, ngram is not None,
                             keep=lambda r: METHODS[r["method"]].lossless(
                                 changed(Plan(**r["shape"]), r["method"], changes), temperature)
                             and (keep is None or keep(r)), has_head=not no_head)
        except ValueError:  # none of these methods' plans in the profile is lossless for the rule
            asked_for = f"--rule {changes['rule']}" if changes.get("rule") else "these options"
            none = f"the profile has no plan of {', '.join(ran or METHODS)} lossless for {asked_for}"
            out[key] = const(ran or ("staged",), CONSTANT_BECAUSE + none)
            continue
        shaped = changed(chosen.plan, chosen.method, changes)
        out[key] = dataclasses.replace(chosen, plan=shaped, layout=machine_layout(costs),
                                       among=ran, changed=shaped != chosen.plan)
    return out


def head_missing(profile: dict, setting: str, head) -> str:
    """Why `profile`'s eagle records cannot price `head`'s plans in `setting` ("" if they can)."""
    if head is None:
        return CONSTANT_BECAUSE + NO_HEAD
    heads = [m for m in METHODS if METHODS[m].drafts_with == "head"]
    if not any(r["method"] in heads for r in profile["settings"].get(setting, ())):
        return CONSTANT_BECAUSE + no_plans(heads)
    if profile.get("head") != acceptance.head_key(head):
        return CONSTANT_BECAUSE + no_plans(heads) + " of this EAGLE head"
    return ""


def fastest(profile: dict, costs: dict, temperature: float, among=None, has_draft=True, has_ngram=True,
            keep=None, has_head=False) -> Choice:
    """The fastest candidate `keep(record)` keeps of the methods `among` (None: all; drafting beats plain by MARGIN)."""
    setting, among = setting_name(temperature), (among,) if isinstance(among, str) else among
    if setting not in profile["settings"]:
        raise ValueError(f"the profile has no {setting} setting")
    curves, overheads, pad = costs["curves"], costs["overheads"][setting], pads(costs["curves"])
    usable = acceptance.runnable(has_draft, has_ngram, has_head and "head" in curves)

    priced = [(record_ms(r, curves, overheads, method=r["method"], **pad) / r["tokens"], r["method"], r["shape"])
              for r in profile["settings"][setting] if r["method"] in usable
              and (among is None or r["method"] in among) and r["tokens"] and (keep is None or keep(r))]
    if not priced:
        raise ValueError(f"the profile has no candidate of {among or 'any method'}")
    plain = next(r for r in profile["settings"][setting] if not METHODS[r["method"]].drafts)
    base = record_ms(plain, curves, overheads) / plain["tokens"]
    ms, m, shape = min(priced, key=lambda x: (x[0], x[1], str(x[2])))
    if among is None and METHODS[m].drafts and base / ms < MARGIN:
        ms, m, shape = base, plain["method"], {}
    return Choice(m, Plan(**shape), ms, base)


def acceptance_profile(target, draft, ngram, prompts, setting: str, costs: dict, progress=None) -> dict:
    """The pair's acceptance profile: shipped, else cached, else measured now (`profile_size`) and cached."""
    key = acceptance.pair_key(target, draft, ngram)
    if (shipped := acceptance.shipped()) is not None and shipped["models"] == key:
        return shipped
    path = cache_path("profile", {"models": key, "version": acceptance.VERSION, "setting": setting})
    if (cached := read_json(path)) is not None:
        try:
            return acceptance.from_json(cached)
        except ValueError as e:
            sys.stderr.write(f"note: {path}: {e}: profiling again\n")
    usable = acceptance.runnable(draft is not None, ngram is not None)
    grid = {setting: [c for c in acceptance.candidates(setting, quick=True) if c[0] in usable]}
    seeds = 2  # runs per prompt when sampling
    # Per token: a target pass and two draft passes (random-weight GPT-2 pairs took 1.4x this estimate).
    ms = pass_ms(costs["curves"], "target", "warm", 1) + 2 * pass_ms(costs["curves"], "draft", "cold", 1)
    runs = len(grid[setting]) * len(acceptance.run_seeds(0, acceptance.SETTINGS[setting]["temperature"], seeds))
    n_prompts, tokens, seconds = profile_size(runs, ms)
    about = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    sys.stderr.write(f"profiling this pair's acceptance ({setting}; cached for later runs): {len(grid[setting])} "
                     f"candidate plans on {n_prompts} prompts x {tokens} tokens, about {about}\n")
    cache = writable(path)
    measured = acceptance.measure(target, draft, ngram, prompts[:n_prompts], max_new_tokens=tokens, seeds=seeds,
                                grid=grid, progress=progress)
    if cache:
        store(path, measured)
    return measured


def profile_size(n_runs: int, ms_per_token: float) -> tuple[int, int, float]:
    """(prompts, new tokens, seconds) of a first-use profile: the largest PROFILE_SIZES within PROFILE_SECONDS."""
    sizes = [(prompts, tokens, n_runs * prompts * tokens * ms_per_token / 1000) for prompts, tokens in PROFILE_SIZES]
    return next((size for size in sizes if size[2] <= PROFILE_SECONDS), sizes[-1])


def describe(method: str, plan: Plan) -> str:
    """`plan` in words, as `method` uses it."""
    m = METHODS[method]
    rule = f"; {plan.rule} verification" if plan.rule in ("block", "traversal") else ""  # the others are defaults
    if not m.drafts:
        return "plain decoding (no drafts)"
    if method == "lookup" and plan.lookup_chains:
        k3, k2, k1 = plan.lookup_chains
        return f"a chain copied from the context, {k3} tokens after a match of 3, {k2} after 2, {k1} after 1" + rule
    if m.drafts_with and (m.proposes_chain or m.fixed_widths(plan)) and plan.min_q:  # a doubted token is a leaf
        rule = f"; stopping below a token of q < {plan.min_q:g}" + rule
    if m.proposes_chain:
        return f"a chain of {plan.chain}" + (" copied from the context" if method == "lookup" else "") + rule
    widths, drafter = ",".join(map(str, plan.widths)), f"the {m.drafts_with}"
    if not (m.drafts_with and m.fixed_widths(plan)):
        text = f"best-first, {plan.budget} nodes at most {plan.depth} deep"
    elif plan.sampled:
        text = f"widths {widths} drawn from {drafter} ({plan.sampled} replacement)"
    else:
        text = f"{drafter}'s top tokens, widths {widths}"
    if m.drafts_with and m.needs_ngram:
        guesses = (f"n-gram guesses {plan.guess_len} deep ({plan.guess_rows} rows)" if plan.guess_len
                   else "no n-gram guesses")
        text += f"; {guesses}; " + (f"copies of {plan.copy_len}" if plan.copy_len else "no copies")
    return text + rule
