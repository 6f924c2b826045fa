"""specdec_np against an independent reference: a tiny random GPT-2 built, saved and run by HF transformers.

tests/fixtures/golden/ (made by weights/make_golden.py) holds the model as transformers'
save_pretrained wrote it (fp32, `transformer.` keys) and the logits PyTorch computed in float64
for a fixed sequence. Loading that file and running our forward pass must reproduce them.
"""

from pathlib import Path

import numpy as np
import pytest

from specdec_np import checkpoint
from specdec_np.gpt2 import GPT2Config, forward, new_cache

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"
TOKENS = np.load(GOLDEN / "tokens.npy")  # [20]
LOGITS = np.load(GOLDEN / "logits.npy")  # [20, n_vocab], float64, from transformers
TOL = {np.float32: 1e-5, np.float64: 1e-10}


@pytest.fixture(scope="module", params=[np.float32, np.float64], ids=["fp32", "fp64"])
def model(request):
    return checkpoint.load(GOLDEN, dtype=request.param)


def test_fixture_is_small_and_as_described():
    assert sum(f.stat().st_size for f in GOLDEN.iterdir()) < 200_000
    assert checkpoint.load(GOLDEN).config == GPT2Config(n_vocab=300, n_ctx=32, n_embd=32, n_layer=2, n_head=4,
                                                         layer_norm_epsilon=1e-4)
    assert TOKENS.shape == (20,) and LOGITS.shape == (20, 300) and LOGITS.dtype == np.float64
    assert LOGITS.std(axis=-1).min() > 0.1  # far from uniform: a wrong weight would show


def test_full_sequence_matches_transformers(model):
    logits = forward(model, TOKENS, new_cache(model))  # [20] -> [20, n_vocab]
    assert logits.dtype == model.dtype
    np.testing.assert_allclose(logits, LOGITS, rtol=TOL[model.dtype.type], atol=TOL[model.dtype.type])


@pytest.mark.parametrize("chunks", [[1] * 20, [7, 1, 1, 5, 6], [19, 1]])
def test_kv_cache_incremental_matches_transformers(model, chunks):
    """Feeding the sequence a block at a time through the KV cache gives the same logits, row by row."""
    cache, start = new_cache(model), 0
    for n in chunks:
        logits = forward(model, TOKENS[start:start + n], cache)  # [n] -> [n, n_vocab]
        np.testing.assert_allclose(logits, LOGITS[start:start + n],
                                   rtol=TOL[model.dtype.type], atol=TOL[model.dtype.type])
        start += n
    assert cache.length == start == TOKENS.size


def test_resaved_checkpoint_gives_the_same_logits(tmp_path):
    """Our writer's HF layout (fp32) loads back to a model with bit-identical logits."""
    ours = checkpoint.load(GOLDEN)
    checkpoint.save(ours, tmp_path, dtype=np.float32)
    again = checkpoint.load(tmp_path)
    np.testing.assert_array_equal(forward(again, TOKENS, new_cache(again)), forward(ours, TOKENS, new_cache(ours)))
