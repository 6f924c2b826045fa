"""EAGLE's chains at top-k with and without `Plan.min_q` (docs/performance.md, "A chain that stops"):

    python weights/min_q_ab.py [--limit 16] [--seeds 2] [--min-q 0.3 0.5]

Plain decoding and EAGLE at top-k 50 (T=1; chains of 3, 4 and 6 drawn from the head, traversal), each chain with
min_q 0 and each given value, the first --limit HumanEval prompts x --seeds seeds, 128 new tokens, every variant in
turn per prompt (the order reversed every other prompt), the models laid out as this machine's cached costs say (as
bench). Per variant: tokens/s over plain decoding and over the same chain without min_q, with 95% intervals resampling
prompts (bench.paired_ratio), tokens and head passes per target pass.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import decode  # noqa: E402
from specdec_np.models import load_embedded, load_head  # noqa: E402
from specdec_np.plan import Plan  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.calibration import calibration  # noqa: E402
from specdec_np.tools.costcurve import apply_layout  # noqa: E402
from specdec_np.tools.costmodel import machine_layout  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=16, help="HumanEval prompts (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per prompt (default: %(default)s)")
    ap.add_argument("--min-q", type=float, nargs="+", default=[0.3, 0.5], help="values beside 0 (default: 0.3 0.5)")
    a = ap.parse_args()
    target, draft, ngram, enc = load_embedded()
    head = load_head(target=target)
    costs, _ = calibration(target, draft, ngram, acceptance.calibration_prompts(enc), head=head)
    target, head = apply_layout(machine_layout(costs), target, head)
    chain = dict(shape="fixed", sampled="without", rule="traversal")
    variants = {"ar": Plan()} | {(k, q): Plan(widths=(1,) * k, min_q=q, **chain) for k in (3, 4, 6)
                                 for q in (0.0, *a.min_q)}
    texts = acceptance.read_prompts(bench.humaneval_file())[:a.limit]
    prompts = bench.prompt_tokens(texts, enc, target.config.n_ctx, 128)
    recs = {v: [] for v in variants}
    for i, prompt in enumerate(prompts):
        for seed in range(a.seeds):
            for v in (list(variants) if (i + seed) % 2 == 0 else list(variants)[::-1]):
                t0 = time.perf_counter()
                res = decode.generate(target, prompt, 128, "ar" if v == "ar" else "eagle", None if v == "ar" else head,
                                      plan=variants[v], temperature=1.0, top_k=50, seed=i + 1000 * seed)
                recs[v].append({"prompt": i, "seconds": time.perf_counter() - t0, "tokens": len(res.tokens),
                                "target_passes": res.stats.target_passes, "head_passes": res.stats.draft_passes})
    print(f"{machine_name()}; {len(prompts)} prompts x {a.seeds} seeds, 128 tokens, top-k 50")
    for v in variants:
        if v == "ar":
            continue
        k, q = v
        passes = sum(r["target_passes"] for r in recs[v])
        over_ar = "{:.2f}x ({:.2f}-{:.2f})".format(*bench.paired_ratio(recs[v], recs["ar"]))
        over_0 = "" if q == 0 else "; over min_q 0: {:.3f}x ({:.3f}-{:.3f})".format(
            *bench.paired_ratio(recs[v], recs[(k, 0.0)]))
        print(f"chain of {k}, min_q {q}: {over_ar} plain decoding{over_0}; "
              f"{sum(r['tokens'] for r in recs[v]) / passes:.2f} tokens and "
              f"{sum(r['head_passes'] for r in recs[v]) / passes:.2f} head passes per target pass")


if __name__ == "__main__":
    main()
