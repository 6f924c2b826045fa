"""`python -m specdec_np ngram fit`: the trigram fitted from files."""

import pytest

from specdec_np.ngram import load, top_k
from specdec_np.tokenizer import encode, get_encoding
from specdec_np.tools.cli import cmd_ngram


def test_fit_command_joins_files_with_endoftext(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f(x):\n    return x\n")
    b.write_text("def g(y):\n    return y\n")
    out = tmp_path / "tri.npz"
    assert cmd_ngram(["fit", str(a), str(b), "--out", str(out), "--n-vocab", "8193"]) == 0
    m = load(out)
    assert m.n_vocab == 8193
    assert m.counts["uni_count"][8192] == 1                             # one <|endoftext|> between 2 files
    # The last token of a.py is followed by <|endoftext|>, which is followed by the first token of b.py.
    enc = get_encoding(8193)
    last_a, first_b = encode(enc, a.read_text())[-1], encode(enc, b.read_text())[0]
    assert top_k(m, [last_a, 8192], 1)[0][0] == first_b
    with pytest.raises(ValueError, match="nope.py: No such file or directory"):
        cmd_ngram(["fit", str(tmp_path / "nope.py"), "--out", str(out)])
