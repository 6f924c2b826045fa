"""This machine's costs (calibration): what the cost model prices a plan with, measured once per machine.

Each model's layout, its forward pass by block size, warm and cold (`costcurve.py`), how fast NumPy reads the target's
weight bytes, the overheads (`costmodel.OVERHEADS`, fitted on short timed runs): about ten seconds for the embedded
pair, cached (`cache.py`), measured once per process and once per machine at a time (`cache.locked`). None are
measured while others use a quarter of a core (`Busy`), and none kept if others took that much meanwhile.
"""

from __future__ import annotations

import sys
import time

from .. import ngram as ngram_lib
from .. import staged
from ..decode import generate
from ..fastpath import ONE_ROW
from ..plan import Plan
from . import acceptance
from .cache import cache_path, locked, read_json, store, writable
from .costcurve import (GEMV_SIZES, SLAB_SIZES, apply_layout, choose_gemv_rows, choose_slab_rows, with_one_row,
                        loop_curves, read_gbps)
from .costmodel import OVERHEADS, fit_overheads, loop_scale, pads, pass_ms, scaled, step_passes
from .machine import busy, busy_since, cpu_times, machine
from .progress import Progress

CALIBRATION_VERSION = 11
CALIBRATION_SECONDS = 30  # a measurement that takes longer than this is stopped: the machine is too busy
# What a cached cost may be: a pass's ms, an overhead's ms, a curve's block sizes (GPT-2's context is 1024 tokens).
PASS_MS, OVERHEAD_MS, MOST_ROWS = (1e-3, 1e6), (0.0, 6e4), 1 << 12
MEASURED = {}  # {cache file: (costs, how) or Busy} of costs measured and not cached: measured once per process


class Busy(Exception):
    """The machine is too busy to measure its costs: nothing was measured, or nothing measured is kept (`costs`)."""

    def __init__(self, why: str, costs: dict | None = None):
        super().__init__(why)
        self.costs = costs


def calibration(target, draft, ngram, prompts, recalibrate=False, head=None) -> tuple[dict, str]:
    """(this machine's costs, "" if cached, else how they were measured): cached if valid (`problem`), else measured
    once per process; `Busy` if they cannot be measured now, or were not kept. With `head`, its curve too."""
    costs, how = pair_calibration(target, draft, ngram, prompts, recalibrate)
    if head is None or priced(costs, head):
        return costs, how
    costs, path = with_head(costs, target, head), costs_path(target, draft, ngram)
    if not how or how.endswith("cached for later runs"):  # those of the cache file: kept there with the head's
        store(path, costs)
    return costs, how


def pair_calibration(target, draft, ngram, prompts, recalibrate=False) -> tuple[dict, str]:
    """`calibration` of the pair's own costs (no head's curve)."""
    path, invalid = costs_path(target, draft, ngram), ""
    if not recalibrate and path.is_file():
        if not (why := problem(cached := read_json(path), draft is not None)):
            return cached, ""
        invalid = f"{path}: not this machine's costs ({why})"
    if not recalibrate and path in MEASURED:  # measured earlier in this process, not cached
        if isinstance(got := MEASURED[path], Busy):
            raise got
        return got
    seconds, lock = measuring_seconds(target), path.with_suffix(".lock")
    note = f"note: another process is measuring this machine's costs: waiting for it (at most {seconds + 10:.0f} s)\n"
    with locked(lock, seconds + 10, lambda: sys.stderr.write(note)) as waited:  # one measures, the others wait
        if waited is None:
            raise Busy(f"another process has been measuring this machine's costs for over {seconds + 10:.0f} s "
                       f"(it holds {lock}): not measuring")
        if waited and not recalibrate and not problem(cached := read_json(path), draft is not None):
            return cached, ""  # what the other process measured and cached
        if why := busy():
            raise Busy(f"{invalid + ', and ' if invalid else ''}this machine is busy ({why}): not measuring")
        if invalid:
            sys.stderr.write(f"note: {invalid}: measuring them again\n")
        cache, start = writable(path), cpu_times()
        progress = Progress("measuring this machine's costs " + ("(cached for later runs)" if cache else
                                                                 "(for this run only)"), unit=lambda n: f"{n} parts")
        try:
            costs = measure_costs(target, draft, ngram, prompts, progress)
            if why := busy_since(start):
                raise Busy(f"this machine was busy while measuring ({why}): its costs are not kept", costs)
        except Busy as e:
            MEASURED[path] = e
            raise
        if cache and store(path, costs):
            return costs, "measured now, cached for later runs"
    MEASURED[path] = (costs, "measured earlier in this run, not cached")
    return costs, "measured now, for this run only"


def costs_path(target, draft, ngram):
    """The cache file of a pair's costs on this machine: named by what they depend on."""
    return cache_path("costs", {"machine": machine(), "models": acceptance.pair_key(target, draft, ngram),
                                "dtype": str(target.dtype), "version": CALIBRATION_VERSION})


def priced(costs: dict, head) -> bool:
    """Whether `costs` hold `head`'s curve (a cached curve is kept with the digest of the head it measured)."""
    return "head" in costs["curves"] and costs.get("head") == acceptance.head_key(head)


def with_curve(costs: dict, head, measured: tuple) -> dict:
    """`costs` with `head`'s measured layout and curves (`head_costs`'), and the head's digest that `priced` reads."""
    layout, curves = measured
    return costs | {"layout": costs["layout"] | layout, "curves": costs["curves"] | {"head": curves},
                    "head": acceptance.head_key(head)}


def with_head(costs: dict, target, head) -> dict:
    """`costs` with an EAGLE head's curve (curves["head"]), measured once per process; `Busy` on a busy machine."""
    key = ("head", repr(head.config), str(head.dtype), repr(costs["layout"]), repr(costs["curves"]["target"]))
    if key not in MEASURED:
        if why := busy():
            raise Busy(f"this machine is busy ({why}): not measuring the EAGLE head's cost curve")
        MEASURED[key] = head_costs(target, head, costs["layout"])
    return with_curve(costs, head, MEASURED[key])


def problem(costs, has_draft: bool) -> str:
    """What keeps `costs` from being what `measure_costs` gives ("" if nothing), part by part."""
    models, states = (("target", "draft"), ("warm", "cold")) if has_draft else (("target",), ("warm",))
    if isinstance(costs, dict) and "busy" in costs:  # an older version kept such costs: never trusted
        return "measured while the machine was busy"

    def ms(values, bounds):  # all numbers of ms within bounds (NaN is not)
        return all(type(v) in (int, float) and bounds[0] <= v <= bounds[1] for v in values)
    try:
        laid = models + ("head",) * ("head" in costs["layout"])  # an EAGLE head's layout, measured with its curve
        parts = {"layout": all(type(costs["layout"][m]) is int and costs["layout"][m] in (0, 1, *SLAB_SIZES)
                               and {costs["layout"].get(m + way, "gemv") for way in ("_one_row", "_one_row_one_thread")}
                               <= set(ONE_ROW) for m in laid)
                 and all(type(r := costs["layout"].get(m + "_gemv_rows", 1)) is int and r in (1, *GEMV_SIZES)
                         for m in laid),
                 "curves": all(len(c) >= 2 and ms(c.values(), PASS_MS) and all(
                     str(k).isascii() and str(k).isdigit() and 1 <= int(k) <= MOST_ROWS for k in c)
                               for m in models + ("head",) * ("head" in costs["curves"])
                               for c in (costs["curves"][m][s] for s in states)),
                 "overheads": all(ms([costs["overheads"][s][n] for n in OVERHEADS], OVERHEAD_MS)
                                  for s in acceptance.SETTINGS),
                 "read rate": type(gbps := costs.get("read_gbps", 1.0)) in (int, float) and 0 < gbps < 1e6}
    except (KeyError, TypeError, AttributeError):
        return "a part is missing or of the wrong kind"
    return ", ".join(f"its {part} out of range" for part, ok in parts.items() if not ok)


def measuring_seconds(target) -> float:
    """How long measuring may take (`measure_costs`): CALIBRATION_SECONDS, more for a target over 64 MB."""
    return CALIBRATION_SECONDS * min(4.0, max(1.0, target.weight_bytes / 64e6))


def measure_costs(target, draft, ngram, prompts, progress=None, seconds=None) -> dict:
    """The models' layouts, cost curves scaled to what passes cost in the loop, and overheads per setting (ms);
    `Busy` past `seconds`. `progress(done, total)` counts the layouts, the curves' rounds, each setting's runs."""
    seconds = measuring_seconds(target) if seconds is None else seconds
    deadline, work = time.perf_counter() + seconds, {"done": 0, "total": None}
    progress = progress or (lambda done, total: None)

    def in_time():
        if time.perf_counter() > deadline:
            raise Busy(f"measuring took over {seconds} s: this machine is too busy")

    def did(total: int | None = None):  # one more part done, of `total` once the curves' rounds are known
        in_time()
        work.update(done=work["done"] + 1, total=total or work["total"])
        progress(work["done"], work["total"])

    progress(0, None)
    layout = {"target": choose_slab_rows(target)} | ({"draft": choose_slab_rows(draft)} if draft is not None else {})
    target, draft = apply_layout(layout, target, draft)
    layout = with_one_row(layout, target, "target")  # the draft's layer matrices are too small for slabs
    target, draft = apply_layout(layout, target, draft)
    for name, model in (("target", target), ("draft", draft)):  # where one row is a matrix-vector product
        if model is not None and layout.get(name + "_one_row", "gemv") == "gemv":
            layout[name + "_gemv_rows"] = choose_gemv_rows(model)
    did()
    target, draft = apply_layout(layout, target, draft)
    curves = loop_curves(target, draft, progress=lambda d, rounds: did(total=1 + rounds + len(acceptance.SETTINGS)))
    query_ms = ngram_query_ms(ngram, prompts[0]) if ngram is not None else 0.0
    padding = pads(curves)
    target, draft = apply_layout(padding, target, draft)
    n_prompts, new_tokens = timed_run_size(pass_ms(curves, "target", "warm", 1))
    # The prompts' last tokens, leaving room in both contexts for `new_tokens` and a step's block.
    room = min(m.config.n_ctx for m in (target, draft) if m is not None) - new_tokens - 20
    prompts = [p[-max(1, room):] for p in prompts[:n_prompts]]
    runs = {}
    for setting, kw in acceptance.SETTINGS.items():
        runs[setting] = timed_steps(target, draft, ngram, prompts, kw, new_tokens, in_time)
        did()
    # One scale for the target's curve from both settings' passes (the overheads exclude them).
    scale = loop_scale([p for steps, passes in runs.values() for p in passes], curves["target"])
    curves["target"] = {state: scaled(curve, scale) for state, curve in curves["target"].items()}
    overheads = {setting: fit_overheads(steps, curves, query_ms, padding["draft_pad"])
                 for setting, (steps, _) in runs.items()}
    return {"version": CALIBRATION_VERSION, "machine": machine(), "layout": layout, "curves": curves,
            "target_scale": scale, "overheads": overheads, "read_gbps": read_gbps(target.weight_bytes)}


def roofline(costs: dict, target) -> str:
    """Plain decoding's one-token pass against the rate NumPy reads the target's weights (`read_gbps`), in words."""
    ms = pass_ms(costs["curves"], "target", "warm", 1)  # one token is never padded
    gbps, rate = costs.get("read_gbps"), target.weight_bytes / ms / 1e6  # GB/s
    limit = f", {rate / gbps:.0%} of the {gbps:.1f} GB/s NumPy reads here" if gbps else " (no read rate measured)"
    return (f"roofline: plain decoding's one-token pass reads the target's {target.weight_bytes / 1e6:.1f} MB of "
            f"weights in {ms:.2f} ms, {rate:.1f} GB/s{limit}")


def head_costs(target, head, layout: dict) -> tuple[dict, dict]:
    """The EAGLE head's layout, measured as the target's ({"head": slab rows, "head_one_row": ... (and with one thread),
    "head_gemv_rows" where one row is a matrix-vector product}), and its curve."""
    own = {"head": choose_slab_rows(head)}
    own = with_one_row(own, apply_layout(own, None, head)[1], "head")
    if own["head_one_row"] == "gemv":
        own["head_gemv_rows"] = choose_gemv_rows(apply_layout(own, None, head)[1])
    return own, head_curves(target, head, layout | own)


def head_curves(target, head, layout: dict) -> dict:
    """The EAGLE head's cost curve, {"warm": {k: ms}, "cold": ...}, target and head laid out as `layout` says."""
    target, head = apply_layout(layout, target, head)
    return loop_curves(target, head)["draft"]


def timed_run_size(target_ms: float) -> tuple[int, int]:
    """(prompts, new tokens) of the timed runs: 3 x 32 where a one-token pass takes up to 4 ms, fewer if slower."""
    scale = min(1.0, 4.0 / target_ms)
    return max(1, round(3 * scale)), max(8, round(32 * scale))


def timed_steps(target, draft, ngram, prompts, kw, new_tokens: int, in_time) -> tuple[list, list]:
    """Short runs whose passes span the block sizes plans use: past each prefill, every step [(draft blocks, draft
    distributions, n-gram queries, ms besides the target's pass)] and target pass [(state, rows, ms)]."""
    sampled = "without" if kw["temperature"] else None
    shapes = [("ar", Plan()), ("lookup", Plan(chain=7)), ("lookup", Plan(chain=15)),
              ("speculative", Plan(chain=3, sampled=sampled)),
              ("tree", Plan(shape="fixed", widths=(3, 2, 1), sampled=sampled)),
              ("staged", Plan(shape="fixed", widths=(2, 1), guess_len=2, guess_rows=4, copy_len=7, sampled=sampled))]
    shapes = [(m, plan) for m, plan in shapes if m in acceptance.runnable(draft is not None, ngram is not None)]
    for _ in range(2):  # the second round is the one kept: warm
        timed = []  # the runs' steps past each prefill
        for i, prompt in enumerate(prompts):
            for method, plan in shapes:
                timed += generate(target, prompt, new_tokens, method, plan=plan, seed=i,
                                  **acceptance.models_for(method, draft, ngram), **kw).stats.steps[1:]
                in_time()
    steps = [(s.draft_blocks, s.draft_dists, s.ngram_queries, 1000 * (s.seconds[0] + s.seconds[2])) for s in timed]
    passes = [(state, target.layout.rows(k), 1000 * s.seconds[1])
              for s in timed for model, state, k in step_passes(s.draft_blocks, s.target_block) if model == "target"]
    return steps, passes


def ngram_query_ms(ngram, context, repeats=200) -> float:
    """ms per n-gram query, timed directly (in decoding runs it is nearly collinear with the draft's passes)."""
    context, t0 = list(context), time.perf_counter()
    for i in range(repeats):
        ctx = context[:len(context) - i % 16]  # other histories, so that memos do not answer alone
        staged.repeat_continuation(ctx, 4)
        ngram_lib.greedy_continuation(ngram, ctx, 1)
    return 1000 * (time.perf_counter() - t0) / (2 * repeats)
