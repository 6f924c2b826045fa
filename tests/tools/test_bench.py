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
