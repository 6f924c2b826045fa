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


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_is_short_and_its_details_are_found_where_it_says():
    """The README stays a front page (at most 15,000 bytes: the quick start, the demo, the results in brief,
    where to go next); what it moved to docs/ is found there: every docs/X.md#anchor it links is a heading of
    that file. Negative control: an anchor no heading has is told apart."""
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 15_000, f"README.md is {len(text.encode('utf-8'))} bytes"
    docs = README.parent / "docs"
    links = re.findall(r"\]\(docs/([\w.-]+\.md)#([\w-]+)\)", text)
    assert ("usage.md", "the-first-run-measures-this-machine") in links

    def anchors(name):
        return {slug(h) for h in re.findall(r"^#+ (.+)$", (docs / name).read_text(encoding="utf-8"), flags=re.M)}

    missing = [(name, anchor) for name, anchor in links if anchor not in anchors(name)]
    assert not missing, missing
    assert "no-such-heading" not in anchors("usage.md")
