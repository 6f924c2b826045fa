"""The machine's plan: the decoding plan the cost model predicts fastest for a model pair on this CPU.

The core decodes whatever `Plan` it is given (constants by default); this module chooses one.
`python -m specdec_np bench --tune` measures the cost curves (`costcurve.py`), fits the cost model
(`costmodel.py`) per setting on timed runs of every method over a few calibration prompts
(`calibrate`), then searches, per setting (greedy; top-k sampling), the tree staged runs, stage 2's
guesses, the copy length and the speculative chain by predicted milliseconds per token (`tune`). It
stores the result in `weights/tuned.json`, one entry per pair of models and machine (CPU model and
core count: a cost curve says nothing about another CPU). `plan_for` turns this machine's entry
into a Plan, padding included; without an entry it is `Plan()`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import platform
import time
from pathlib import Path

from ..decode import Plan, generate
from .costmodel import WIDE, fit_overheads, padding, predicted_ms

TUNED_FILE = Path(__file__).resolve().parents[2] / "weights" / "tuned.json"
SHAPE_KEYS = ("shape", "budget", "depth", "widths", "chain", "sampled", "guess_len", "guess_rows", "copy_len")


def model_key(target, draft) -> str:
    """Which pair a measurement belongs to (parameter counts are enough to tell ours apart)."""
    return f"{target.n_params}+{draft.n_params if draft is not None else 0}"


@functools.lru_cache(maxsize=1)
def machine() -> dict:
    """What a measurement depends on besides the models: the CPU model and the number of cores."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "cpus": os.cpu_count()}


@functools.lru_cache(maxsize=4)
def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def entries(path: Path | None = None) -> list:
    """Every stored measurement: one per (models, machine)."""
    path = TUNED_FILE if path is None else Path(path)
    return _read(str(path)).get("entries", []) if path.is_file() else []


def tuned_for(target, draft) -> dict:
    """What `bench --tune` stored for this pair on this machine ({} if nothing)."""
    if draft is None:
        return {}
    key = model_key(target, draft)
    return next((e for e in entries() if e.get("models") == key and e.get("machine") == machine()), {})


def setting_name(temperature) -> str:
    return "greedy" if temperature == 0 else "sampled"


def run_seeds(prompt_index: int, temperature: float, n: int) -> range:
    """The seeds the prompt at `prompt_index` runs with, in tuning and in bench alike: n of them
    (i, i + 1000, ...) when sampling, whose acceptance is random; one when greedy (deterministic)."""
    return range(prompt_index, prompt_index + 1000 * (n if temperature > 0 else 1), 1000)


def padded_plan(curves: dict | None, **shape) -> Plan:
    """A Plan with `shape` and the padding tables of measured cost curves (none without)."""
    curves = curves or {}
    return Plan(**shape, target_pad=padding(curves.get("target")), draft_pad=padding(curves.get("draft")))


def plan_for(target, draft, temperature=0.0) -> tuple[Plan, str]:
    """(the plan, where it came from): this machine's stored plan for the pair and setting, or Plan()."""
    entry = tuned_for(target, draft)
    shape = entry.get("shapes", {}).get(setting_name(temperature))
    if not shape:
        return Plan(), "the built-in constants (no weights/tuned.json entry for this machine)"
    shape = {k: tuple(v) if isinstance(v, list) else v for k, v in shape.items() if k in SHAPE_KEYS}
    return padded_plan(entry.get("cost_curves_ms"), **shape), "this machine's entry in weights/tuned.json"


def tuned_curves(target, draft) -> dict | None:
    """The cost curves `bench --tune` measured for this pair on this machine, if any."""
    return tuned_for(target, draft).get("cost_curves_ms")


def tuned_overheads(target, draft, temperature=0.0) -> dict | None:
    """The cost model `bench --tune` fitted for this pair, machine and setting, if any."""
    return (tuned_for(target, draft).get("overheads_ms") or {}).get(setting_name(temperature))


SAMPLED = {"temperature": 1.0, "top_k": 50}  # the sampled setting tuned (and benchmarked)


def calibrate(target, draft, ngram, prompts, curves, setting, max_new_tokens=64, out=print) -> dict:
    """Time every method on the calibration prompts in one setting ("greedy" or "sampled") and
    fit the cost model on those runs, two shapes each (so the counts vary independently):
    greedily, the constant plan's shape and a small one; sampled, trees drawn from the draft
    (widths 2,2,1,1 with the default chain, and widths 1,1 with a chain of 2), two seeds per prompt
    (`run_seeds`). Each setting has its own fit: sampling does more work per node (drawing
    children, the recursive rule) and its trees have other sizes."""
    if setting == "greedy":
        kw, shapes = {}, ({}, {"budget": 3, "depth": 3, "chain": 3})
    else:
        kw, shapes = SAMPLED, ({"sampled": "without", "widths": (2, 2, 1, 1)},
                               {"sampled": "without", "chain": 2, "widths": (1, 1)})
    runs = []
    for i, p in enumerate(prompts):
        # Two runs per prompt when sampling: with one, the fitted gap between the target's blocks
        # and wider blocks is not stable from one calibration to the next.
        for seed in run_seeds(i, kw.get("temperature", 0.0), 2):
            for m in ("ar", "speculative", "tree", "staged"):
                for shape in shapes if m != "ar" else ({},):
                    t0 = time.perf_counter()
                    res = generate(target, p, max_new_tokens, method=m, draft=draft, ngram=ngram, seed=seed,
                                   plan=padded_plan(curves, **shape), **kw)
                    runs.append((m, res.stats, time.perf_counter() - t0))
    o = fit_overheads(runs, curves)
    out(f"cost model ({setting}): target steps x{o['step_scale']:.2f}, blocks of up to {WIDE} rows "
        f"x{o['block_scale']:.2f} and wider x{o['wide_scale']:.2f} their curve, draft single tokens "
        f"x{o['draft_step_scale']:.2f} and blocks x{o['draft_block_scale']:.2f}; overheads "
        f"{o['draft_pass']:.3f} ms per draft pass (+{o['draft_cold']:.3f} ms for a step's first), "
        f"{o['ngram_query']:.4f} ms per n-gram query")
    return o


def tune(target, draft, ngram, prompts, curves, max_new_tokens=64, budgets=(1, 2, 3, 5, 7, 9, 11, 15, 23, 31),
         depths=(3, 4, 6, 8), widths=((1,), (2,), (1, 1), (2, 1), (3, 1), (2, 2), (1, 1, 1), (2, 1, 1), (3, 1, 1),
                                      (2, 2, 1), (1, 1, 1, 1), (2, 1, 1, 1), (1,) * 5, (1,) * 6),
         chains=(1, 2, 3, 4, 6), guess_lens=(0, 1, 2, 3, 4), guess_rows=("pad", 2, 4, 8),
         copy_lens=(0, 3, 4, 7, 8, 12, 15, 16), sampled_seeds=3, out=print) -> dict:
    """Pick, per setting, the tree for tree/staged (greedily: best-first (budget, depth) or fixed
    widths, whichever is faster; sampled: the widths of trees whose children are drawn without
    replacement), then stage 2's guesses and copy length for that tree, the widths once more with
    those, and the chain length for speculative, by the predicted ms per token (sampled: averaged
    over `sampled_seeds` seeds per prompt, as acceptance is random). Copies of 3, 7 and 15 tokens
    are candidates because with the root they fill a block of 4, 8 or 16 rows, where the target's
    cost curve often dips."""
    overheads = {name: calibrate(target, draft, ngram, prompts, curves, name, max_new_tokens, out)
                 for name in ("greedy", "sampled")}

    def cost(method, setting, **shape):
        ms = tokens = 0
        temperature = setting.get("temperature", 0)
        for i, p in enumerate(prompts):
            for seed in run_seeds(i, temperature, sampled_seeds):
                res = generate(target, p, max_new_tokens, method=method, draft=draft, ngram=ngram, seed=seed,
                               plan=padded_plan(curves, **shape), **setting)
                ms += predicted_ms(res.stats, curves, overheads[setting_name(temperature)])
                tokens += len(res.tokens)
        return ms / tokens

    def best(candidates):  # [(shape, ...)] -> (ms per token, shape) of the cheapest staged run
        return min(((cost("staged", setting, **c), c) for c in candidates), key=lambda x: (x[0], str(x[1])))

    shapes, predicted = {}, {}
    for name, setting in (("greedy", {}), ("sampled", SAMPLED)):
        base = cost("ar", setting)
        if name == "greedy":  # best-first trees, and fixed widths (a chain is widths 1, 1, ...)
            pairs = [(b, d) for b in budgets for d in sorted(set(depths) | {min(b, max(depths))}) if d <= b]
            trees = [{"budget": b, "depth": d} for b, d in pairs] + [{"shape": "fixed", "widths": w} for w in widths]
        else:  # children drawn from q: fixed widths
            trees = [{"sampled": "without", "widths": w} for w in widths]
        ms, shape = best(trees)
        # Stage 2 for that tree: how deep the n-gram guesses and how many guessed rows a pass takes
        # (guess_len 0: none, and the rows do not matter), then how long a copy to the target is.
        ms, shape = best([dict(shape, guess_len=n, guess_rows=r) for n in guess_lens
                          for r in (guess_rows if n else guess_rows[:1])])
        ms, shape = best([dict(shape, copy_len=n) for n in copy_lens])
        if "widths" in shape:  # the widths once more, with that stage 2 and those copies
            ms, shape = best([dict(shape, widths=w) for w in widths])
        chain = min(((cost("speculative", setting, chain=k), k) for k in chains), key=lambda x: x[0])
        shape["chain"] = chain[1]
        out(f"{name}: autoregressive {base:.2f} ms/token; staged {describe(Plan(**shape))}: {ms:.2f} ms/token "
            f"({base / ms:.2f}x); speculative chain {chain[1]}: {chain[0]:.2f} ms/token ({base / chain[0]:.2f}x)")
        shapes[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in shape.items()}
        predicted[name] = {"ar": base, "staged": ms, "speculative": chain[0]}
    return {"models": model_key(target, draft), "shapes": shapes, "predicted_ms_per_token": predicted,
            "overheads_ms": overheads, "machine": machine(), "cost_curves_ms": curves}


def describe(plan: Plan, method: str = "staged") -> str:
    """A plan in words, as `method` uses it."""
    widths = ",".join(map(str, plan.widths))
    if method in ("speculative", "lookup"):
        return f"a chain of {plan.chain}"
    if plan.sampled:
        text = f"widths {widths} drawn from the draft ({plan.sampled} replacement)"
    elif plan.shape == "fixed":
        text = f"the draft's top tokens, widths {widths}"
    else:
        text = f"best-first, {plan.budget} nodes at most {plan.depth} deep"
    if method == "staged":
        guesses = f"n-gram guesses {plan.guess_len} deep ({plan.guess_rows} rows)" if plan.guess_len else "no n-gram guesses"
        copies = f"copies of {plan.copy_len}" if plan.copy_len else "no copies"
        text += f"; {guesses}; {copies}"
    return text + ("; padded blocks" if plan.target_pad or plan.draft_pad else "")


def save(tuned: dict, path: Path | None = None) -> None:
    """Store `tuned` in place of any entry for the same models and machine (atomically)."""
    path = TUNED_FILE if path is None else Path(path)
    kept = [e for e in entries(path) if (e.get("models"), e.get("machine")) != (tuned["models"], tuned["machine"])]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"entries": kept + [tuned]}, indent=1) + "\n")
    os.replace(tmp, path)
    _read.cache_clear()
