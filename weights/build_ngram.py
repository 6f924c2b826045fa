"""Build the shipped stage-2 drafter: a Katz backoff trigram, as the paper did, from draft samples.

    python weights/build_ngram.py [--tokens 1500000]     # NumPy only; after export_tiny.py

1. Sample text from the exported draft at temperature 1.5 (the paper's recipe), resumably in chunks.
2. Fit three trigrams: on the draft's samples, on the training corpus, and on both.
3. Measure how often each one's top-1 equals the draft's argmax on held-out text (the n-gram's job
   in staged decoding is to guess the *draft*), and ship the best as specdec_np/weights/tiny-trigram.npz.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
sys.path.insert(0, str(HERE.parent))

from specdec_np import checkpoint, ngram  # noqa: E402
from specdec_np.decode import generate  # noqa: E402
from specdec_np.files import SHIPPED_DIR  # noqa: E402  (specdec_np/weights/: the package data)
from specdec_np.gpt2 import forward, new_cache  # noqa: E402

CHUNK = 100  # sequences per saved chunk


def sample_draft(n_tokens: int, seq_len: int = 256) -> np.ndarray:
    draft = checkpoint.load(SHIPPED_DIR / "tiny-draft")
    eot = draft.config.n_vocab - 1
    chunks = sorted(WORK.glob("draft_samples_*.npy"))
    have = sum(np.load(c).size for c in chunks)
    i = len(chunks)
    while have < n_tokens:
        t0, out = time.time(), []
        for j in range(CHUNK):
            seed = i * CHUNK + j
            res = generate(draft, [eot], seq_len, method="ar", temperature=1.5, seed=seed, eos=None)
            out += [eot] + res.tokens
        arr = np.array(out, dtype=np.uint16)
        tmp = WORK / f"draft_samples_{i:04d}.tmp.npy"
        np.save(tmp, arr)
        tmp.rename(WORK / f"draft_samples_{i:04d}.npy")
        have += arr.size
        i += 1
        print(f"chunk {i}: {have} tokens ({arr.size / (time.time() - t0):.0f} tok/s)", flush=True)
    return np.concatenate([np.load(c) for c in sorted(WORK.glob("draft_samples_*.npy"))])


def draft_argmax_on_heldout(n_windows: int = 40, window: int = 256):
    """(contexts, draft argmax) at every position of fixed held-out windows."""
    draft = checkpoint.load(SHIPPED_DIR / "tiny-draft")
    held = np.load(WORK / "heldout.npy").astype(np.int64)
    starts = np.linspace(0, held.size - window - 1, n_windows).astype(np.int64)
    ctx, target = [], []
    for s in starts:
        w = held[s:s + window]
        logits = forward(draft, w, new_cache(draft))
        ctx.append(w)
        target.append(np.argmax(logits, axis=-1))
    return ctx, target


def agreement(model, ctx, target) -> float:
    hits = total = 0
    for w, t in zip(ctx, target):
        for i in range(1, len(w)):
            guess = ngram.greedy_continuation(model, w[max(0, i - 1):i + 1], 1)[0]
            hits += guess == t[i]
            total += 1
    return hits / total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_500_000, help="draft tokens to sample")
    ap.add_argument("--min-count", type=int, default=2, help="drop trigrams seen fewer times (size)")
    a = ap.parse_args()
    samples = sample_draft(a.tokens)
    corpus = np.load(WORK / "train.npy")
    n_vocab = 8193
    ctx, target = draft_argmax_on_heldout()
    report, best = {}, None
    for name, stream in (("draft_samples", samples), ("corpus", corpus),
                         ("both", np.concatenate([samples, corpus]))):
        t0 = time.time()
        model = ngram.fit(stream.astype(np.int64), n_vocab, min_count=a.min_count)
        path = WORK / f"trigram_{name}.npz"
        ngram.save(model, path)
        acc = agreement(model, ctx, target)
        report[name] = {"tokens": int(stream.size), "agreement_with_draft_argmax": round(acc, 4),
                        "bytes": path.stat().st_size, "fit_s": round(time.time() - t0, 1)}
        print(name, report[name], flush=True)
        if best is None or acc > report[best]["agreement_with_draft_argmax"]:
            best = name
    report["shipped"] = best
    (WORK / f"trigram_{best}.npz").replace(SHIPPED_DIR / "tiny-trigram.npz")
    (WORK / "ngram.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
