"""weights/pair_figures.py (issue 60's quality and loop figures, on the CPU): its loss is exact on a model whose
every distribution is uniform, and a corpus it cannot use is refused in one line naming --corpus."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "weights"))

import pair_figures  # noqa: E402  (weights/pair_figures.py)
from specdec_np.gpt2 import GPT2Config, map_params, random_params  # noqa: E402

CFG = GPT2Config(n_vocab=50, n_ctx=64, n_embd=16, n_layer=1, n_head=2)


def test_the_loss_of_a_uniform_model_is_log_v_per_token():
    model = random_params(CFG, seed=0)
    uniform = type(model)(CFG, map_params(np.zeros_like, model.params))  # every logit 0: p = 1/50
    seq = np.random.default_rng(0).integers(0, 50, 30)
    total, n = pair_figures.nll(uniform, seq)
    assert n == 29 and total == pytest.approx(29 * math.log(50), rel=1e-12)
    other, _ = pair_figures.nll(model, seq)  # the control: a model with weights is not uniform
    assert other != pytest.approx(total, rel=1e-6)
    tokens = np.random.default_rng(1).integers(0, 50, 200)
    assert pair_figures.windows_nll(uniform, tokens, n_windows=3, seq_len=32) == pytest.approx(math.log(50), rel=1e-12)


def test_a_corpus_without_prompts_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        pair_figures.main(["--corpus", str(tmp_path)])
    assert f"--corpus {tmp_path}: no prompts.json there" in capsys.readouterr().err
