"""The shipped models load through the normal loader and tokenizer, and a real model catches a broken
forward pass: the target's recorded held-out loss is reproduced on a fixed slice of held-out code.
The models come from conftest's session fixture `embedded` (target, draft, trigram, encoding)."""

import json
from pathlib import Path

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.files import SHIPPED_DIR
from specdec_np.gpt2 import forward, new_cache
from specdec_np.models import EMBEDDED_NGRAM
from specdec_np.tokenizer import decode, encode

ROOT = Path(__file__).resolve().parents[2]
EVAL = json.loads((ROOT / "weights" / "eval.json").read_text())
SLICE = (ROOT / "tests" / "fixtures" / "heldout_slice.txt").read_text(encoding="utf-8")


def slice_loss(model, enc) -> float:
    toks = np.array(encode(enc, SLICE)[:512])
    logits = forward(model, toks[:-1], new_cache(model)).astype(np.float64)  # [n, V]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(toks) - 1), toks[1:]].mean())


@pytest.mark.parametrize("name", ["target", "draft"])
def test_recorded_heldout_loss_is_reproduced(embedded, name):
    target, draft, _, enc = embedded
    model = target if name == "target" else draft
    assert slice_loss(model, enc) == pytest.approx(EVAL[name]["heldout_slice_nats"], rel=0.01)


def test_shipped_files_fit_together(embedded):
    target, draft, trigram, enc = embedded
    assert target.config.n_vocab == draft.config.n_vocab == trigram.n_vocab == enc.n_vocab == 8193
    assert decode(enc, encode(enc, SLICE)) == SLICE
    assert target.n_params > 10 * draft.n_params / 2  # a much smaller draft
    assert ngram.load(EMBEDDED_NGRAM).n_vocab == 8193


def test_target_is_better_than_draft_and_trigram_is_normalised(embedded):
    target, draft, trigram, enc = embedded
    assert slice_loss(target, enc) < slice_loss(draft, enc)
    p = ngram.dist(trigram, encode(enc, "    def __init__(self"))
    assert p.shape == (8193,) and abs(p.sum() - 1) < 1e-9


def test_weights_budget():
    """All binary files the package ships (specdec_np/weights/) together stay within the 64 MiB budget (the pair's
    fp16 files, trigram, EAGLE head, profile and BPE files; downloaded GPT-2 checkpoints are not shipped)."""
    files = [p for p in SHIPPED_DIR.rglob("*") if p.is_file() and "work" not in p.relative_to(SHIPPED_DIR).parts
             and p.suffix in {".safetensors", ".npz", ".bpe", ".json"} and p.parent.name not in
             ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "distilgpt2")]
    assert {"model.safetensors", "tiny-trigram.npz"} <= {p.name for p in files}  # the budget counts the models
    assert sum(p.stat().st_size for p in files) <= 64 * 2 ** 20
