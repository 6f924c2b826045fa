"""Two cheap changes to the draft model's q, measured: what each gives in acceptance and in a draft pass's cost.

    python weights/q_study.py [--prompts 16] [--rounds 60]

Every verification rule is lossless for any q the tree was drawn from, so a drafter may draft from a q other than
the draft model's own processed distribution. Two such q, both from the literature:

1. The draft's temperature (T_q): q = the draft's top-k 50 softmax at T_q instead of the target's T = 1. A
   distilled draft is not calibrated against the target's top-k: a colder q can overlap p more.
2. A reduced vocabulary (FR-Spec, Zhao et al. 2025, arXiv 2502.14856; EAGLE-3's draft vocabulary): the draft's LM
   head on the N most frequent tokens only (here the EAGLE head's 2048, counted on the training corpus), q = 0
   elsewhere. With GPT-2's tied head on an 8,193-token vocabulary the head is 4.2 MB of the draft's 6.0 MB.

Acceptance: the target samples 128 tokens (top-k 50, T = 1, one seed per prompt) after each of the first
`--prompts` HumanEval prompts; at every position sum_x min(p, q) (the chance a token drawn from q is accepted by
the speculative-sampling rule) and whether q's argmax is the target's (greedy acceptance), averaged over positions.
Cost: a draft step (its pass over k tokens, the head, q processed) with the full and the reduced head, timed
round-robin, warm (after a draft pass) and cold (after a target pass, as in the loop), the median of `--rounds`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import decode, models, tokenizer  # noqa: E402
from specdec_np.fastpath import Weight  # noqa: E402
from specdec_np.gpt2 import forward, hidden, new_cache  # noqa: E402
from specdec_np.sampling import process  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.acceptance import calibration_prompts  # noqa: E402
from specdec_np.tools.calibration import calibration  # noqa: E402
from specdec_np.tools.costcurve import apply_layout, primed, round_robin, timed_pass  # noqa: E402
from specdec_np.tools.costmodel import machine_layout  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402

TOP_K = 50


def scored(target, draft, prompts, new_tokens: int = 128):
    """(p [n, V]: the target's top-k 50 distribution, draft logits [n, V]) at every position the target sampled."""
    p, logits = [], []
    for seed, prompt in enumerate(prompts):
        seq = prompt + decode.generate(target, prompt, new_tokens, temperature=1.0, top_k=TOP_K, seed=seed).tokens
        n = len(prompt) - 1  # the position whose next token is the first sampled one
        p.append(process(forward(target, seq[:-1], new_cache(target, len(seq)))[n:], 1.0, TOP_K))
        logits.append(forward(draft, seq[:-1], new_cache(draft, len(seq)))[n:])
    return np.concatenate(p), np.concatenate(logits)


def q_of(logits, ids, temperature: float):  # [n, V] -> [n, V]
    """The draft's top-k 50 q at `temperature`, on the tokens `ids` only (None: all), zero elsewhere."""
    if ids is None:
        return process(logits, temperature, TOP_K)
    q = np.zeros(logits.shape)
    q[:, ids] = process(logits[:, ids], temperature, TOP_K)
    return q


def draft_step(draft, cache, head, ids, k: int):
    """Seconds of a draft step over k tokens: the pass, the head (`head` [d, N]), q [k, V] processed."""
    length, t = cache.length, time.perf_counter()
    logits = hidden(draft, np.arange(k) + 5, cache) @ head  # [k, N]
    q = np.zeros((k, draft.config.n_vocab))
    q[:, ids] = process(logits, 1.0, TOP_K)
    seconds = time.perf_counter() - t
    cache.truncate(length)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=60)
    a = ap.parse_args()
    target, draft, ngram, enc = models.load_embedded()
    ids = models.load_head(target=target).ids  # [2048]: the head's draft vocabulary
    texts = acceptance.read_prompts(bench.humaneval_file())[:a.prompts]
    prompts = [tokenizer.encode(enc, t)[-(target.config.n_ctx - 130):] for t in texts]
    p, logits = scored(target, draft, prompts)
    print(f"{machine_name()}; {len(p)} positions of the target's samples after {len(prompts)} HumanEval prompts")
    print(f"p's mass on the {ids.size} tokens: {p[:, ids].sum(-1).mean():.3f}")
    print("| q | accepted at top-k 50 (sum min(p, q)) | argmax = the target's |\n|---|---|---|")
    for name, vocab in (("all tokens", None), (f"{ids.size} tokens", ids)):
        greedy = ((logits if vocab is None else np.where(np.isin(np.arange(logits.shape[1]), vocab), logits, -np.inf))
                  .argmax(-1) == p.argmax(-1)).mean()
        for temperature in (0.7, 0.8, 0.9, 1.0, 1.1):
            accepted = np.minimum(p, q_of(logits, vocab, temperature)).sum(-1).mean()
            print(f"| {name}, T_q {temperature} | {accepted:.4f} | {greedy:.4f} |")

    costs, _ = calibration(target, draft, ngram, calibration_prompts(enc))
    target, draft = apply_layout(machine_layout(costs), target, draft)
    heads = {"full": (draft.prepared["head"], np.arange(draft.config.n_vocab)),
             "reduced": (Weight.of(np.ascontiguousarray(draft.params["wte"][ids].T), draft.layout.slab_rows), ids)}
    t_cache, d_cache = primed(target, 200, 8), primed(draft, 200, 8)

    def step(k, cold, which):
        timed_pass(target, t_cache, 1) if cold else timed_pass(draft, d_cache, 1)
        return draft_step(draft, d_cache, *heads[which], k)
    cases = {(k, cold, which): functools.partial(step, k, cold, which)
             for k in (1, 2, 4) for cold in (False, True) for which in heads}
    ms = round_robin(cases, a.rounds)
    print(f"\ndraft step (pass, head, q processed), ms, median of {a.rounds} rounds, round-robin\n"
          "| tokens | state | full head | reduced head | saved |\n|---|---|---|---|---|")
    for k in (1, 2, 4):
        for cold in (False, True):
            full, red = ms[k, cold, "full"], ms[k, cold, "reduced"]
            print(f"| {k} | {'cold' if cold else 'warm'} | {full:.3f} | {red:.3f} | {1 - red / full:.0%} |")


if __name__ == "__main__":
    main()
