"""The machine's plan: the method and Plan the cost model predicts fastest for a model pair on this CPU.

The core decodes whatever `Plan` it is given (constants by default); this module chooses one,
Sequoia-style, from two things measured apart:

- the pair's acceptance profile (`acceptance.py`): what every candidate does per emitted token, a
  property of the models, shipped for the embedded pair; for any other pair measured on first use,
  per setting, on a grid sized to take a few minutes on this machine (`acceptance_profile`);
- this machine's costs (`calibration`, about ten seconds on first use for the embedded pair, under
  a minute for GPT-2 and distilgpt2): which layout of each model's products its BLAS multiplies
  fastest (`costcurve.choose_slab_rows`), the forward pass against its block size, warm and cold
  (`costcurve.loop_curves`), the fixed work per step, drafting step and distribution the draft
  processes (fitted on the steps of a few short timed runs) and an n-gram query (timed directly),
  cached in the user's cache directory under a key of everything they depend on (CPU, cores,
  BLAS library, kernel and threads, the models' weights, dtype).

A busy machine is common (a laptop runs other work): when other processes use the CPU as the
tools start, BLAS gets one thread (OpenBLAS's threads stall while another process holds a core);
timings taken while the machine was busy are used for nothing and not cached, and a measurement
that runs past its time is stopped (`Busy`): the machine's choice is then prompt lookup at
temperature 0 and plain decoding when sampling, which need no measurement, and the next run
measures again.

The plan is the candidate with the fewest predicted milliseconds per token. Plain decoding and
prompt lookup are always candidates, and a plan that drafts must be predicted at least MARGIN
faster than plain decoding, so where drafting does not pay, the plan does not draft.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from .. import methods, staged
from .. import ngram as ngram_lib
from ..decode import generate
from ..files import atomic_file
from ..plan import Plan
from . import acceptance as profiles
from .blas import blas, use_threads
from .costcurve import choose_slab_rows, last_level_cache, laid_out, loop_curves
from .costmodel import fit_overheads, loop_scale, padding, pass_ms, record_ms, scaled

MARGIN = 1.10  # a drafting plan must be predicted this much faster than plain decoding (the model errs by ~10%)
CALIBRATION_VERSION = 7
CALIBRATION_SECONDS = 30  # a measurement that takes longer than this is stopped: the machine is too busy


class Busy(Exception):
    """The machine was too busy to measure its costs within CALIBRATION_SECONDS."""


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


def apply_layout(layout: dict, target, draft):
    """(target, draft) with the slab rows of a measured `layout` ({"target": rows, "draft": rows}: see
    `costcurve.laid_out`) and its padding tables ({"target_pad": table, "draft_pad": table}: `pads`,
    set as the models' `GPT2.padding`); a model it does not name, or None, is left as it is."""
    def lay(model, name):
        if model is not None and name in layout:
            model = laid_out(model, layout[name])
        if model is not None and name + "_pad" in layout:
            model = model.with_padding(layout[name + "_pad"])
        return model
    return lay(target, "target"), lay(draft, "draft")


def pads(curves: dict) -> dict:
    """The padding tables of measured cost curves ({"target_pad": ..., "draft_pad": ...}): the block
    size each model computes passes of 1, 2, ... rows as (`costmodel.padding`)."""
    return {"target_pad": padding(curves["target"]["warm"]),
            "draft_pad": padding(curves["draft"]["warm"]) if "draft" in curves else ()}


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def machine_name() -> str:
    """The machine kind in words: CPU model, last-level cache, cores, BLAS kernel."""
    m = machine()
    return f"{m['cpu']}, {m['llc'] or 'unknown'} last-level cache, {m['cpus']} cores, {m['blas']['kernel']} BLAS kernel"


def machine() -> dict:
    """What a cost measurement depends on besides the models: CPU model and cache, cores, and the
    BLAS library, kernel and threads in use now."""
    return cpu() | {"blas": blas(), "numpy": np.__version__}


@functools.lru_cache(maxsize=1)
def cpu() -> dict:
    """CPU model, last-level cache and cores."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "llc": last_level_cache(),
            "cpus": os.cpu_count()}


def cache_dir() -> Path:
    """The user's cache directory for specdec_np (XDG_CACHE_HOME, else ~/.cache): never the repository."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec_np"


def cache_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{kind}-{digest}.json"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")


# ----------------------------------------------------------------------------- this machine's costs

def measure_costs(target, draft, ngram, prompts, progress=None, seconds=None) -> dict:
    """This machine's layout of each model's products (`costcurve.choose_slab_rows`), its cost
    curves, scaled to what passes cost inside the decoding loop, and per-setting overheads (ms):
    about ten seconds on a quiet machine for the embedded pair; `Busy` past `seconds` (default
    CALIBRATION_SECONDS, up to 4x that for a target with more weights to read)."""
    if seconds is None:
        seconds = CALIBRATION_SECONDS * min(4.0, max(1.0, target.weight_bytes / 64e6))
    deadline = time.perf_counter() + seconds

    def in_time():
        if time.perf_counter() > deadline:
            raise Busy(f"measuring took over {seconds} s")

    # Progress in units of work: the layouts, each round of the cost curves, each setting's timed runs.
    work = {"done": 0, "total": None}

    def did(total: int | None = None):
        in_time()
        work["done"] += 1
        work["total"] = total or work["total"]
        if progress:
            progress(work["done"], work["total"])

    if progress:
        progress(0, None)
    layout = {"target": choose_slab_rows(target)} | ({"draft": choose_slab_rows(draft)} if draft is not None else {})
    did()
    target, draft = apply_layout(layout, target, draft)
    curves = loop_curves(target, draft, progress=lambda d, rounds: did(total=1 + rounds + len(profiles.SETTINGS)))
    query_ms = ngram_query_ms(ngram, prompts[0]) if ngram is not None else 0.0
    padded_blocks = pads(curves)
    target, draft = apply_layout(padded_blocks, target, draft)
    n_prompts, new_tokens = timed_run_size(pass_ms(curves, "target", "warm", 1))
    runs = {}
    for setting, kw in profiles.SETTINGS.items():
        runs[setting] = timed_steps(target, draft, ngram, prompts[:n_prompts], kw, new_tokens, in_time)
        did()
    # One scale for the target's curve from both settings' passes (the overheads exclude them).
    scale = loop_scale([p for steps, passes in runs.values() for p in passes], curves["target"])
    curves["target"] = {state: scaled(curve, scale) for state, curve in curves["target"].items()}
    overheads = {setting: fit_overheads(steps, curves, query_ms, padded_blocks["draft_pad"])
                 for setting, (steps, _) in runs.items()}
    return {"version": CALIBRATION_VERSION, "machine": machine(), "layout": layout, "curves": curves,
            "target_scale": scale, "overheads": overheads}


def timed_run_size(target_ms: float) -> tuple[int, int]:
    """(prompts, new tokens) of the calibration's timed runs: 3 prompts of 32 tokens where the
    target's one-token pass takes up to 4 ms (the embedded target), proportionally fewer where it
    is slower (GPT-2 takes 20 ms and more here), so that calibration stays within seconds."""
    scale = min(1.0, 4.0 / target_ms)
    return max(1, round(3 * scale)), max(8, round(32 * scale))


def timed_steps(target, draft, ngram, prompts, kw, new_tokens: int = 32, in_time=None) -> tuple[list, list]:
    """Short decoding runs of a few shapes whose passes span the block sizes plans use (one,
    four, eight and sixteen rows, warm and cold), past each run's prefill: every step [(draft
    blocks, draft distributions, n-gram queries, ms outside the target's pass)] and every target
    pass [(state, rows, ms)]; `in_time()` is called after each run (it raises `Busy` past the time allowed)."""
    sampled = "without" if kw["temperature"] else None
    shapes = [("ar", Plan()), ("lookup", Plan(chain=7)), ("lookup", Plan(chain=15))]
    if draft is not None:
        shapes += [("speculative", Plan(chain=3, sampled=sampled)),
                   ("tree", Plan(shape="fixed", widths=(3, 2, 1), sampled=sampled))]
    if draft is not None and ngram is not None:
        shapes += [("staged", Plan(shape="fixed", widths=(2, 1), guess_len=2, guess_rows=4, copy_len=7,
                                   sampled=sampled))]
    for _ in range(2):  # the second round is the one kept: warm
        steps, passes = [], []
        for i, prompt in enumerate(prompts):
            for method, plan in shapes:
                res = generate(target, prompt, new_tokens, method, draft, ngram, plan, seed=i, **kw)
                if in_time:
                    in_time()
                for s in res.stats.steps[1:]:
                    steps.append((s.draft_blocks, s.draft_dists, s.ngram_queries, 1000 * (s.seconds[0] + s.seconds[2])))
                    passes.append(("cold" if s.draft_blocks else "warm", target.padded(s.target_block),
                                   1000 * s.seconds[1]))
    return steps, passes


def ngram_query_ms(ngram, context, repeats: int = 200) -> float:
    """ms per n-gram query (a repeat looked up, or one token of the trigram's guess): timed directly,
    since in decoding runs it is nearly collinear with the draft's passes."""
    context = list(context)
    t0 = time.perf_counter()
    for i in range(repeats):
        ctx = context[:len(context) - i % 16]  # other histories, so that memos do not answer alone
        staged.repeat_continuation(ctx, 4)
        ngram_lib.greedy_continuation(ngram, ctx, 1)
    return 1000 * (time.perf_counter() - t0) / (2 * repeats)


def calibration(target, draft, ngram, prompts, recalibrate=False, progress=None) -> tuple[dict, bool]:
    """(this machine's costs for the pair, whether they were measured now): from the cache, or
    measured on first use or with `recalibrate`, and cached unless the machine was busy (slow,
    noisy timings serve this run only, marked "busy"; the next run measures again). `Busy` when the
    measurement takes over CALIBRATION_SECONDS."""
    key = {"machine": machine(), "models": profiles.pair_key(target, draft, ngram), "dtype": str(target.dtype),
           "version": CALIBRATION_VERSION}
    path = cache_path("costs", key)
    if not recalibrate and (cached := read_json(path)) is not None:
        return cached, False
    start = cpu_times()
    costs = measure_costs(target, draft, ngram, prompts, progress)
    busy = busy_warning(start)
    if busy:
        sys.stderr.write(busy + "\n")
        costs["busy"] = busy
    else:
        write_json(path, costs)
    return costs, True


def busy_now(seconds: float = 0.1) -> str:
    """Which share of the cores other processes use, measured over `seconds`, in words when it is
    more than BUSY_CORES ("" when the machine is quiet or /proc/stat is unknown)."""
    start = cpu_times()
    if start is None:
        return ""
    time.sleep(seconds)
    others = others_since(start, min_window=0.0)
    busy = others is not None and others > BUSY_CORES
    return f"other processes use {others:.1f} of its {os.cpu_count()} cores" if busy else ""


_settled: str | None = None  # settle_threads' verdict: it looks once per process


def settle_threads() -> str:
    """On a busy machine, limit NumPy's BLAS to one thread for the rest of the process (OpenBLAS's
    threads stall while another process holds a core) and say why; "" on a quiet one. The
    machine is looked at once per process (a tenth of a second); later calls repeat the verdict."""
    global _settled
    if _settled is None:
        _settled = busy_now()
        if _settled:
            use_threads(1)
    return _settled


BUSY_CORES = 0.25  # other processes using more CPU than this while costs are measured: not cached
MIN_WINDOW = 0.2  # seconds: a shorter window says nothing about the load


def cpu_times() -> tuple | None:
    """(CPU seconds all processes have used, this process's, wall clock): a snapshot for
    `busy_warning`; None where the system's total is unknown (no /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    except (OSError, ValueError):
        return None
    own = os.times()
    # Not "steal" (a hypervisor's other guests): a VM that always loses some time to them would never
    # keep its costs, and only this system's processes come and go between runs.
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()


def others_since(start: tuple | None, end: tuple | None = None, min_window: float = MIN_WINDOW) -> float | None:
    """Cores' worth of CPU other processes used between two `cpu_times()` snapshots (`end`: now);
    None where either is unknown or the window is shorter than `min_window` seconds (/proc/stat
    counts in ticks of 10 ms, so a shorter window says nothing about the load)."""
    end = cpu_times() if end is None else end
    if start is None or end is None or end[2] - start[2] <= 0 or end[2] - start[2] < min_window:
        return None
    return ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2])


def timing_note(start: tuple | None, contradicted: str = "", why: str = "") -> str:
    """The line to print after figures timed since `start` (a `cpu_times()` snapshot), "" on a
    quiet machine where every claim held: when other processes took CPU meanwhile, any figure may
    be off, so say that (naming what `contradicted`, if anything); else, if a figure contradicted a
    claim, say which and `why`. Lessons and the demo print it under what they timed."""
    others = others_since(start)
    if others is not None and others > BUSY_CORES:
        return (f"note: this machine was busy while timing the figures above (other processes used {others:.1f} "
                f"of its {os.cpu_count()} cores){': ' + contradicted if contradicted else ''}; rerun when it is idle")
    return f"note: {contradicted}: {why}" if contradicted else ""


def busy_warning(start: tuple | None) -> str:
    """A warning when other processes used the CPU since `start` (`cpu_times()`): OpenBLAS's
    threads then stall and the timings are slow and noisy ("" when the machine was quiet). Without
    /proc/stat: when the load average exceeds the cores, or "" if that is unknown too."""
    cores = os.cpu_count() or 1
    end = cpu_times()
    if start is not None and end is not None:
        others = others_since(start, end)
        if others is None or others <= BUSY_CORES:  # quiet, or a window too short to tell
            return ""
        what = f"other processes used {others:.1f} of its {cores} cores"
    else:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return ""
        if load <= cores:
            return ""
        what = f"load {load:.1f} on {cores} cores"
    return (f"note: this machine was busy while its costs were measured ({what}), so this run's plan may be off; "
            "they are not cached: the next run measures again")


# ----------------------------------------------------------------------------- the pair's profile

PROFILE_SECONDS = 120  # a pair with no shipped profile is profiled on first use in about this long
PROFILE_SIZES = ((12, 128), (6, 96), (4, 64), (3, 48), (2, 32))  # (prompts, new tokens), largest first


def profile_size(n_runs: int, ms_per_token: float) -> tuple[int, int, float]:
    """(prompts, new tokens, estimated seconds) of a first-use profile of n_runs decoding runs per
    prompt: the largest of PROFILE_SIZES estimated to take PROFILE_SECONDS at most, else the
    smallest. Each run is priced at ms_per_token per token."""
    for n_prompts, tokens in PROFILE_SIZES:
        seconds = n_runs * n_prompts * tokens * ms_per_token / 1000
        if seconds <= PROFILE_SECONDS:
            break
    return n_prompts, tokens, seconds


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
    write_json(path, profiles.to_json(measured))
    return measured


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


def fallback(method: str | None, temperature: float, why: str) -> Choice:
    """The plan that needs no measurement: `method` with the constant plan, or, for the machine's
    choice, prompt lookup at temperature 0 (a copied chain costs no draft pass) and plain decoding
    when sampling (a rejected block costs more than it saves on a busy machine)."""
    nan = float("nan")
    return Choice(method or ("lookup" if temperature == 0 else "ar"), Plan(), nan, nan, busy=why)


def plan_for(target, draft, ngram, enc, temperature=0.0, method=None, recalibrate=False, progress=None) -> Choice:
    """This machine's plan for the pair and setting (of one `method`, or the fastest of all)."""
    return plans_for(target, draft, ngram, enc, temperature, (method,), recalibrate, progress)[method]


def resized(plan: Plan, method: str, budget: int | None = None, depth: int | None = None) -> Plan:
    """`plan` with the tools' --budget/--depth applied (None leaves a value as it is): a chain
    method's length, one length whatever a lookup matched; a tree becomes a best-first tree of the
    draft's top tokens, since a drawn tree and the rule chosen for it do not carry over."""
    if methods.proposes_chain(method):
        return plan if depth is None else dataclasses.replace(plan, chain=depth, lookup_chains=())
    if not methods.drafts(method, plan) or budget is None and depth is None:  # plain decoding has no tree to resize
        return plan
    return dataclasses.replace(plan, shape="best_first", sampled=None, rule=None,
                               budget=plan.budget if budget is None else budget,
                               depth=plan.depth if depth is None else depth)


# The command-line option that sets each plan field a size error can name (methods.oversized).
OPTION = {"budget": "--budget", "widths": "--widths", "chain": "--depth", "lookup_chains": "--depth",
          "copy_len": "--copy-len"}


def check_size(plan: Plan, method: str, n_ctx: int) -> None:
    """methods.check_size in the command line's terms: a one-line ValueError naming the option that
    sizes the tree (--depth, --widths or --budget) or the copy (--copy-len) when a step of `plan`
    could propose more tokens than the target's context holds."""
    field = methods.oversized(method, plan, n_ctx)
    if field == "copy_len":
        raise ValueError(f"--copy-len must be at most the target's context ({n_ctx} tokens), got {plan.copy_len}")
    if field:
        raise ValueError(f"{OPTION[field]}: a tree of up to {methods.max_nodes(method, plan)} drafted tokens per step "
                         f"exceeds the cap of the target's context ({n_ctx} tokens)")
