"""weights/time_gates.py's recorder: every process's passes of the target's shape, counted exactly (the replay's
timings are a measurement, never a test)."""

import collections
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "weights"))

import time_gates  # noqa: E402  (weights/time_gates.py)

# Three passes of a random 2-layer, 32-wide target (a prefill of 5, one token, a block of 3 whose last row alone
# gets logits), one of another shape (not counted), in a child process too.
RUN = """
import subprocess, sys
from specdec_np.gpt2 import GPT2Config, forward, new_cache, random_params
model = random_params(GPT2Config(n_vocab=50, n_ctx=64, n_embd=32, n_layer=2, n_head=2))
other = random_params(GPT2Config(n_vocab=50, n_ctx=64, n_embd=16, n_layer=2, n_head=2))
cache = new_cache(model)
forward(model, [1, 2, 3, 4, 5], cache)
forward(model, [6], cache)
forward(model, [7, 8, 9], cache, logits_from=2)
forward(other, [1, 2], new_cache(other))
if len(sys.argv) < 2:
    subprocess.run([sys.executable, sys.argv[0], "child"], check=True)
"""


def test_the_recorder_counts_the_targets_passes_in_every_process(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    wall, spent, calls = time_gates.record([sys.executable, str(script)], (2, 32))
    once = {(5, 0, False): 1, (1, 0, False): 1, (3, 0, True): 1}  # cache lengths 0, 5, 6: all below 32
    assert calls == collections.Counter({k: 2 * v for k, v in once.items()})  # the script and its child
    assert 0 < spent < wall


def test_a_failing_run_and_bad_options_say_so(capsys):
    with pytest.raises(SystemExit, match="failed"):
        time_gates.record([sys.executable, "-c", "raise SystemExit(3)"], (2, 32))
    for args, says in ((["--runs", "all"], "--runs: unknown all"), (["--shapes", "9L/1"], "--shapes: unknown 9L/1"),
                       (["--rounds", "0"], "--rounds must be at least 1")):
        with pytest.raises(SystemExit):
            time_gates.main(args)
        assert says in capsys.readouterr().err


def test_the_shapes_are_the_recipes_and_need_no_torch():
    """One table of shapes (weights/recipe.py's), read without PyTorch: time_gates runs where torch is absent."""
    import recipe  # noqa: E402  (weights/recipe.py)

    assert time_gates.SHAPES is recipe.SHAPES and recipe.SHAPES["8L/512"] == (8, 8, 512)
    blocked = "import sys; sys.modules['torch'] = None; import time_gates; print(sorted(time_gates.SHAPES))"
    out = subprocess.run([sys.executable, "-c", blocked], cwd=Path(time_gates.__file__).parent, capture_output=True,
                         text=True, check=True).stdout
    assert "8L/512" in out
