"""The shipped models load through the normal loader and tokenizer, and a real model catches a broken
forward pass: the target's recorded held-out loss is reproduced on a fixed slice of held-out code."""

import json
from pathlib import Path

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.gpt2 import forward, new_cache
from specdec_np.models import EMBEDDED_NGRAM, load_embedded
from specdec_np.tokenizer import decode, encode

ROOT = Path(__file__).resolve().parent.parent
EVAL = json.loads((ROOT / "weights" / "eval.json").read_text())
SLICE = (ROOT / "tests" / "fixtures" / "heldout_slice.txt").read_text(encoding="utf-8")
TARGET, DRAFT, TRIGRAM, ENC = load_embedded()


def slice_loss(model) -> float:
    toks = np.array(encode(ENC, SLICE)[:512])
    logits = forward(model, toks[:-1], new_cache(model)).astype(np.float64)  # [n, V]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(toks) - 1), toks[1:]].mean())


@pytest.mark.parametrize("name", ["target", "draft"])
def test_recorded_heldout_loss_is_reproduced(name):
    model = TARGET if name == "target" else DRAFT
    assert slice_loss(model) == pytest.approx(EVAL[name]["heldout_slice_nats"], rel=0.01)


def test_shipped_files_fit_together():
    assert TARGET.config.n_vocab == DRAFT.config.n_vocab == TRIGRAM.n_vocab == ENC.n_vocab == 8193
    assert decode(ENC, encode(ENC, SLICE)) == SLICE
    assert TARGET.n_params > 10 * DRAFT.n_params / 2  # a much smaller draft
    assert ngram.load(EMBEDDED_NGRAM).n_vocab == 8193


def test_target_is_better_than_draft_and_trigram_is_normalised():
    assert slice_loss(TARGET) < slice_loss(DRAFT)
    p = ngram.dist(TRIGRAM, encode(ENC, "    def __init__(self"))
    assert p.shape == (8193,) and abs(p.sum() - 1) < 1e-9


def test_weights_budget():
    """All binary files under weights/ together stay within the 32 MB budget."""
    files = [p for p in (ROOT / "weights").rglob("*") if p.is_file() and "work" not in p.parts
             and p.suffix in {".safetensors", ".npz", ".bpe", ".json"} and p.parent.name not in
             ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")]
    assert sum(p.stat().st_size for p in files) <= 32 * 2 ** 20
