"""This machine's plan: the method and Plan the cost model predicts fastest for a model pair on this CPU.

The core decodes whatever `Plan` it is given (constants by default); this module chooses one,
Sequoia-style, from two things measured apart: the pair's acceptance profile (`acceptance.py`:
what every candidate does per emitted token, a property of the models, shipped for the embedded
pair; for any other pair measured on first use, per setting, on a grid sized to take a few
minutes here, `acceptance_profile`) and this machine's costs (`calibration.py`).

The plan is the candidate with the fewest predicted milliseconds per token. Plain decoding and
prompt lookup are always candidates, and a plan that drafts must be predicted at least MARGIN
faster than plain decoding, so where drafting does not pay, the plan does not draft. On a machine
too busy to measure, the choice is prompt lookup at temperature 0 and plain decoding when
sampling, which need no measurement (`fallback`).
"""

from __future__ import annotations

import dataclasses
import sys

from .. import methods
from ..plan import Plan
from . import acceptance as profiles
from .cache import cache_path, read_json
from .calibration import Busy, calibration
from .costcurve import apply_layout
from .costmodel import pads, pass_ms, record_ms
from .machine import settle_threads

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
    busy: str = ""  # why the plan is the busy machine's fallback, not a measured one ("" when measured)

    @property
    def speedup(self) -> float:
        return self.baseline_ms_per_token / self.ms_per_token

    @property
    def origin(self) -> str:
        """Where the plan came from, in words."""
        if self.busy:
            return "not measured: " + self.busy
        return f"this machine's, predicted {self.speedup:.2f}x plain decoding"

    def models(self, target, draft):
        """(target, draft) laid out as this machine multiplies them fastest (`apply_layout`)."""
        return apply_layout(self.layout, target, draft)


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def plans_for(target, draft, ngram, enc, temperature=0.0, methods=(None,), recalibrate=False,
              progress=None) -> dict:
    """{method: this machine's plan for it} for the pair and setting (method None: the fastest of
    all), from the profile and costs loaded once; `enc` encodes the calibration prompts."""
    busy = settle_threads()
    if busy:
        sys.stderr.write(f"note: this machine is busy ({busy}): BLAS uses one thread\n")
    prompts = profiles.calibration_prompts(enc)
    try:
        costs, _ = calibration(target, draft, ngram, prompts, recalibrate, progress)
    except Busy as e:
        costs = {"busy": f"this machine was too busy to measure ({e})"}
    if costs.get("busy"):
        why = costs["busy"].split(" (")[0].removeprefix("note: ")
        sys.stderr.write(f"note: {why}: using {'prompt lookup' if temperature == 0 else 'plain decoding'} "
                         "or the constant plan; the next run measures again\n")
        return {m: fallback(m, temperature, "the machine was busy") for m in methods}
    profile = acceptance_profile(target, draft, ngram, prompts, setting_name(temperature), costs, progress)
    return {m: dataclasses.replace(choose(profile, costs, temperature, m, draft is not None, ngram is not None),
                                   layout=costs["layout"] | pads(costs["curves"])) for m in methods}


def plan_for(target, draft, ngram, enc, temperature=0.0, method=None, recalibrate=False, progress=None) -> Choice:
    """This machine's plan for the pair and setting (of one `method`, or the fastest of all)."""
    return plans_for(target, draft, ngram, enc, temperature, (method,), recalibrate, progress)[method]


def choose(profile: dict, costs: dict, temperature: float, method: str | None = None, has_draft=True,
           has_ngram=True, keep=None) -> Choice:
    """The fastest candidate of the profile on these costs: of one `method`, or of all (then a
    drafting plan must beat plain decoding by MARGIN); `keep(record)` may narrow the candidates."""
    setting = setting_name(temperature)
    curves, overheads = costs["curves"], costs["overheads"][setting]
    usable = profiles.runnable(has_draft, has_ngram)
    priced = []
    for r in profile["settings"][setting]:
        if r["method"] in usable and (method is None or r["method"] == method) and r["tokens"] \
                and (keep is None or keep(r)):
            ms = record_ms(r, curves, overheads, **pads(curves)) / r["tokens"]
            priced.append((ms, r["method"], r["shape"]))
    if not priced:
        raise ValueError(f"the profile has no candidate for method {method!r}")
    plain = next(r for r in profile["settings"][setting] if not methods.drafts(r["method"], Plan(**r["shape"])))
    base = record_ms(plain, curves, overheads) / plain["tokens"]
    ms, m, shape = min(priced, key=lambda x: (x[0], x[1], str(x[2])))
    if method is None and methods.drafts(m, Plan(**shape)) and base / ms < MARGIN:
        ms, m, shape = base, plain["method"], {}
    return Choice(m, Plan(**shape), ms, base)


def fallback(method: str | None, temperature: float, why: str) -> Choice:
    """The plan that needs no measurement: `method` with the constant plan, or, for the machine's
    choice, prompt lookup at temperature 0 (a copied chain costs no draft pass) and plain decoding
    when sampling (a rejected block costs more than it saves on a busy machine)."""
    nan = float("nan")
    return Choice(method or ("lookup" if temperature == 0 else "ar"), Plan(), nan, nan, busy=why)


def acceptance_profile(target, draft, ngram, prompts, setting: str, costs: dict, progress=None) -> dict:
    """The pair's acceptance profile: the shipped one for the embedded pair, else the cached one for
    this setting, else measured now (this setting only, on a smaller grid, sized by `costs` to take
    about PROFILE_SECONDS) and cached."""
    key = profiles.pair_key(target, draft, ngram)
    if profiles.PROFILE_FILE.is_file():
        shipped = profiles.load(profiles.PROFILE_FILE)
        if shipped["models"] == key:
            return shipped
    path = cache_path("profile", {"models": key, "version": profiles.VERSION, "setting": setting})
    if (cached := read_json(path)) is not None:
        return profiles.from_json(cached)
    usable = profiles.runnable(draft is not None, ngram is not None)
    grid = {setting: [c for c in profiles.candidates(setting, quick=True) if c[0] in usable]}
    seeds = 2  # runs per prompt when sampling
    curves = costs["curves"]
    # Per token: a target pass, and two draft passes (GPT-2 and distilgpt2 with random weights, whose
    # drafts are seldom accepted, took 1.4x this estimate).
    ms = pass_ms(curves, "target", "warm", 1) + (2 * pass_ms(curves, "draft", "cold", 1) if "draft" in curves else 0.0)
    runs = len(grid[setting]) * len(profiles.run_seeds(0, profiles.SETTINGS[setting]["temperature"], seeds))
    n_prompts, tokens, seconds = profile_size(runs, ms)
    about = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    sys.stderr.write(f"profiling this pair's acceptance ({setting}; first run only): {len(grid[setting])} "
                     f"candidate plans on {n_prompts} prompts x {tokens} tokens, about {about}\n")
    measured = profiles.measure(target, draft, ngram, prompts[:n_prompts], max_new_tokens=tokens, seeds=seeds,
                                grid=grid, progress=progress)
    profiles.save(measured, path)
    return measured


def profile_size(n_runs: int, ms_per_token: float) -> tuple[int, int, float]:
    """(prompts, new tokens, estimated seconds) of a first-use profile of n_runs decoding runs per
    prompt: the largest of PROFILE_SIZES estimated to take PROFILE_SECONDS at most, else the
    smallest. Each run is priced at ms_per_token per token."""
    for n_prompts, tokens in PROFILE_SIZES:
        seconds = n_runs * n_prompts * tokens * ms_per_token / 1000
        if seconds <= PROFILE_SECONDS:
            break
    return n_prompts, tokens, seconds
