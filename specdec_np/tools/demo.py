"""The offline demo (`make demo`): every method on one Python prompt, on the embedded models.

Greedy first: every method's completion must be the autoregressive one (a float32 near-tie that flips a
token is reported with its logit gap), a table of speed and work (staged also without its copies, the paper's
stage 2 alone; each row's tokens by where they came from), the plans, the completion coloured by
stage (the paper's Fig. 3), one verification tree. The row eagle drafts with the target's EAGLE head
instead of the draft model, on its own best plan (tree's where the profile holds none of the head's, as
`choose` gives it). Then one sampled run (top-k 50, T=1) against sampled AR.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import numpy as np

from ..decode import generate
from ..gpt2 import forward, new_cache
from ..methods import METHODS
from ..models import load_embedded, load_head
from ..tokenizer import cut_at_stop, decode, encode
from ..tree import COPY, NGRAM, SOURCES, render
from .acceptance import calibration_prompts, models_for
from .bench import stop_strings, stops_said
from .calibration import calibration, roofline
from .choice import choose
from .costcurve import apply_layout
from .loops import repeat_share
from .machine import cpu_times, timing_note
from .options import at_least, check_fits, describe

PROMPT = '''def count_words(text: str) -> dict:
    """Return a dictionary mapping each word in text to the number of times it occurs.

    >>> count_words("a b a")
    {'a': 2, 'b': 1}
    """
'''

# A row that is not a method of its own: staged without copies (copy_len 0), the paper's stage 2 alone.
NO_COPIES = "staged, no copies"
# red, blue, green, yellow; "head": EAGLE's head, which drafts in the draft's place (method eagle)
COLORS = {"target": "\033[31m", "draft": "\033[34m", "ngram": "\033[32m", "copy": "\033[33m", "head": "\033[34m"}
MARKS = {"target": ("", ""), "draft": ("{", "}"), "ngram": ("[", "]"), "copy": ("«", "»"), "head": ("{{", "}}")}
RESET = "\033[0m"
ROUNDS = 3  # timed runs of each row, interleaved: a burst of other work slows a round of every row, not one row


def method_of(row: str) -> str:
    return "staged" if row == NO_COPIES else row


def marked(name: str, text: str, color: bool) -> str:
    """`text` marked as produced by stage `name`: in its colour, or between its marks."""
    start, end = (COLORS[name], RESET) if color else MARKS[name]
    return f"{start}{text}{end}"


def colour_by_stage(enc, result, color: bool, stop=()) -> str:
    """The prompt and the completion up to its first `stop`, each token marked by the stage that made it (Fig. 3)."""
    pieces = [decode(enc, [tok]) for tok in result.tokens]
    end, at, out = len(cut_at_stop("".join(pieces), stop)), 0, []
    for piece, src in zip(pieces, result.stats.source):
        piece, at = piece[:max(0, end - at)], at + len(piece)  # the token that holds the stop string's start: cut
        out.append(marked(SOURCES[src], piece, color) if piece else "")
    return PROMPT + "".join(out)


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def logit_gap(target, prompt, tokens, i) -> float:
    """Gap between the two largest target logits before token i: how near a tie it was."""
    top2 = np.sort(forward(target, list(prompt) + list(tokens[:i]), new_cache(target))[-1])[-2:]
    return float(top2[1] - top2[0])


def run_methods(target, draft, ngram, prompt, n_new, plans, head=None, rounds=ROUNDS, **kw) -> dict:
    """{row: (its Result, [seconds of each round])}: the rows decoded in turn, `rounds` times (the same tokens)."""
    results = {}
    for _ in range(rounds):
        for m, (plan, _) in plans.items():
            t0 = time.perf_counter()
            res = generate(target, prompt, n_new, method=method_of(m), plan=plan, keep_trees=True,
                           **models_for(method_of(m), draft, ngram, head), **kw)
            results.setdefault(m, (res, []))[1].append(time.perf_counter() - t0)
    return results


def spread(samples) -> tuple:
    """(lowest, median, highest) of repeated measurements of one figure."""
    return min(samples), float(np.median(samples)), max(samples)


def within_noise(speedups: dict) -> str:
    """The prose under the table: no order among rows whose speedup ranges overlap (within noise of each other)."""
    groups = []  # the rows by median speedup, in runs whose ranges overlap the next one's
    for m in sorted(speedups, key=lambda m: -np.median(speedups[m])):
        if groups and max(speedups[m]) >= min(min(speedups[g]) for g in groups[-1]):
            groups[-1].append(m)
        else:
            groups.append([m])
    best, *close = groups[0]
    said = (f"No row is fastest beyond the noise: {best}'s speedup range overlaps {', '.join(close)}'s." if close else
            f"Fastest here beyond the noise: {best} (its speedup range lies above every other row's).")
    tied = "; ".join(" ~ ".join(g) for g in groups if len(g) > 1)
    return said + (f"\nWithin noise of each other (their ranges overlap: no order between them): {tied}." * bool(tied))


def report(results: dict, chosen: dict, timed) -> None:
    """The runs' table, where each row's tokens came from, a note if the machine was busy since `timed`, the plans."""
    speeds = {m: [len(res.tokens) / dt for dt in dts] for m, (res, dts) in results.items()}
    speedups = {m: [x / base for x, base in zip(speeds[m], speeds["ar"])] for m in speeds}  # each round's own
    head = (f"{'method':<17}", "tokens/s", f"speedup (range over {len(speeds['ar'])} runs)", "target passes",
            "tokens/pass", "draft passes", "weight traffic", "tokens: draft", "guessed", "copied", "target")
    rows = ["| " + " | ".join(head) + " |", "|" + "|".join("-" * (len(h) + 2) for h in head) + "|"]
    for m, (res, _) in results.items():
        s, (lo, mid, hi) = res.stats, spread(speedups[m])
        cells = [f"{spread(speeds[m])[1]:.1f}", f"{mid:.2f}x ({lo:.2f}-{hi:.2f})", s.target_passes,
                 f"{s.tokens_per_pass:.2f}", s.draft_passes, f"{s.weight_traffic:.2f}", s.parts["draft"],
                 s.parts["ngram_guess"] + s.parts["copy_guess"], s.parts["copied"], s.parts["target"]]
        rows.append(f"| {m:<{len(head[0])}} | " + " | ".join(f"{c:>{len(h)}}" for c, h in zip(cells, head[1:])) + " |")
    print("\n".join(rows))
    print(f"tokens/s and speedup: the median of {len(speeds['ar'])} runs of each row, in turn (each run's speedup "
          "over that round's ar).\n" + within_noise({m: x for m, x in speedups.items() if m != "ar"}))
    print("Tokens: the draft's own; guessed: stage 2's guesses (the trigram's, or a repeat's) the draft kept, each "
          "saving it a pass (the paper's stage 2);\ncopied: a repeat's continuation sent to the target with no draft "
          "pass (prompt lookup's idea); target: the target's token ending each step."
          + "".join(f"\n{m}: its draft is the target's EAGLE head (its drafted tokens and passes are the head's)."
                    for m in results if METHODS[method_of(m)].drafts_with == "head"))
    if busy := timing_note(timed):
        print(busy)
    print("\nPlans:")
    for m, (plan, origin) in chosen.items():
        print(f"  {m}: {describe(method_of(m), plan)} ({origin})")


def plans(a, target, draft, ngram, enc, temperature, methods, head=None) -> tuple[dict, dict]:
    """({row: (plan, which plan and why, in words)}, the models' layout): each method's plan with --budget/--depth
    (`choice.choose`, as the CLI's), checked against the target's context; NO_COPIES: staged's fastest without."""
    changes = {name: getattr(a, name) for name in ("budget", "depth") if getattr(a, name) is not None}
    chosen = choose(target, draft, ngram, enc, temperature, tuple(m for m in methods if m != NO_COPIES),
                    a.plan, changes, head=head)
    if NO_COPIES in methods:  # as bench's row: the fastest staged plan here with no copies, or the constant plan's
        staged = chosen.get("staged")
        if staged is None or not staged.constant:  # a constant plan would be the same one again (and said again)
            staged = choose(target, draft, ngram, enc, temperature, ("staged",), a.plan, changes,
                            keep=lambda r: r["shape"].get("copy_len", 0) == 0)["staged"]
        chosen[NO_COPIES] = replace(staged, plan=replace(staged.plan, copy_len=0))
    for m, c in chosen.items():
        check_fits(c.plan, method_of(m), target.config.n_ctx)
    return {m: (chosen[m].plan, chosen[m].reason()) for m in methods}, next((c.layout for c in chosen.values()
                                                                               if c.layout), {})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_np demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens per completion (default: %(default)s)")
    ap.add_argument("--plan", default="machine", choices=("machine", "default"), help="each method with the plan "
                    "predicted fastest on this machine, or the core's constant plan (default: %(default)s)")
    ap.add_argument("--budget", type=int, help="tree and staged: a best-first tree of the draft's top tokens, this "
                    "many drafted tokens per step (instead of each plan's tree)")
    ap.add_argument("--depth", type=int, help="the best-first tree's maximum depth (the chain's length for "
                    "speculative and lookup)")
    ap.add_argument("--no-sampled", action="store_true", help="skip the sampled run")
    ap.add_argument("--stop", action="append", metavar="TEXT", help="end the completion shown at this text "
                    "(repeatable; backslash escapes understood, e.g. '\\ndef'; default: humaneval, HumanEval's stop "
                    "sequences, so it ends where the function ends; none: all of it); the tables' runs decode all "
                    "--max-new-tokens")
    a = ap.parse_args(argv)
    stops = stop_strings(a.stop or ["humaneval"])
    at_least(1, budget=a.budget, depth=a.depth, max_new_tokens=a.max_new_tokens)
    target, draft, ngram, enc = load_embedded()
    head = load_head(target=target)  # the row eagle's draft
    color, prompt = sys.stdout.isatty() and "NO_COLOR" not in os.environ, encode(enc, PROMPT)
    methods = ["ar", "speculative", "tree", "staged", NO_COPIES, "lookup", "eagle"]  # the last two: outside the paper
    chosen, layout = plans(a, target, draft, ngram, enc, 0.0, methods, head)  # a bad --budget fails before any output
    if layout:  # the plans were priced on this machine's costs (measured, or cached): plain decoding's roofline
        print(roofline(calibration(target, draft, ngram, calibration_prompts(enc))[0], target))
    target, draft, head = apply_layout(layout, target, draft, head)
    print(f"target: {target.n_params / 1e6:.1f}M parameters, draft: {draft.n_params / 1e6:.2f}M, stage 2: Katz "
          f"trigram, EAGLE head: {head.n_params / 1e6:.2f}M of its own. Prompt ({len(prompt)} tokens):\n\n{PROMPT}")
    if a.max_new_tokens > target.config.n_ctx - len(prompt):
        print(f"note: --max-new-tokens {a.max_new_tokens}: the target's context ({target.config.n_ctx} tokens) "
              f"leaves room for {target.config.n_ctx - len(prompt)} after the prompt, where each completion stops\n")
    generate(target, prompt, 4, method="staged", draft=draft, ngram=ngram, plan=chosen["staged"][0])  # warm up
    timed, results = cpu_times(), run_methods(target, draft, ngram, prompt, a.max_new_tokens, chosen, head)
    ref = results["ar"][0].tokens
    print("== greedy decoding (temperature 0)\n")
    differ = {m: i for m in methods[1:] if (i := first_difference(ref, results[m][0].tokens)) is not None}
    for m, i in differ.items():
        print(f"NOTE: {m} differs from autoregressive at new token {i}: the target's top-2 logit gap there is "
              f"{logit_gap(target, prompt, ref, i):.2e} (a float32 near-tie flipped by a different block shape)")
    if not differ:
        print(f"All {len(methods)} rows produced the identical completion ({len(ref)} tokens), as lossless decoding "
              "must.\n")
    report(results, chosen, timed)
    print(f"4-gram repeats: {repeat_share(ref):.2f} of the {len(ref)} emitted tokens end a 4-gram already in the "
          "output (near 1: a loop, which copies verify cheaply; docs/results.md)")
    if chosen["staged"][0].copy_len:
        print(f"When the context's last three tokens occurred earlier, staged has the target verify the "
              f"{chosen['staged'][0].copy_len} tokens that followed them, with no draft pass (copy tokens below).")
    shown = staged = results["staged"][0]
    legend = "  ".join(marked(n, n, color) for n in ("copy", "ngram", "draft", "target")) + " (unmarked)" * (not color)
    if stops:  # decoded again, ended at the stop strings: the same text up to them (the table's runs go on)
        shown = generate(target, prompt, a.max_new_tokens, "staged", draft, ngram, chosen["staged"][0], stop=stops)
    ended = (f", ended by --stop at the first of {stops_said(stops)}: decoding stopped after {len(shown.tokens)} "
             f"tokens (the tables decode all {len(staged.tokens)})") if stops else ""
    print(f"\nThe staged completion{ended}, coloured by the stage that produced each token ({legend}):\n")
    print(colour_by_stage(enc, shown, color, stops))
    print(f"\ntokens by stage: {shown.stats.tally}")
    # A tree of the draft's alone where there is one; else (stage 2 guessed in every step) one of any proposer's.
    alone = [tp for tp in staged.stats.trees if not {NGRAM, COPY} & set(tp[0].source)]
    trees = alone or [tp for tp in staged.stats.trees if len(tp[0].tokens) > 1]
    if trees:
        tree, path = max(trees[: len(trees) // 2 + 1], key=lambda tp: len(tp[1]))
        print(f"\nOne verification tree ({len(tree.tokens) - 1} {'drafted' if alone else 'proposed'} tokens; "
              f"* = accepted path, {len(path) - 1} accepted + 1 from the target):\n")
        print(render(tree, decode_fn=lambda t: decode(enc, [t]), accepted=path))
    if not a.no_sampled:
        print("\n== sampled decoding (top-k 50, temperature 1): the output is a sample of the target's distribution")
        splans, _ = plans(a, target, draft, ngram, enc, 1.0, ["ar", "staged", NO_COPIES])  # the same layout
        timed = cpu_times()
        sampled = run_methods(target, draft, ngram, prompt, a.max_new_tokens, splans, temperature=1.0, top_k=50, seed=1)
        print()
        report(sampled, splans, timed)
        print(f"\nIts staged completion{f' up to the first stop string (--stop)' * bool(stops)}:\n"
              + colour_by_stage(enc, sampled["staged"][0], color, stops))
    return 0
