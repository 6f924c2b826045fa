"""Does the EAGLE head guess better where decoding uses it when half of its batches are the target's own samples?
A CPU pilot for weights/recipe.py's head phase (which trains on corpus windows only), at a small scale.

    python weights/head_data_pilot.py [--steps 500] [--samples 256]      # the corpus: weights/build_corpus.py

Two heads of the shipped target (train_eagle.make_head, the same seed, the same steps and learning-rate schedule,
recipe.py's loss on the frozen target's features computed on the fly): one on corpus windows only (as the recipe
trains it), one with half of each batch the target's own top-k 50, T=1 continuations of training-corpus prefixes
(Medusa's self-distillation, Cai et al. 2024, arXiv 2401.10774 section 2.3.2; the draft model is distilled so
already). Each head's first guess (train_eagle.first_guess: one drafted token at top-k 50, and argmax agreement)
on two sets it never trained on: held-out corpus windows (what the model card reports), and the target's own
continuations of HumanEval prompts (what bench's decoding asks of it), beside the shipped draft model's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import train_eagle as E  # noqa: E402
import train_tiny as T  # noqa: E402

WINDOW, PREFIX = 256, 64  # the head's training windows (recipe.py: 256 + 1 tokens), the samples' prompt


def continuations(target, cfg, prompts: np.ndarray, seed: int, batch: int = 64) -> np.ndarray:
    """The target's top-k 50, T=1 continuations of prompts [n, PREFIX] to WINDOW + 1 tokens -> [n, WINDOW + 1]."""
    return np.concatenate([T.sample(target, cfg, prompts[i:i + batch], WINDOW + 1 - PREFIX, 50, seed=seed + i)
                           for i in range(0, len(prompts), batch)])


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--samples", type=int, default=256, help="the target's continuations to train on")
    ap.add_argument("--corpus", type=Path, default=T.WORK / "corpus")
    a = ap.parse_args()
    torch.set_num_threads(2)
    target, t_cfg = T.get_model("shipped:target")
    draft, _ = T.get_model("shipped:draft")
    data = T.read_corpus(a.corpus)
    prompts = json.loads((a.corpus / "prompts.json").read_text())["humaneval"]
    rng = np.random.default_rng(7)
    t0 = time.time()
    starts = rng.integers(0, data["train"].size - PREFIX, size=a.samples)
    samples = continuations(target, t_cfg, np.stack([data["train"][s:s + PREFIX] for s in starts]), seed=0)
    he = np.stack([np.asarray(p["prompt"][-PREFIX:], dtype=np.int64) for p in prompts if len(p["prompt"]) >= PREFIX][:64])
    he_windows = continuations(target, t_cfg, he, seed=10_000)
    held = data["heldout"]
    held_windows = np.stack([held[s:s + WINDOW + 1] for s in np.linspace(0, held.size - WINDOW - 2, 64).astype(int)])
    print(f"samples: {len(samples)} to train on, {len(he_windows)} after HumanEval prompts, in {time.time() - t0:.0f} s")
    vocab = E.draft_vocab(E.CFG["vocab"], data["train"])
    ids = torch.from_numpy(np.flatnonzero(vocab))
    E.CFG.update(steps=a.steps, minutes=1e9)  # the schedule follows the steps, the same for both heads
    for name, frac in (("corpus only", 0.0), ("half the target's samples", 0.5)):
        torch.manual_seed(E.CFG["seed"])
        cfg = dataclasses.replace(t_cfg, seq_len=WINDOW, batch=8, seed=E.CFG["seed"], sample_frac=frac)
        head = E.make_head(t_cfg)
        opt, t0 = E.optimizer(head), time.time()
        head.train()
        for step in range(a.steps):
            for g in opt.param_groups:
                g["lr"] = E.lr_at(step, 0.0)
            loss, _, _ = E.loss_of(head, target, torch.from_numpy(T.batch_at(data["train"], cfg, step, samples)), ids)
            E.train_step(head, opt, loss)
        head.eval()
        guesses = {where: E.first_guess(head, target, draft, w, vocab=vocab)
                   for where, w in (("held-out corpus", held_windows), ("target after HumanEval", he_windows))}
        print(f"{name}: {a.steps} steps x {cfg.batch} x {WINDOW} tokens in {time.time() - t0:.0f} s, last loss "
              f"{loss.item():.3f}; " + "; ".join(f"{where}: head {g['head']['accept_topk']:.4f} "
                                                   f"(argmax {g['head']['argmax_agree']:.4f}), draft "
                                                   f"{g['draft']['accept_topk']:.4f} (argmax {g['draft']['argmax_agree']:.4f})"
                                                   for where, g in guesses.items()), flush=True)


if __name__ == "__main__":
    main()
