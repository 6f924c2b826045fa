"""How often an EAGLE head's first guess would be accepted, beside the draft model's, in specdec_np itself.

    python weights/head_match.py [HEAD_DIR ...]      # default: the shipped tiny-eagle/

For each head (bound to the embedded target) and the embedded draft model, at every position of two sets of
257-token windows: the first guess's chance of acceptance at top-k 50, T=1 (sum min(p, q): the head's q from the
target's true feature of the token before and the token, as after a step that accepted everything) and whether its
argmax is the target's (greedy). The windows: 64 evenly spaced in the standard library's held-out files (the model
card's set, from weights/build_corpus.py's corpus), and the target's own top-k 50 continuations (seeded) of the last
64 tokens of HumanEval's first 64 prompts (what bench's decoding asks of a drafter).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from specdec_np import decode, eagle, models  # noqa: E402
from specdec_np.gpt2 import forward, hidden, lm_head, new_cache  # noqa: E402
from specdec_np.sampling import process  # noqa: E402
from train_tiny import WORK, read_corpus  # noqa: E402

WINDOW, PREFIX, TOP_K = 257, 64, 50


def first_guesses(target, draft, heads: dict, windows) -> dict:
    """{name: (accepted at top-k, argmax agrees)} over every position of `windows` (token lists), the draft's too."""
    sums = {name: np.zeros(2) for name in [*heads, "draft"]}
    count = 0
    for w in windows:
        n = len(w)
        feats = hidden(target, w, new_cache(target))  # [n, D]
        logits = lm_head(target, feats[1:])  # [n - 1, V]: the target's after tokens 1..n-1
        p = process(logits, 1.0, TOP_K)
        guesses = {"draft": forward(draft, w, new_cache(draft))[1:]}
        for name, head in heads.items():
            h = eagle.head_pass(head, feats[:-1], np.array(w[1:]), np.arange(1, n), new_cache(head),
                                np.tril(np.ones((n - 1, n - 1), dtype=bool)))  # its guesses of f_1..f_(n-1)
            guesses[name] = eagle.head_logits(head, h)
        for name, q_logits in guesses.items():
            q = process(q_logits, 1.0, TOP_K)
            sums[name] += [np.minimum(p, q).sum(), (q_logits.argmax(-1) == logits.argmax(-1)).sum()]
        count += n - 1
    return {name: tuple(float(x) / count for x in s) for name, s in sums.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", nargs="*", type=Path, help="head checkpoint directories (default: tiny-eagle)")
    ap.add_argument("--corpus", type=Path, default=WORK / "corpus")
    a = ap.parse_args()
    target, draft, _, _ = models.load_embedded()
    heads = {str(p): models.load_head(p, target) for p in a.heads or [models.EMBEDDED_HEAD]}
    held = read_corpus(a.corpus)["heldout"]
    sets = {"held-out corpus": [held[s:s + WINDOW].tolist()
                                for s in np.linspace(0, held.size - WINDOW - 1, 64).astype(int)]}
    prompts = [p["prompt"][-PREFIX:] for p in json.loads((a.corpus / "prompts.json").read_text())["humaneval"][:64]]
    sets["target after HumanEval"] = [p + decode.generate(target, p, WINDOW - len(p), temperature=1.0, top_k=TOP_K,
                                                          seed=i, eos=None).tokens for i, p in enumerate(prompts)]
    for where, windows in sets.items():
        got = first_guesses(target, draft, heads, windows)
        print(f"{where} ({sum(len(w) - 1 for w in windows)} positions): " + "; ".join(
            f"{name}: accepted at top-k {acc:.4f}, argmax {agree:.4f}" for name, (acc, agree) in got.items()))


if __name__ == "__main__":
    main()
