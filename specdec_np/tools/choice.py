"""The plan that runs, and why: the one home of every command's plan (`choose`).

Sequoia-style, from the pair's acceptance profile (`acceptance.py`) and this machine's costs
(`calibration.py`): the candidate with the fewest predicted ms per token that the rule verifies
losslessly; else the constant plan: asked for, no pair to price, a machine too busy to measure, no
profile for the setting, or none of the method's plans lossless for the rule.
"""

from __future__ import annotations

import dataclasses
import sys

from ..methods import METHODS
from ..plan import Plan, constant
from . import acceptance
from .cache import cache_path, read_json, store, writable
from .calibration import Busy, calibration
from .costcurve import apply_layout
from .costmodel import pads, pass_ms, record_ms
from .machine import settle_threads
from .options import describe

MARGIN = 1.10  # a drafting plan must be predicted this much faster than plain decoding (the model errs by ~10%)
PROFILE_SECONDS = 120  # a pair with no shipped profile is profiled on first use in about this long
PROFILE_SIZES = ((12, 128), (6, 96), (4, 64), (3, 48), (2, 32))  # (prompts, new tokens), largest first


@dataclasses.dataclass(frozen=True)
class Choice:
    """A method and its plan, the cost model's prediction (ms per token) and plain decoding's, and why (`reason`)."""

    method: str
    plan: Plan
    ms_per_token: float = float("nan")
    baseline_ms_per_token: float = float("nan")
    layout: dict = dataclasses.field(default_factory=dict)  # slab rows and padding tables: `apply_layout`
    constant: str = ""  # why the plan is the constant one, in words ("" when measured)

    @property
    def speedup(self) -> float:
        return self.baseline_ms_per_token / self.ms_per_token

    def reason(self, among: str = "") -> str:
        """Why it runs: measured (`among` the methods, e.g. " of tree, staged"), or the constant plan and why."""
        return self.constant or f"this machine's measured plan{among}, predicted {self.speedup:.2f}x plain decoding"

    def models(self, target, draft):
        """(target, draft) laid out as this machine multiplies them fastest (`apply_layout`)."""
        return apply_layout(self.layout, target, draft)


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def choose(target, draft, ngram, enc, temperature=0.0, asked=(None,), plan="machine", rule=None, recalibrate=False,
           costs=None, keep=None, progress=None) -> dict:
    """{method `asked` (None: the fastest of all): the Choice that runs}: this machine's fastest plan that `rule`
    verifies losslessly and `keep(profile record)` keeps, priced on `costs` (default: this machine's, measured at
    most once, `calibration`); else the constant plan and why. The commands call this and print `reason()`."""
    def const(m, why):  # m (None: staged) with the constant plan
        return constant_choice(m or "staged", temperature, rule, why)
    out = {m: const(m, "the baseline") for m in asked if m and not METHODS[m].drafts}
    asked = [m for m in asked if m not in out]
    if plan == "default":
        return out | {m: const(m, "the constant plan, as --plan default asks") for m in asked}
    out |= {m: const(m, f"the constant plan: the acceptance profile holds no {m} plans")
            for m in asked if m and m not in acceptance.PROFILED}
    asked = [m for m in asked if m not in out]
    if draft is None or not asked:
        return out | {m: const(m, "the constant plan: no draft model, no pair to measure") for m in asked}
    threads = settle_threads()
    prompts = acceptance.calibration_prompts(enc)
    setting = setting_name(temperature)
    try:
        costs = costs or calibration(target, draft, ngram, prompts, recalibrate)[0]
    except Busy as e:
        if recalibrate:
            raise ValueError(f"--recalibrate: {e}; rerun it when the machine is quieter") from None
        return out | fell_back(asked, temperature, rule, str(e))
    if threads:
        sys.stderr.write(f"note: this machine is busy ({threads}): BLAS uses one thread\n")
    profile = acceptance_profile(target, draft, ngram, prompts, setting, costs, progress)
    if setting not in profile["settings"]:
        return out | fell_back(asked, temperature, rule, f"{acceptance.PROFILE_FILE} has no {setting} profile")
    for m in asked:
        try:
            chosen = fastest(profile, costs, temperature, m, draft is not None, ngram is not None,
                             keep=lambda r: METHODS[r["method"]].lossless(
                                 Plan(**r["shape"] | ({"rule": rule} if rule else {})), temperature)
                             and (keep is None or keep(r)))
            out[m] = dataclasses.replace(chosen, layout=costs["layout"] | pads(costs["curves"]))
        except ValueError:  # no plan of m in the profile is lossless for the rule
            out[m] = const(m, f"the constant plan: the profile has no plan of {m} for --rule {rule}")
    return out


def fastest(profile: dict, costs: dict, temperature: float, method: str | None = None, has_draft=True,
           has_ngram=True, keep=None) -> Choice:
    """The fastest candidate `keep(record)` keeps (of `method`, or of all: drafting must beat plain by MARGIN)."""
    setting = setting_name(temperature)
    if setting not in profile["settings"]:
        raise ValueError(f"the profile has no {setting} setting")
    curves, overheads, pad = costs["curves"], costs["overheads"][setting], pads(costs["curves"])
    priced = [(record_ms(r, curves, overheads, **pad) / r["tokens"], r["method"], r["shape"])
              for r in profile["settings"][setting] if r["method"] in acceptance.runnable(has_draft, has_ngram)
              and method in (None, r["method"]) and r["tokens"] and (keep is None or keep(r))]
    if not priced:
        raise ValueError(f"the profile has no candidate for method {method!r}")
    plain = next(r for r in profile["settings"][setting] if not METHODS[r["method"]].drafts)
    base = record_ms(plain, curves, overheads) / plain["tokens"]
    ms, m, shape = min(priced, key=lambda x: (x[0], x[1], str(x[2])))
    if method is None and METHODS[m].drafts and base / ms < MARGIN:
        ms, m, shape = base, plain["method"], {}
    return Choice(m, Plan(**shape), ms, base)


def constant_choice(method: str, temperature: float, rule: str | None, why: str) -> Choice:
    """`method` with the constant plan, its trees drawn as `rule` needs (e.g. without replacement), and `why`."""
    plan = dataclasses.replace(constant(temperature), rule=rule)
    tried = (dataclasses.replace(plan, sampled=s) for s in (plan.sampled, None, "without", "with"))
    return Choice(method, next((p for p in tried if METHODS[method].lossless(p, temperature)), plan), constant=why)


def fell_back(asked, temperature: float, rule, why: str) -> dict:
    """{method: the constant plan}, said in one line naming each plan: for the machine's choice, prompt lookup at
    temperature 0 (a copied chain costs no draft pass), plain decoding when sampling (rejections cost more)."""
    out = {m: constant_choice(m or ("lookup" if temperature == 0 else "ar"), temperature, rule,
                              f"the constant plan: {why}") for m in asked}
    used = "; ".join(f"{c.method} with {describe(c.method, c.plan)}" for c in out.values())
    slow = ", which may be slower than plain decoding" * any(METHODS[c.method].drafts for c in out.values())
    sys.stderr.write(f"note: {why}; using {used} (the constant plan{slow})\n")
    return out


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
