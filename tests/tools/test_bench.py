"""bench: its rule comparisons and its reading of prompts."""

import json
from pathlib import Path

import pytest

from specdec_np.tools import bench

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_bench_rules_rows(tmp_path):
    """`bench --rows rules`: each comparison runs the token-level rule and the new one on the same shapes."""
    prompts = FIXTURES / "prompts.jsonl"
    with pytest.raises(ValueError, match="top-k"):
        bench.main(["--prompts", str(prompts), "--rows", "rules", "--settings", "greedy"])
    assert bench.main(["--prompts", str(prompts), "--limit", "1", "--max-new-tokens", "8", "--rows", "rules",
                       "--settings", "top-k", "--plan", "default", "--out", str(tmp_path)]) == 0
    rules = json.loads((tmp_path / "results.json").read_text())["rules"]
    assert {"chain of 3", "chain of 8"} <= set(rules) and len(rules) >= 4
    for name, r in rules.items():
        assert list(r["rules"]) == (["chain", "block"] if name.startswith("chain") else ["recursive_wor", "traversal"])
        for ratio, low, high in (r["gain_tokens_per_target_pass"], r["gain_tokens_per_s"]):
            assert low <= ratio <= high
    assert "verification rules side by side" in (tmp_path / "results.md").read_text()


def no_measuring(*args, **kwargs):
    raise AssertionError("measured before the check")


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


@pytest.mark.parametrize("out, needle", [
    ("/proc/x", "--out /proc/x: cannot write in /proc"),
    ("FILE/sub", "--out {tmp}/FILE/sub: {tmp}/FILE is a file"),
    ("FILE", "--out {tmp}/FILE: {tmp}/FILE is a file"),
])
def test_an_out_that_cannot_be_written_is_named_before_any_measuring(tmp_path, capsys, monkeypatch, out, needle):
    """Issue 45: `--out` under /proc or under a regular file is one line naming --out, not a bare errno."""
    from specdec_np.tools.cli import main

    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    monkeypatch.setattr(bench, "calibration", no_measuring)
    (tmp_path / "FILE").write_text("x")
    out = out if out.startswith("/") else str(tmp_path / out)
    assert main(["bench", "--prompts", str(FIXTURES / "prompts.jsonl"), "--out", out]) == 2
    assert needle.format(tmp=tmp_path) in one_error_line(capsys)


@pytest.mark.parametrize("args, needle", [(["--settings", "greedy,beam"], "--settings greedy,beam: choose from"),
                                          (["--rows", "all", "--settings", "greedy"], "--rows all compares"),
                                          (["--results", "/proc/results.md"], "--results /proc/results.md: cannot "
                                                                              "write in /proc")])
def test_bench_options_named_in_their_errors(capsys, monkeypatch, args, needle):
    from specdec_np.tools.cli import main

    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    assert main(["bench", *args]) == 2
    assert needle in one_error_line(capsys)


def test_profile_says_where_it_writes_and_writes_the_weights_directory(tmp_path, capsys, monkeypatch):
    """Issue 45: `bench --profile` (the maintainers' tool that regenerates profile.json) names its
    destination, the weights directory (SPECDEC_NP_WEIGHTS), in --help and before measuring; it never
    falls back to the shipped file, and a destination it cannot write fails before measuring."""
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "profile.json in the weights directory" in help_text and "$SPECDEC_NP_WEIGHTS" in help_text
    saved = []
    monkeypatch.setattr(bench, "load_embedded", lambda: ("target", "draft", "ngram", "enc"))
    monkeypatch.setattr(bench.acceptance, "calibration_prompts", lambda enc: [[1, 2]])
    monkeypatch.setattr(bench.acceptance, "measure", lambda *a, journal, **k: journal.write_text("") or {"n": 1})
    monkeypatch.setattr(bench.acceptance, "save", lambda profile, path: saved.append((profile, path)))
    weights = tmp_path / "weights"
    weights.mkdir()
    monkeypatch.setattr(bench, "WEIGHTS_DIR", weights)
    assert bench.main(["--profile", "--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert saved == [({"n": 1}, weights / "profile.json")]
    assert f"the profile goes to {weights / 'profile.json'}" in out.splitlines()[0]
    assert f"wrote {weights / 'profile.json'}" in out and not (tmp_path / "b" / "profile.journal.jsonl").exists()
    # A weights directory under a regular file: named, with the variable that moves it, before measuring.
    (tmp_path / "FILE").write_text("x")
    monkeypatch.setattr(bench, "WEIGHTS_DIR", tmp_path / "FILE" / "weights")
    monkeypatch.setattr(bench.acceptance, "measure", no_measuring)
    with pytest.raises(ValueError, match=r"--profile writes .*FILE/weights/profile\.json \(the weights directory, "
                                         r"\$SPECDEC_NP_WEIGHTS\): .*FILE is a file"):
        bench.main(["--profile", "--out", str(tmp_path / "b")])
