"""End to end, side by side: the draft model's q as today against a colder q on a reduced vocabulary (q_study.py).

    python weights/q_ab.py [--limit 16] [--seeds 2] [--q-temperature 0.8]

Each HumanEval prompt (the first --limit), 128 new tokens, speculative decoding with this machine's plan for it
(tools/choice.py, as bench chooses it), run with the draft as the core drafts (q: the draft's processed distribution
at the target's settings, over every token) and with a drafter whose q is the draft's at T x --q-temperature, on the
EAGLE head's 2,048-token vocabulary only (its LM head the 2,048 rows of the tied embedding, q = 0 elsewhere;
FR-Spec, arXiv 2502.14856). Any q is lossless: greedy, both must emit plain decoding's tokens (checked). The two
alternate run by run (which goes first alternates too); tokens/s over today's, with a 95% interval resampling
prompts (bench.paired_ratio). Greedy (T_q changes nothing there) and top-k 50, T=1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import decode, drafting, methods, models, tokenizer  # noqa: E402
from specdec_np.fastpath import Weight  # noqa: E402
from specdec_np.gpt2 import hidden  # noqa: E402
from specdec_np.sampling import process  # noqa: E402
from specdec_np.tools import acceptance, bench  # noqa: E402
from specdec_np.tools.choice import choose  # noqa: E402
from specdec_np.tools.costcurve import apply_layout  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402
from specdec_np.tree import block  # noqa: E402

CORE = methods.ModelDrafter


def reduced_drafter(ids, q_temperature: float):
    """A ModelDrafter whose q is the draft's at T x q_temperature on the tokens `ids` only (zero elsewhere)."""
    class Reduced(CORE):
        def __init__(self, model, temperature=0.0, *rest, **kw):
            super().__init__(model, temperature, *rest, **kw)
            t, k, p = self.settings
            self.settings = (t * q_temperature if temperature else t, k, p)
            self.head = Weight.of(np.ascontiguousarray(model.params["wte"][ids].T), model.layout.slab_rows,
                                  max(1, model.layout.gemv_rows))  # [d, N]

        def draft_pass(self, keys) -> None:  # the core's, its logits [len(keys), N] on the reduced head
            first = len(self.tokens)
            self.feed(keys)
            tokens, positions, mask, n_c = block(self.seq, self.cache.length, self.tokens, self.parents, first)
            logits = hidden(self.model, tokens, self.cache, positions, mask, n_c) @ self.head
            self.logits.update(zip(keys, logits))
            self.block_sizes.append(len(tokens))
            self.recorder.draft_pass(keys, [drafting.DRAFT] * len(keys), len(tokens))

        def dist_fn(self, tokens, parents, nodes):  # -> [len(nodes), V], q processed on the N tokens
            keys = [drafting.path_key(tokens, parents, i) for i in nodes]
            if missing := [k for k in dict.fromkeys(keys) if k not in self.logits]:
                self.draft_pass(missing)
            if todo := [k for k in dict.fromkeys(keys) if k not in self.dist]:
                self.dists += len(todo)
                q = np.zeros((len(todo), self.model.config.n_vocab))
                q[:, ids] = process(np.stack([self.logits[k] for k in todo]), *self.settings)
                self.dist.update(zip(todo, q))
            return np.stack([self.dist[k] for k in keys])
    return Reduced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--q-temperature", type=float, default=0.8)
    a = ap.parse_args()
    target, draft, ngram, enc = models.load_embedded()
    ids = models.load_head(target=target).ids
    prompts = bench.prompt_tokens(acceptance.read_prompts(bench.humaneval_file())[:a.limit], enc,
                                  target.config.n_ctx, 128)
    variants = {"today": CORE, "reduced": reduced_drafter(ids, a.q_temperature)}
    print(f"{machine_name()}; {len(prompts)} prompts x 128 tokens; q: T x {a.q_temperature} on {ids.size} tokens")
    for setting, kw in (("greedy", {"temperature": 0.0}), ("top-k", {"temperature": 1.0, "top_k": 50})):
        chosen = choose(target, draft, ngram, enc, kw["temperature"], ("speculative",), "machine")["speculative"]
        t, d = apply_layout(chosen.layout, target, draft)  # none where the plan is the constant one: as bench
        recs = []
        for i, prompt in enumerate(prompts):
            for seed in range(a.seeds if kw["temperature"] else 1):
                order = list(variants) if (i + seed) % 2 == 0 else list(variants)[::-1]
                for name in order:
                    methods.ModelDrafter = variants[name]
                    t0 = time.perf_counter()
                    res = decode.generate(t, prompt, 128, "speculative", d, plan=chosen.plan, seed=seed, **kw)
                    recs.append({"method": name, "prompt": i, "seed": seed, "seconds": time.perf_counter() - t0,
                                 "tokens": len(res.tokens), "ids": res.tokens, "passes": res.stats.target_passes})
        methods.ModelDrafter = CORE
        if setting == "greedy":
            by = {(r["prompt"], r["method"]): r["ids"] for r in recs}
            assert all(by[i, "today"] == by[i, "reduced"] for i in range(len(prompts))), "greedy tokens differ"
        ratio, low, high = bench.paired_ratio([r for r in recs if r["method"] == "reduced"],
                                              [r for r in recs if r["method"] == "today"])
        tpp = {m: sum(r["tokens"] for r in recs if r["method"] == m) / sum(r["passes"] for r in recs
                                                                            if r["method"] == m) for m in variants}
        print(f"{setting}: speculative, {chosen.reason()}: reduced q over today's tokens/s {ratio:.3f}x "
              f"({low:.3f}-{high:.3f}); tokens per target pass {tpp['today']:.2f} -> {tpp['reduced']:.2f}")


if __name__ == "__main__":
    main()
