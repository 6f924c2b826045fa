"""This machine's plan: the method and Plan the cost model predicts fastest for a model pair on this CPU.

Sequoia-style, from the pair's acceptance profile (`acceptance.py`) and this machine's costs
(`calibration.py`): the candidate with the fewest predicted ms per token that the rule verifies
losslessly; on a machine too busy to measure, or without a profile, the constant plan (`fallback`).
"""

from __future__ import annotations

import dataclasses
import sys

from ..methods import METHODS
from ..plan import Plan, constant
from . import acceptance as profiles
from .cache import cache_path, read_json, store, writable
from .calibration import Busy, calibration
from .costcurve import apply_layout
from .costmodel import pads, pass_ms, record_ms
from .machine import settle_threads
from .options import describe
from .progress import Progress

MARGIN = 1.10  # a drafting plan must be predicted this much faster than plain decoding (the model errs by ~10%)
PROFILE_SECONDS = 120  # a pair with no shipped profile is profiled on first use in about this long
PROFILE_SIZES = ((12, 128), (6, 96), (4, 64), (3, 48), (2, 32))  # (prompts, new tokens), largest first


@dataclasses.dataclass(frozen=True)
class Choice:
    """A method and its plan, with the cost model's prediction (ms per token) and plain decoding's."""

    method: str
    plan: Plan
    ms_per_token: float
    baseline_ms_per_token: float
    layout: dict = dataclasses.field(default_factory=dict)  # slab rows and padding tables: `apply_layout`
    busy: str = ""  # why the plan is the constant one, not a measured choice ("" when measured)

    @property
    def speedup(self) -> float:
        return self.baseline_ms_per_token / self.ms_per_token

    def models(self, target, draft):
        """(target, draft) laid out as this machine multiplies them fastest (`apply_layout`)."""
        return apply_layout(self.layout, target, draft)


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def measuring() -> Progress:
    """The measurement's progress line (a quiet first run; later, invalid cached costs or --recalibrate)."""
    return Progress("measuring this machine's costs (cached for later runs)", unit=lambda n: f"{n} parts")


def plans_for(target, draft, ngram, enc, temperature=0.0, methods=(None,), recalibrate=False, progress=None,
              rule=None) -> dict:
    """{method (None: the fastest of all): this machine's plan} that `rule` verifies losslessly (busy: `fallback`)."""
    threads = settle_threads()
    prompts = profiles.calibration_prompts(enc)
    setting = setting_name(temperature)
    try:
        costs, _ = calibration(target, draft, ngram, prompts, recalibrate, progress or measuring())
    except Busy as e:
        if recalibrate:
            raise ValueError(f"--recalibrate: {e}; rerun it when the machine is quieter") from None
        return fell_back(methods, temperature, rule, str(e))
    if costs.get("busy"):
        return fell_back(methods, temperature, rule, costs["busy"])
    if threads:
        sys.stderr.write(f"note: this machine is busy ({threads}): BLAS uses one thread\n")
    profile = acceptance_profile(target, draft, ngram, prompts, setting, costs, progress)
    if setting not in profile["settings"]:
        return fell_back(methods, temperature, rule, f"{profiles.PROFILE_FILE} has no {setting} profile")
    out = {}
    for m in methods:
        try:
            chosen = choose(profile, costs, temperature, m, draft is not None, ngram is not None,
                            keep=lambda r: METHODS[r["method"]].lossless(
                                Plan(**r["shape"] | ({"rule": rule} if rule else {})), temperature))
            out[m] = dataclasses.replace(chosen, layout=costs["layout"] | pads(costs["curves"]))
        except ValueError:  # no plan of m in the profile is lossless for the rule
            out[m] = fallback(m, temperature, f"the profile has no plan of {m} for --rule {rule}", rule)
    return out


def plan_for(target, draft, ngram, enc, temperature=0.0, method=None, recalibrate=False, progress=None,
             rule=None) -> Choice:
    """This machine's plan for the pair and setting (of one `method`, or the fastest of all)."""
    return plans_for(target, draft, ngram, enc, temperature, (method,), recalibrate, progress, rule)[method]


def choose(profile: dict, costs: dict, temperature: float, method: str | None = None, has_draft=True,
           has_ngram=True, keep=None) -> Choice:
    """The fastest candidate `keep(record)` keeps (of `method`, or of all: drafting must beat plain by MARGIN)."""
    setting = setting_name(temperature)
    if setting not in profile["settings"]:
        raise ValueError(f"the profile has no {setting} setting")
    curves, overheads = costs["curves"], costs["overheads"][setting]
    priced = [(record_ms(r, curves, overheads, **pads(curves)) / r["tokens"], r["method"], r["shape"])
              for r in profile["settings"][setting] if r["method"] in profiles.runnable(has_draft, has_ngram)
              and method in (None, r["method"]) and r["tokens"] and (keep is None or keep(r))]
    if not priced:
        raise ValueError(f"the profile has no candidate for method {method!r}")
    plain = next(r for r in profile["settings"][setting] if not METHODS[r["method"]].drafts)
    base = record_ms(plain, curves, overheads) / plain["tokens"]
    ms, m, shape = min(priced, key=lambda x: (x[0], x[1], str(x[2])))
    if method is None and METHODS[m].drafts and base / ms < MARGIN:
        ms, m, shape = base, plain["method"], {}
    return Choice(m, Plan(**shape), ms, base)


def constant_for(method: str, temperature: float, rule: str | None = None) -> Plan:
    """The constant plan with `rule`, its trees drawn as the rule needs (e.g. 'recursive_wor': without replacement)."""
    plan = dataclasses.replace(constant(temperature), rule=rule)
    tried = (dataclasses.replace(plan, sampled=s) for s in (plan.sampled, None, "without", "with"))
    return next((p for p in tried if METHODS[method].lossless(p, temperature)), plan)


def fallback(method: str | None, temperature: float, why: str, rule: str | None = None) -> Choice:
    """`method` with the constant plan for `rule`; for the machine's choice, prompt lookup at temperature
    0 (a copied chain costs no draft pass), plain decoding when sampling (rejections cost more when busy)."""
    method = method or ("lookup" if temperature == 0 else "ar")
    return Choice(method, constant_for(method, temperature, rule), float("nan"), float("nan"), busy=why)


def fell_back(asked, temperature: float, rule, why: str) -> dict:
    """{method: `fallback`} for the methods asked, said in one line naming each plan."""
    out = {m: fallback(m, temperature, why, rule) for m in asked}
    used = "; ".join(f"{c.method} with {describe(c.method, c.plan)}" for c in out.values())
    slow = ", which may be slower than plain decoding" * any(METHODS[c.method].drafts for c in out.values())
    sys.stderr.write(f"note: {why}; using {used} (the constant plan{slow})\n")
    return out


def acceptance_profile(target, draft, ngram, prompts, setting: str, costs: dict, progress=None) -> dict:
    """The pair's acceptance profile: shipped, else cached, else measured now (`profile_size`) and cached."""
    key = profiles.pair_key(target, draft, ngram)
    if profiles.PROFILE_FILE.is_file() and (shipped := profiles.load(profiles.PROFILE_FILE))["models"] == key:
        return shipped
    path = cache_path("profile", {"models": key, "version": profiles.VERSION, "setting": setting})
    if (cached := read_json(path)) is not None:
        try:
            return profiles.from_json(cached)
        except ValueError as e:
            sys.stderr.write(f"note: {path}: {e}: profiling again\n")
    usable = profiles.runnable(draft is not None, ngram is not None)
    grid = {setting: [c for c in profiles.candidates(setting, quick=True) if c[0] in usable]}
    seeds = 2  # runs per prompt when sampling
    curves = costs["curves"]
    # Per token: a target pass and two draft passes (random-weight GPT-2 pairs took 1.4x this estimate).
    ms = pass_ms(curves, "target", "warm", 1) + (2 * pass_ms(curves, "draft", "cold", 1) if "draft" in curves else 0.0)
    runs = len(grid[setting]) * len(profiles.run_seeds(0, profiles.SETTINGS[setting]["temperature"], seeds))
    n_prompts, tokens, seconds = profile_size(runs, ms)
    about = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    sys.stderr.write(f"profiling this pair's acceptance ({setting}; cached for later runs): {len(grid[setting])} "
                     f"candidate plans on {n_prompts} prompts x {tokens} tokens, about {about}\n")
    cache = writable(path)
    measured = profiles.measure(target, draft, ngram, prompts[:n_prompts], max_new_tokens=tokens, seeds=seeds,
                                grid=grid, progress=progress)
    if cache:
        store(path, profiles.to_json(measured))
    return measured


def profile_size(n_runs: int, ms_per_token: float) -> tuple[int, int, float]:
    """(prompts, new tokens, seconds) of a first-use profile: the largest PROFILE_SIZES within PROFILE_SECONDS."""
    for n_prompts, tokens in PROFILE_SIZES:
        seconds = n_runs * n_prompts * tokens * ms_per_token / 1000
        if seconds <= PROFILE_SECONDS:
            break
    return n_prompts, tokens, seconds
