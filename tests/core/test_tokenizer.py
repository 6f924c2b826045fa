"""The offline GPT-2 tokenizer: known ids, exact round trips, the restricted vocabulary, digest checks."""

import hashlib
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import tokenizer
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


def test_the_ranks_are_tiktokens_own(tmp_path, monkeypatch):
    # `bpe_ranks` builds from the checked bytes what tiktoken's loader builds from the files (its cache off).
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    theirs = data_gym_to_mergeable_bpe_ranks(str(WEIGHTS_DIR / "vocab.bpe"), str(WEIGHTS_DIR / "encoder.json"))
    assert list(tokenizer.bpe_ranks((WEIGHTS_DIR / "vocab.bpe").read_bytes()).items()) == list(theirs.items())


def test_a_poisoned_tiktoken_cache_changes_no_token(tmp_path, monkeypatch):
    # tiktoken reads $TIKTOKEN_CACHE_DIR (else $DATA_GYM_CACHE_DIR, else $TMPDIR/data-gym-cache)/<sha1 of a path>
    # unchecked: plant there a vocab.bpe whose first two merges are swapped, under every name it could look for.
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    text = "Hello world, def f(x):\n    return x <|endoftext|> the end"
    expected = encode(get_encoding(), text), encode(get_encoding(8193), text)
    lines = (WEIGHTS_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    poisoned = "\n".join([lines[0], lines[2], lines[1], *lines[3:]]).encode()
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", "TMPDIR"):
        cache = tmp_path / var / ("data-gym-cache" if var == "TMPDIR" else "")
        cache.mkdir(parents=True)
        for d in {str(WEIGHTS_DIR), str(WEIGHTS_DIR.resolve())}:
            (cache / hashlib.sha1(f"{d}/vocab.bpe".encode()).hexdigest()).write_bytes(poisoned)
            shutil.copy(WEIGHTS_DIR / "encoder.json", cache / hashlib.sha1(f"{d}/encoder.json".encode()).hexdigest())
        monkeypatch.setenv(var, str(tmp_path / var))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    planted = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # The negative control: tiktoken's own loader reads the planted file (its check of encoder.json fails).
    with pytest.raises(AssertionError):
        data_gym_to_mergeable_bpe_ranks(str(WEIGHTS_DIR.resolve() / "vocab.bpe"),
                                        str(WEIGHTS_DIR.resolve() / "encoder.json"))
    tokenizer._gpt2_ranks.cache_clear()
    tokenizer._encoding.cache_clear()
    try:
        assert (encode(get_encoding(), text), encode(get_encoding(8193), text)) == expected
        assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == planted  # nothing written
    finally:
        tokenizer._gpt2_ranks.cache_clear()
        tokenizer._encoding.cache_clear()

