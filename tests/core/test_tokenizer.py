"""The offline GPT-2 tokenizer: known ids, exact round trips, the restricted vocabulary, digest checks."""

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np.tokenizer import WEIGHTS_DIR, decode, encode, get_encoding


@pytest.fixture(scope="module")
def full_enc():
    return get_encoding()


@pytest.fixture(scope="module")
def small_enc():
    return get_encoding(8193)


def test_known_ids(full_enc):
    assert encode(full_enc, "Hello world") == [15496, 995]
    assert encode(full_enc, "<|endoftext|>") == [50256]
    assert encode(full_enc, "def f(x):\n    return x") == [4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124]
    assert full_enc.n_vocab == 50257


def test_restricted_vocabulary_uses_gpt2_ids_below_n(full_enc, small_enc):
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1)\n"
    small = encode(small_enc, text)
    assert max(small) < 8192 and small_enc.n_vocab == 8193
    assert encode(small_enc, "<|endoftext|>") == [8192]
    # Every restricted token is a GPT-2 token with the same id and the same bytes.
    assert all(full_enc.decode_single_token_bytes(t) == small_enc.decode_single_token_bytes(t) for t in small)
    assert len(small) >= len(encode(full_enc, text))


@given(st.text(max_size=200))
@settings(max_examples=50)
def test_round_trip_arbitrary_unicode(full_enc, small_enc, text):
    for enc in (full_enc, small_enc):
        assert decode(enc, enc.encode_ordinary(text)) == text


def test_unknown_token_id_raises(small_enc):
    with pytest.raises(ValueError, match="token id 9000 is outside"):
        decode(small_enc, [1, 9000])
    with pytest.raises(ValueError, match="no GPT-2 BPE"):
        get_encoding(100)


def test_digest_mismatch_raises(tmp_path):
    for name in ("vocab.bpe", "encoder.json"):
        shutil.copy(WEIGHTS_DIR / name, tmp_path / name)
    with open(tmp_path / "vocab.bpe", "a") as f:
        f.write("x y\n")
    with pytest.raises(ValueError, match="vocab.bpe has sha256"):
        get_encoding(1000, bpe_dir=tmp_path)
    shutil.copy(WEIGHTS_DIR / "vocab.bpe", tmp_path / "vocab.bpe")
    (tmp_path / "encoder.json").unlink()
    with pytest.raises(FileNotFoundError, match="encoder.json"):
        get_encoding(1001, bpe_dir=tmp_path)
