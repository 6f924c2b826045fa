"""This machine's costs (calibration): what the cost model prices a plan with, measured once per machine.

Which layout of each model's products its BLAS multiplies fastest (`costcurve.choose_slab_rows`),
the forward pass against its block size, warm and cold (`costcurve.loop_curves`), the fixed work
per step, drafting step and distribution the draft processes (fitted on the steps of a few short
timed runs) and an n-gram query (timed directly): about ten seconds on first use for the embedded
pair, under a minute for GPT-2 and distilgpt2, then read from the cache (`cache.py`) under a key of
everything they depend on (`machine.machine()`, the models' weights, dtype).

A measurement that runs past its time is stopped (`Busy`), and costs measured while other
processes took the CPU serve that run only (`machine.busy_warning`): the next run measures again.
"""

from __future__ import annotations

import sys
import time

from .. import ngram as ngram_lib
from .. import staged
from ..decode import generate
from ..plan import Plan
from . import acceptance as profiles
from .cache import cache_path, read_json, write_json
from .costcurve import apply_layout, choose_slab_rows, loop_curves
from .costmodel import fit_overheads, loop_scale, pads, pass_ms, scaled
from .machine import busy_warning, cpu_times, machine

CALIBRATION_VERSION = 7
CALIBRATION_SECONDS = 30  # a measurement that takes longer than this is stopped: the machine is too busy


class Busy(Exception):
    """The machine was too busy to measure its costs within CALIBRATION_SECONDS."""


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
    padding = pads(curves)
    target, draft = apply_layout(padding, target, draft)
    n_prompts, new_tokens = timed_run_size(pass_ms(curves, "target", "warm", 1))
    runs = {}
    for setting, kw in profiles.SETTINGS.items():
        runs[setting] = timed_steps(target, draft, ngram, prompts[:n_prompts], kw, new_tokens, in_time)
        did()
    # One scale for the target's curve from both settings' passes (the overheads exclude them).
    scale = loop_scale([p for steps, passes in runs.values() for p in passes], curves["target"])
    curves["target"] = {state: scaled(curve, scale) for state, curve in curves["target"].items()}
    overheads = {setting: fit_overheads(steps, curves, query_ms, padding["draft_pad"])
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
