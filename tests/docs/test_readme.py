"""The README's Python blocks run as written, each on its own (a reader may copy any one of them), so that
the API they show cannot drift from the code.

Two things are made small, not skipped: every `generate` call decodes at most N_NEW tokens, and
the tools' plan choice finds the machine "too busy to measure" (its one-line fallback, the
constant plan), so that no block measures this machine inside the suite.
"""

import re
from pathlib import Path

import pytest

from specdec_np import decode

README = Path(__file__).resolve().parents[2] / "README.md"
N_NEW = 6


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2 and all("generate(" in b for b in blocks)


def test_the_readmes_python_blocks_run(monkeypatch, capsys):
    from specdec_np.tools import calibration

    real = decode.generate

    def few_tokens(target, prompt, max_new_tokens=64, *args, **kwargs):
        return real(target, prompt, min(max_new_tokens, N_NEW), *args, **kwargs)

    def busy(*args, **kwargs):
        raise calibration.Busy("the test suite does not measure this machine")

    monkeypatch.setattr(decode, "generate", few_tokens)
    monkeypatch.setattr(calibration, "measure_costs", busy)
    blocks = python_blocks(README.read_text())
    for block in blocks:
        namespace = {}  # its own: a block that needs an earlier one's names fails here (NameError)
        exec(compile(block, str(README), "exec"), namespace)
        assert len(namespace["res"].tokens) == N_NEW
    out = capsys.readouterr().out
    assert "True" in out  # the block comparing staged decoding's tokens with plain greedy's prints True
    # The control: a block that no longer matches the API fails here.
    with pytest.raises(TypeError, match="max_tokens"):
        exec(compile(blocks[0].replace("max_new_tokens=", "max_tokens="), str(README), "exec"), {})
