"""What each one-row way (`Layout.one_row`) gives end to end, and the EAGLE head's one-row pass each way
(docs/performance.md, "One token"):

    python weights/one_row_ab.py [--threads 1] [--prompts 8] [--tokens 64]

1. Plain decoding at top-k 50 (the first --prompts HumanEval prompts, --tokens new tokens each, two rounds), the
   target's one row by each way, run by run in turns (the order reversed every other run); the median ms a token and,
   run by run, gemv's time over the pair's.
2. The embedded EAGLE head's one-row pass (`head_pass`, `head_features`, `head_logits`) after 200 pairs in its cache,
   warm, by each way, 400 rounds in turns after a warm-up (`costcurve.round_robin`); the median us.
Both with --threads BLAS threads (1: what a busy machine's run uses, `machine.settle_threads`).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import decode, eagle  # noqa: E402
from specdec_np.fastpath import ONE_ROW, laid_out  # noqa: E402
from specdec_np.gpt2 import new_cache  # noqa: E402
from specdec_np.models import load_embedded, load_head  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.costcurve import round_robin  # noqa: E402
from specdec_np.tools.machine import blas_name, machine_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    threadpool_limits(a.threads, user_api="blas")
    target, _, _, enc = load_embedded()
    head = load_head(target=target)
    print(f"{machine_name()}; {blas_name()}")
    prompts = bench.prompt_tokens(acceptance.read_prompts(bench.humaneval_file())[:a.prompts], enc,
                                  target.config.n_ctx, a.tokens)
    models = {how: laid_out(target, 16, one_row=how) for how in ONE_ROW}

    def run(how, prompt, seed):  # seconds a token
        t0 = time.perf_counter()
        res = decode.generate(models[how], prompt, a.tokens, "ar", temperature=1.0, top_k=50, seed=seed)
        return (time.perf_counter() - t0) / len(res.tokens)
    per_token = {how: [] for how in ONE_ROW}
    for i, prompt in enumerate(prompts * 2):  # two rounds
        for how in ONE_ROW if i % 2 == 0 else ONE_ROW[::-1]:
            per_token[how].append(run(how, prompt, i))
    ratio = np.array(per_token["gemv"]) / np.array(per_token["pair"])
    print("plain decoding, top-k 50, ms a token: " + ", ".join(f"{how} {1000 * np.median(t):.2f}"
                                                               for how, t in per_token.items())
          + f"; gemv over the pair, run by run: median {np.median(ratio):.2f}x ({ratio.min():.2f}-{ratio.max():.2f})")
    heads = {how: laid_out(head, 16, one_row=how) for how in ONE_ROW}
    rng = np.random.default_rng(0)
    feature = rng.standard_normal((1, head.n_feature)).astype(head.dtype)

    def primed(h):  # its cache after 200 pairs
        cache = new_cache(h, 64)
        eagle.head_pass(h, rng.standard_normal((200, head.n_feature)).astype(head.dtype), np.arange(200),
                        np.arange(1, 201), cache, np.tril(np.ones((200, 200), dtype=bool)))
        return cache
    caches = {how: primed(h) for how, h in heads.items()}

    def head_step(how):  # seconds of one one-row pass, its guess and its q
        h, cache = heads[how], caches[how]
        length, t0 = cache.length, time.perf_counter()
        x = eagle.head_pass(h, feature, np.array([7]), np.array([length + 1]), cache, np.ones((1, length + 1), bool))
        eagle.head_features(h, x), eagle.head_logits(h, x)
        seconds = time.perf_counter() - t0
        cache.truncate(length)
        return seconds
    ms = round_robin({how: functools.partial(head_step, how) for how in ONE_ROW}, 400)  # medians
    print("the EAGLE head's one-row pass, us: " + ", ".join(f"{how} {1000 * t:.0f}" for how, t in ms.items()))


if __name__ == "__main__":
    main()
