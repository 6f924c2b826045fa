"""The cost model, and the default tree shape chosen from it instead of a GPU paper's constant.

Cost model: a decoding run costs the measured cost curve of every forward pass it made (padded as
`pad_size` says; scaled by how much slower passes run inside the decoding loop than alone, where
the other model has just pushed their weights out of the cache: the target's single tokens,
blocks of up to 4 rows and wider blocks apart, the draft's single tokens and blocks apart),
plus a fixed overhead per draft pass and per n-gram query: the Python and NumPy work around the
draft's passes (building trees, processing logits, drawing), and per step that runs the draft:
its first pass reads the draft's weights back from memory, its later passes find them in the
cache. The target's own fixed work per pass (masks, logits, verifying, moving the cache) is in
its scales: a fixed overhead per target pass beside them made the fit ill-posed (each size class
costs about the same per pass, so its scale and a per-pass term trade off; one fit put 4 ms per
target pass and scaled single tokens by 0.27).

`python -m specdec_np bench --tune` measures the cost curves, fits those eight parameters per
setting (least squares on timed runs of every method over a few calibration prompts, greedy and
sampled apart), then, per setting (greedy; top-k sampling), runs the staged decoder for each
candidate best-first (budget, depth) and, greedily, each fixed-width tree (chains included: where
draft passes are dear, the cheapest tree to draft can win); in the sampled setting each width of
trees whose children are drawn without replacement (`sampled="without"`, the trees `bench` samples
with); then, for the tree staged runs in that setting, each stage-2 setting (guess depth, 0 for
none, and guessed rows per pass), the chain decoder for each chain length, how long a chain stage 2
may copy straight to the target (`lookup_depth`, 0 = never), and last the fixed or sampled trees'
widths once more with those; what is not chosen yet stays at `generate`'s defaults (FALLBACK's:
`bench --tune` drops the stored shapes first). Sampled candidates are costed over several seeds per
prompt (their acceptance is random). It stores what the model predicts fastest in
`weights/tuned.json`, one entry per pair of models and machine (CPU model and core count: a cost
curve says nothing about another CPU). `generate` uses the entry for its pair on the machine it
runs on, and otherwise the documented constants of FALLBACK, unpadded (padding needs a curve):
best-first trees of budget 8 and depth 6, widths 2, 2, 1, 1, 1, 1 for fixed and sampled trees, a
chain of 4 (speculative), n-gram guesses 3 deep and at most 4 guessed rows per draft pass, copies
of 12 tokens.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

FALLBACK = {"tree": "best_first", "budget": 8, "depth": 6, "widths": [2, 2, 1, 1, 1, 1], "chain": 4,
            "spec_len": 3, "spec_rows": 4, "lookup_depth": 12}
TUNED_FILE = Path(__file__).resolve().parent.parent / "weights" / "tuned.json"


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


def defaults(target, draft, temperature=0.0) -> dict:
    """The FALLBACK keys (tree shape, chain, stage 2) measured for this pair and setting, else FALLBACK."""
    shape = tuned_for(target, draft).get("shapes", {}).get(setting_name(temperature))
    return {k: shape.get(k, v) for k, v in FALLBACK.items()} if shape else dict(FALLBACK)


def tuned_curves(target, draft) -> dict | None:
    """The cost curves `bench --tune` measured for this pair on this machine, if any."""
    return tuned_for(target, draft).get("cost_curves_ms")


def tuned_overheads(target, draft, temperature=0.0) -> dict | None:
    """The cost model `bench --tune` fitted for this pair, machine and setting, if any."""
    return (tuned_for(target, draft).get("overheads_ms") or {}).get(setting_name(temperature))


# ----------------------------------------------------------------------------- the cost curve

def interp(curve: dict, k: int) -> float:
    """Cost of a k-token pass: linear between measured sizes, extended linearly past the last two
    (a prompt's prefill is longer than any tree)."""
    ks = sorted(int(x) for x in curve)
    ms = [curve[x] if x in curve else curve[str(x)] for x in ks]
    if k > ks[-1] and len(ks) > 1:
        return ms[-1] + (k - ks[-1]) * (ms[-1] - ms[-2]) / (ks[-1] - ks[-2])
    return float(np.interp(k, ks, ms))


def pad_size(curve: dict, k: int) -> int:
    """The block size to compute k tokens as: the measured size >= k that costs least (ties: the
    smaller), or k itself. OpenBLAS works in panels of 4 and 8 columns, so on this machine 5-7
    tokens cost more than 8 and 13-15 more than 16: padding with dummy rows is free speed."""
    best, best_ms = k, interp(curve, k)
    for size in sorted(int(x) for x in curve):
        if size > k and interp(curve, size) < best_ms:
            best, best_ms = size, interp(curve, size)
    return best


def block_ms(curve: dict, k: int) -> float:
    """What a pass of k tokens costs when padded as `pad_size` says (the cached `padding` table)."""
    return interp(curve, padding(curve)(k))


def padding(curve: dict | None, limit: int = 64):
    """pad[k] for k = 0..limit from a measured curve (no padding without one); larger k: unpadded."""
    if not curve:
        return lambda k: k
    table = _pad_table(tuple(sorted((int(k), float(v)) for k, v in curve.items())), limit)
    return lambda k: table[k] if k <= limit else k


@functools.lru_cache(maxsize=8)
def _pad_table(curve_items: tuple, limit: int) -> tuple:  # computed once per curve, not per call
    curve = dict(curve_items)
    return (0,) + tuple(pad_size(curve, k) for k in range(1, limit + 1))


# ----------------------------------------------------------------------------- the cost model

# Target blocks padded to more than this many rows are scaled apart from smaller ones: in the
# decoding loop at top-k an 8-row block ran 12% slower than a 4-row one, against 4-6% on the
# curve (wider attention over contexts longer than the curve's 200-token prefix, and in-loop
# effects). With one scale for all blocks the model ranked wide sampled trees first; they ran last.
WIDE = 4
SIZES = ("step", "block", "wide")  # one token; 2..WIDE rows; more (after padding)


def size_class(curve: dict, k: int) -> str:
    return "step" if k == 1 else "block" if padding(curve)(k) <= WIDE else "wide"


def target_ms(stats, curves, size: str | None = None) -> float:
    """The target's passes at their curve cost: all, or those of one size class (SIZES)."""
    return sum(block_ms(curves["target"], k) for k in stats.target_blocks
               if size is None or size_class(curves["target"], k) == size)


def draft_ms(stats, curves, size: str | None = None) -> float:
    """The draft's passes at their curve cost: all, or those of one size ("step": one token,
    "block": more)."""
    return sum(block_ms(curves["draft"], k) for k in stats.draft_blocks
               if size is None or (k == 1) == (size == "step"))


# The draft's passes of one token and of several are scaled apart: in the decoding loop at top-k
# a 2-row draft pass (a node and stage 2's guess below it) took 1.7x a 1-row one, against 1.07x on
# the curve. With one scale for both the model valued stage 2's guesses at T=1 (a guess is right
# only as often as the draft samples it) above the chain, which ran faster.
DRAFT_SIZES = ("step", "block")


def predicted_ms(stats, curves, overheads=None) -> float:
    """Cost model: every pass at its (padded) measured cost, scaled by how much slower it runs
    inside the decoding loop than alone (the target's `step_scale` for one token, which the
    baseline runs back to back, `block_scale` for blocks of up to WIDE rows and `wide_scale` for
    wider ones, which follow a drafting gap: they suffer differently; the draft's
    `draft_step_scale` and `draft_block_scale`), plus fixed overheads per draft pass, n-gram query
    and step that runs the draft (none of these when not measured)."""
    o = overheads or {}
    return (sum(o.get(size + "_scale", 1.0) * target_ms(stats, curves, size) for size in SIZES)
            + sum(o.get(f"draft_{size}_scale", 1.0) * draft_ms(stats, curves, size) for size in DRAFT_SIZES)
            + o.get("draft_pass", 0.0) * stats.draft_passes
            + o.get("ngram_query", 0.0) * stats.ngram_queries + o.get("draft_cold", 0.0) * stats.draft_steps)


OVERHEADS = ("step_scale", "block_scale", "wide_scale", "draft_step_scale", "draft_block_scale", "draft_pass",
             "ngram_query", "draft_cold")


def nonnegative_lstsq(features, y):  # [runs, k], [runs] -> [k]
    """Least squares with every coefficient >= 0: one that comes out negative is fixed at 0 and
    the rest refitted."""
    free = [j for j in range(features.shape[1]) if features[:, j].any()]
    while True:
        x = np.zeros(features.shape[1])
        if free:
            x[free] = np.linalg.lstsq(features[:, free], y, rcond=None)[0]
        if (x >= 0).all():
            return x
        free = [j for j in free if x[j] > 0]


def fit_overheads(runs, curves) -> dict:
    """The cost model's eight parameters from timed runs [(method, stats, wall seconds)].

    Each side is fitted on its own clock (`Stats.time_draft` times the drafting), so that the
    target's and the draft's costs are not traded against each other: the wall time outside
    drafting against the target's curve time (per size class), and the drafting time against the
    draft's curve time (per size class) and the counts of draft passes, n-gram queries and steps
    that ran the draft (cold first passes).
    """
    target = nonnegative_lstsq(np.array([[target_ms(s, curves, size) for size in SIZES] for _, s, _ in runs], dtype=float),
                               np.array([1000 * (sec - s.time_draft) for _, s, sec in runs]))
    draft = nonnegative_lstsq(np.array([[*(draft_ms(s, curves, size) for size in DRAFT_SIZES), s.draft_passes,
                                         s.ngram_queries, s.draft_steps] for _, s, _ in runs], dtype=float),
                              np.array([1000 * s.time_draft for _, s, _ in runs]))
    return dict(zip(OVERHEADS, map(float, [*target, *draft])))


# ----------------------------------------------------------------------------- tuning

SAMPLED = {"temperature": 1.0, "top_k": 50}  # the sampled setting tuned (and benchmarked)


def calibrate(target, draft, ngram, prompts, curves, setting, max_new_tokens=64, out=print) -> dict:
    """Time every method on the calibration prompts in one setting ("greedy" or "sampled") and
    fit the cost model on those runs, two shapes each (so the counts vary independently):
    greedily, the current default shape and a small one; sampled, trees drawn from the draft as
    bench runs them (`sampled="without"`, widths 2,2,1,1 with the default chain, and widths 1,1
    with a chain of 2), two seeds per prompt (`run_seeds`). Each setting has its own fit: sampling
    does more work per node (drawing children, the recursive rule) and its trees have other sizes."""
    from .decode import generate

    if setting == "greedy":
        kw, shapes = {}, ({}, {"budget": 3, "depth": 3})
    else:
        kw, shapes = SAMPLED, ({"sampled": "without", "widths": [2, 2, 1, 1]},
                               {"sampled": "without", "depth": 2, "widths": [1, 1]})
    runs = []
    for i, p in enumerate(prompts):
        # Two runs per prompt when sampling: with one, the fitted gap between the target's blocks
        # and wider blocks moved from 3% to 10% between two calibrations in one session.
        for seed in run_seeds(i, kw.get("temperature", 0.0), 2):
            for m in ("ar", "speculative", "tree", "staged"):
                for shape in shapes if m != "ar" else ({},):
                    t0 = time.perf_counter()
                    res = generate(target, p, max_new_tokens, method=m, draft=draft, ngram=ngram, seed=seed, **kw,
                                   **shape)
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
         chains=(1, 2, 3, 4, 6), spec_lens=(0, 1, 2, 3, 4), spec_rows=("pad", 2, 4, 8),
         lookup_depths=(0, 3, 4, 7, 8, 12, 15, 16),
         sampled_seeds=3, out=print) -> dict:
    """Pick, per setting, the tree for tree/staged (best-first (budget, depth), or greedily fixed
    widths if faster; in the sampled setting also the widths of trees whose children are drawn
    without replacement, `sampled="without"`), then stage 2's settings and `lookup_depth` for the
    tree `bench` runs in that setting, and the chain length for speculative, by the predicted ms
    per token (in the sampled setting averaged over `sampled_seeds` seeds per prompt). Copies of
    3, 7 and 15 tokens are among the candidates because with the root they fill a block of 4, 8
    or 16 rows, where the target's cost curve dips: a copy of 4 is padded to 8 rows."""
    from .decode import generate

    overheads = {name: calibrate(target, draft, ngram, prompts, curves, name, max_new_tokens, out)
                 for name in ("greedy", "sampled")}

    def cost(method, kw):
        # Sampled acceptance is random: on 8 prompts one shape's predicted speedup moved by 0.11x
        # from one set of seeds to the next, more than the shapes differ. Average several.
        ms = tokens = 0
        temperature = kw.get("temperature", 0)
        for i, p in enumerate(prompts):
            for seed in run_seeds(i, temperature, sampled_seeds):
                res = generate(target, p, max_new_tokens, method=method, draft=draft, ngram=ngram, seed=seed, **kw)
                ms += predicted_ms(res.stats, curves, overheads[setting_name(temperature)])
                tokens += len(res.tokens)
        return ms / tokens

    shapes, predicted = {}, {}
    for name, setting in (("greedy", {}), ("sampled", SAMPLED)):
        base = cost("ar", setting)
        pairs = [(b, d) for b in budgets for d in sorted(set(depths) | {min(b, max(depths))}) if d <= b]
        tree = min(((cost("staged", dict(setting, budget=b, depth=d)), b, d) for b, d in pairs), key=lambda x: x[0])
        shape = {"tree": "best_first", "budget": tree[1], "depth": tree[2]}
        if name == "greedy":  # fixed widths too (a chain is widths 1, 1, ...): whichever is faster
            fixed = min(((cost("staged", dict(setting, tree="fixed", widths=list(w))), list(w)) for w in widths),
                        key=lambda x: x[0])
            shape["widths"] = fixed[1]
            if fixed[0] < tree[0]:
                shape["tree"] = "fixed"
                staged = dict(setting, tree="fixed", widths=fixed[1])  # the tree staged runs here
            else:
                staged = dict(setting, budget=tree[1], depth=tree[2])
        else:  # sampled: trees whose children are drawn from q (what bench runs), fixed widths
            sampled = min(((cost("staged", dict(setting, sampled="without", widths=list(w))), list(w)) for w in widths),
                          key=lambda x: x[0])
            shape["widths"] = sampled[1]
            staged = dict(setting, sampled="without", widths=sampled[1])
        # Stage 2 for the tree staged runs in this setting: how deep the n-gram guesses, and how
        # many guessed rows a draft pass takes (for a tree one level deep there is nothing to guess;
        # depth 0: no guesses, the n-gram only copies to the target, and the rows do not matter).
        stage2 = [(n, r) for n in spec_lens for r in (spec_rows if n else spec_rows[:1])]
        spec = min(((cost("staged", dict(staged, spec_len=n, spec_rows=r)), n, r) for n, r in stage2),
                   key=lambda x: (x[0], str(x[2])))
        chain = min(((cost("speculative", dict(setting, depth=k)), k) for k in chains), key=lambda x: x[0])
        guesses = f"n-gram guesses {spec[1]} deep, {spec[2]} rows" if spec[1] else "no n-gram guesses for the draft"
        out(f"{name}: autoregressive {base:.2f} ms/token; staged {describe(shape, sampled=name == 'sampled')}, "
            f"{guesses}: {spec[0]:.2f} ms/token ({base / spec[0]:.2f}x); "
            f"speculative chain {chain[1]}: {chain[0]:.2f} ms/token ({base / chain[0]:.2f}x)")
        look = min(((cost("staged", dict(staged, spec_len=spec[1], spec_rows=spec[2], lookup_depth=n)), n)
                    for n in lookup_depths), key=lambda x: x[0])
        out(f"{name}: staged copying {look[1]} tokens of a repeat to the target: {look[0]:.2f} ms/token "
            f"({base / look[0]:.2f}x)")
        # The widths once more, with that stage 2 and those copies: the first round ran with
        # FALLBACK's copies of 12, which at T=1 are seldom accepted and cost a 16-row block, and
        # so favoured trees that left little to copy (one tune: a depth-1 tree of 2 over a chain).
        final = look
        if "widths" in staged:
            kind = {k: v for k, v in staged.items() if k != "widths"}
            final = min([look] + [(cost("staged", dict(kind, widths=list(w), spec_len=spec[1], spec_rows=spec[2],
                                                       lookup_depth=look[1])), list(w))
                                  for w in widths if list(w) != shape["widths"]], key=lambda x: x[0])
            if final is not look:
                shape["widths"] = final[1]
                out(f"{name}: then widths {','.join(map(str, final[1]))}: {final[0]:.2f} ms/token "
                    f"({base / final[0]:.2f}x)")
        shapes[name] = dict(shape, chain=chain[1], spec_len=spec[1], spec_rows=spec[2], lookup_depth=look[1])
        predicted[name] = {"ar": base, "staged": final[0], "speculative": chain[0]}
    return {"models": model_key(target, draft), "shapes": shapes, "predicted_ms_per_token": predicted,
            "overheads_ms": overheads, "machine": machine(), "cost_curves_ms": curves}


def describe(shape: dict, sampled: bool = False) -> str:
    """A stored tree shape in words (with `sampled`, also the widths of sampled trees)."""
    widths = ",".join(map(str, shape.get("widths", ())))
    if shape.get("tree") == "fixed":
        text = f"fixed widths {widths}"
    else:
        text = f"best-first budget {shape['budget']}, depth {shape['depth']}"
    return text + (f"; sampled trees: widths {widths}" if sampled and widths else "")


def save(tuned: dict, path: Path | None = None) -> None:
    """Store `tuned` in place of any entry for the same models and machine (atomically)."""
    path = TUNED_FILE if path is None else Path(path)
    kept = [e for e in entries(path) if (e.get("models"), e.get("machine")) != (tuned["models"], tuned["machine"])]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"entries": kept + [tuned]}, indent=1) + "\n")
    os.replace(tmp, path)
    _read.cache_clear()
