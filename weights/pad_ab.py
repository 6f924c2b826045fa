"""The target's padding table with and without a margin for noise (docs/performance.md, "Padding past the noise"):

    python weights/pad_ab.py [--curves 3] [--limit 16] [--seeds 2]

First --curves cost curves of the target alone (`costcurve.loop_curves`, 9 rounds each, sizes 1-8, no padding), each
with the padding tables `costmodel.pad_size` makes of it with its margin (PAD_SLACK) and without (slack 0). Then
EAGLE's chain of 4 at top-k 50 (T=1, drawn from the head, min_q 0.3: the plan the Zen 4 bench chose) with the
cached calibration's table (margin) and the same table where the margin-free rule pads 3-5 rows differently, beside
plain decoding: the first --limit HumanEval prompts x --seeds seeds, 128 new tokens, every variant in turn per prompt
(the order reversed every other prompt); tokens/s over plain decoding and between the tables, with 95% intervals
resampling prompts (bench.paired_ratio).
"""
import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import decode  # noqa: E402
from specdec_np.models import load_embedded, load_head  # noqa: E402
from specdec_np.plan import Plan  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.calibration import calibration  # noqa: E402
from specdec_np.tools.costcurve import apply_layout, loop_curves  # noqa: E402
from specdec_np.tools.costmodel import PAD_SLACK, machine_layout, pad_size  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 6, 8)


def table(curve: dict, slack: float = PAD_SLACK) -> list[int]:
    """The rows 1..8 tokens are computed as."""
    return [pad_size(curve, k, slack) for k in range(1, 9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--curves", type=int, default=3, help="cost curves to measure (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=16, help="HumanEval prompts (default: %(default)s)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per prompt (default: %(default)s)")
    a = ap.parse_args()
    target, draft, ngram, enc = load_embedded()
    head = load_head(target=target)
    costs, _ = calibration(target, draft, ngram, acceptance.calibration_prompts(enc), head=head)
    target, head = apply_layout(machine_layout(costs), target, head)
    print(machine_name())
    bare = dataclasses.replace(target, layout=dataclasses.replace(target.layout, padding=()))
    for _ in range(a.curves):
        curve = loop_curves(bare, None, sizes=SIZES)["target"]["warm"]
        print("target, ms per pass: " + ", ".join(f"{k} {ms:.2f}" for k, ms in curve.items())
              + f"; padded {table(curve)}, without the margin {table(curve, 0.0)}")
    cached = costs["curves"]["target"]["warm"]
    margin, no_margin = table(cached), table(cached, 0.0)
    print(f"cached calibration's table {margin}, without the margin {no_margin}")
    # The other table: the margin-free one where it pads 3-5 rows further, else 3 and 4 as 5 (yesterday's noise).
    other = no_margin[:5] if no_margin[:5] != margin[:5] else [1, 2, 5, 5, 5]
    padded = {"margin": target, "other": dataclasses.replace(target, layout=dataclasses.replace(
        target.layout, padding=tuple(other) + target.layout.padding[5:]))}
    print(f"the tables compared: 1-5 rows as {list(target.layout.padding[:5])} (margin) and as {other}")
    plan = Plan(shape="fixed", widths=(1, 1, 1, 1), sampled="without", min_q=0.3)
    texts = acceptance.read_prompts(bench.humaneval_file())[:a.limit]
    prompts = bench.prompt_tokens(texts, enc, target.config.n_ctx, 128)
    recs = {v: [] for v in ("ar", *padded)}
    for i, prompt in enumerate(prompts):
        for seed in range(a.seeds):
            for v in (list(recs) if (i + seed) % 2 == 0 else list(recs)[::-1]):
                t0 = time.perf_counter()
                if v == "ar":
                    res = decode.generate(target, prompt, 128, "ar", temperature=1.0, top_k=50, seed=i + 1000 * seed)
                else:
                    res = decode.generate(padded[v], prompt, 128, "eagle", head, plan=plan, temperature=1.0, top_k=50,
                                          seed=i + 1000 * seed)
                recs[v].append({"prompt": i, "seconds": time.perf_counter() - t0, "tokens": len(res.tokens)})
    print(f"{len(prompts)} prompts x {a.seeds} seeds, 128 tokens, top-k 50; EAGLE chain of 4, min_q 0.3")
    for v in padded:
        print("{}: {:.3f}x ({:.3f}-{:.3f}) plain decoding".format(v, *bench.paired_ratio(recs[v], recs["ar"])))
    print("margin over other: {:.3f}x ({:.3f}-{:.3f})".format(*bench.paired_ratio(recs["margin"], recs["other"])))


if __name__ == "__main__":
    main()
