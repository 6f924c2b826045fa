"""The Python API as strict as the command line (issue 70): what the CLI refuses, `generate`, `plan.constant`,
`tokenizer.decode` and `ngram.load` refuse in one line naming the argument, in the same words as the CLI where it
has the option (one message, checks.py's, named by its option: options.as_option). Each with its valid neighbour
accepted (the control)."""

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.checks import check_cuts
from specdec_np.decode import generate
from specdec_np.methods import METHODS
from specdec_np.plan import Plan, constant
from specdec_np.tokenizer import decode, get_encoding
from specdec_np.tools.cli import main
from specdec_np.tools.options import as_option

DRAFTS = ", ".join(m for m, c in METHODS.items() if c.drafts_with)
NGRAMS = ", ".join(m for m, c in METHODS.items() if c.needs_ngram)


@pytest.mark.parametrize("method", [m for m, c in METHODS.items() if not c.drafts_with])
def test_a_draft_the_method_never_reads_is_refused(small, method):
    target, draft, trigram = small
    ngram_ = trigram if METHODS[method].needs_ngram else None
    with pytest.raises(ValueError, match=rf"^draft does nothing with method '{method}': it applies to method "
                                         rf"{DRAFTS} \(leave it None\)$"):
        generate(target, [1, 2], 3, method, draft, ngram_)
    assert len(generate(target, [1, 2], 3, method, None, ngram_).tokens) == 3  # the control: without it


@pytest.mark.parametrize("method", [m for m, c in METHODS.items() if not c.needs_ngram and m != "eagle"])
def test_an_ngram_the_method_never_reads_is_refused(small, method):
    target, draft, trigram = small
    draft_ = draft if METHODS[method].drafts_with else None
    with pytest.raises(ValueError, match=rf"^ngram does nothing with method '{method}': it applies to method "
                                         rf"{NGRAMS} \(leave it None\)$"):
        generate(target, [1, 2], 3, method, draft_, trigram)
    assert len(generate(target, [1, 2], 3, method, draft_).tokens) == 3


@pytest.mark.parametrize("top_k", [40, 41, 10 ** 12])
def test_a_top_k_that_keeps_every_token_is_refused(small, top_k):
    with pytest.raises(ValueError, match=rf"^top_k={top_k}: the target has 40 tokens, so it keeps them all and "
                                         r"changes nothing: give fewer than 40, or leave it off$"):
        generate(small.target, [1, 2], 3, temperature=1.0, top_k=top_k)
    assert len(generate(small.target, [1, 2], 3, temperature=1.0, top_k=39).tokens) == 3  # drops one: it cuts


@pytest.mark.parametrize("top_p", [1, 1.0])
def test_a_top_p_of_one_is_refused(small, top_p):
    with pytest.raises(ValueError, match=r"^top_p=1 keeps every token, so it changes nothing: leave it off$"):
        generate(small.target, [1, 2], 3, temperature=1.0, top_p=top_p)
    assert len(generate(small.target, [1, 2], 3, temperature=1.0, top_p=0.999).tokens) == 3


@pytest.mark.parametrize("args, api", [
    (["--top-p", "1"], dict(top_p=1)),
    (["--top-k", "8193"], dict(top_k=8193)),
    (["--top-k", str(10 ** 12)], dict(top_k=10 ** 12)),
])
def test_the_cli_and_the_api_say_the_same(capsys, args, api):
    """One message: the CLI's is the API's with the option's name for the argument's."""
    with pytest.raises(ValueError) as e:
        check_cuts(api.get("top_k"), api.get("top_p"), 8193)
    assert main(["generate", "x", "--plan", "default", "--temperature", "1", "--method", "ar",
                 "--max-new-tokens", "2", *args]) == 2
    assert capsys.readouterr().err.strip() == f"error: {as_option(e.value)}"


@pytest.mark.parametrize("temperature", [-1, -0.5, float("nan"), float("inf"), "1", None, True])
def test_the_constant_plan_of_a_bad_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match=rf"^temperature={temperature!r} must be a finite number >= 0 \(0 = greedy\)$"):
        constant(temperature)


def test_the_constant_plan_of_a_good_temperature():
    assert constant(0) == Plan() and constant(0.7) == constant(1) != Plan()


@pytest.mark.parametrize("tokens, message", [
    ([1.5], "tokens must be integer token ids: 1 of 1 are not, the first 1.5"),
    ([1, 2.0, "3"], "tokens must be integer token ids: 2 of 3 are not, the first 2.0"),
    ([True], "tokens must be integer token ids: 1 of 1 are not, the first True"),
    ("abc", "tokens must be token ids, not text: got str 'abc'"),
    (b"abc", "tokens must be token ids, not text: got bytes b'abc'"),
    (7, "tokens must be a list of token ids, got int 7"),
])
def test_decoding_what_is_not_token_ids_is_refused(tokens, message):
    enc = get_encoding(8193)
    with pytest.raises(TypeError) as e:
        decode(enc, tokens)
    assert str(e.value) == message
    assert decode(enc, [1, np.int64(2)]) == decode(enc, np.array([1, 2])) == enc.decode([1, 2])  # the control


def test_an_ngram_file_of_no_tokens_names_uni_count(tmp_path):
    """A model with more n-grams than the 64 a file of no tokens could hold: the message blames uni_count (all
    zeros), not the first longer array (bi_ctx)."""
    model = ngram.fit(np.random.default_rng(0).integers(0, 200, 2000), 200)
    path = tmp_path / "m.npz"
    ngram.save(model, path)
    with np.load(path) as z:
        arrays = dict(z)
    assert len(arrays["bi_ctx"]) > 64
    arrays["uni_count"] = np.zeros_like(arrays["uni_count"])
    np.savez(tmp_path / "zeros.npz", **arrays)
    with pytest.raises(ValueError, match="uni_count is all zeros: a model fitted on no tokens") as e:
        ngram.load(tmp_path / "zeros.npz")
    assert "bi_ctx" not in str(e.value)
    assert ngram.load(path).n_vocab == 200  # the control: as written, it loads
