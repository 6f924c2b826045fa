"""EAGLE's top-k step, today's against the previous (docs/performance.md, "One token"):

    python weights/topk_step_ab.py [pair|slabs|gemv]

EAGLE at top-k 50 (widths 1,1,1 drawn from the head, traversal), the first 16 HumanEval prompts x 2 seeds, 128 new
tokens, the target's one row as a pair: today's code (top-k's threshold by `fastpath.kth_largest`, the head's one row
as the argument says, as the calibration may choose it) against the previous (a partition of the whole row, the
head's one row one matrix-vector product), alternating run by run; both must emit the same tokens (checked).
Tokens/s of today's over the previous, with a 95% interval resampling prompts (bench.paired_ratio).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import build, decode, sampling  # noqa: E402
from specdec_np.fastpath import ONE_ROW, laid_out  # noqa: E402
from specdec_np.models import load_embedded, load_head  # noqa: E402
from specdec_np.plan import Plan  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402

TODAY = sampling.top_ids


def previous_top_ids(probs, k: int):  # the previous sampling.top_ids: a partition of the whole row
    V = probs.size
    if k == 1:
        return np.array([np.argmax(probs)])
    ids = np.flatnonzero(probs >= np.partition(probs, V - k)[V - k]) if k < V else np.arange(V)
    return ids[np.argsort(-probs[ids], kind="stable")][:k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("way", nargs="?", default="pair", choices=ONE_ROW, help="today's head's one row")
    way = ap.parse_args().way
    target, _, _, enc = load_embedded()
    head = load_head(target=target)
    target = laid_out(target, 16, one_row="pair")
    heads = {"previous": laid_out(head, 16, one_row="gemv"), "today": laid_out(head, 16, one_row=way)}
    plan = Plan(shape="fixed", widths=(1, 1, 1), sampled="without", rule="traversal")
    prompts = bench.prompt_tokens(acceptance.read_prompts(bench.humaneval_file())[:16], enc, target.config.n_ctx, 128)
    recs = {k: [] for k in heads}
    for seed in range(2):
        for i, prompt in enumerate(prompts):
            for k in (list(heads) if (i + seed) % 2 == 0 else list(heads)[::-1]):
                sampling.top_ids = build.top_ids = TODAY if k == "today" else previous_top_ids
                t0 = time.perf_counter()
                res = decode.generate(target, prompt, 128, "eagle", heads[k], plan=plan, temperature=1.0, top_k=50,
                                      seed=i + 100 * seed)
                recs[k].append({"prompt": i, "seed": seed, "seconds": time.perf_counter() - t0,
                                "tokens": len(res.tokens), "ids": res.tokens})
    sampling.top_ids = build.top_ids = TODAY
    assert all(a["ids"] == b["ids"] for a, b in zip(recs["today"], recs["previous"])), "the tokens differ"
    ratio, low, high = bench.paired_ratio(recs["today"], recs["previous"])
    rate = {k: sum(r["tokens"] for r in v) / sum(r["seconds"] for r in v) for k, v in recs.items()}
    print(f"{machine_name()}; the head's one row {way}: today's tokens/s over the previous {ratio:.3f}x "
          f"({low:.3f}-{high:.3f}); {rate['previous']:.1f} -> {rate['today']:.1f} tokens/s")


if __name__ == "__main__":
    main()
