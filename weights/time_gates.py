"""What a larger embedded target would do to issue 60's time gates (`make test` within 1.25x, the demo within
1.5x), measured before any training: the embedded target's forward passes in a real run, replayed on target shapes
with random weights.

    python weights/time_gates.py                    # the test suite and the warm demo; about 6 minutes on 2 cores
    python weights/time_gates.py --runs demo        # the demo only (seconds)
    python weights/time_gates.py --shapes 8L/384,8L/448 --rounds 5

1. Record: the run (`python -m pytest -q -p no:randomly`, or `python -m specdec_np demo` after one run that fills
   the cost cache) with a sitecustomize.py on PYTHONPATH that, in every process, counts the embedded target's
   `gpt2.forward` calls by (block size, cache length rounded down to 32, logits of the last row only) and times them.
2. Replay: each distinct call once per round on each shape (random weights, the cache holding that many positions),
   the minimum over rounds, weighted by its count: the same work on a larger target.
3. Estimate: the run's wall time plus its time in the target's passes times (replayed ratio - 1).

What it leaves out: the new pair's own acceptance (more or fewer passes than today's pair makes), the EAGLE head
growing with the target's width, and loading larger files; so a figure near its gate is a guess, not a pass.
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec_np.checkpoint import load  # noqa: E402
from specdec_np.gpt2 import GPT2Config, forward, new_cache, random_params  # noqa: E402
from recipe import SHAPES  # noqa: E402  (weights/recipe.py's shapes, name: (n_layer, n_head, n_embd); no torch)

RUNS = {"suite": [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly"],
        "demo": [sys.executable, "-m", "specdec_np", "demo"]}
GATES = {"suite": 1.25, "demo": 1.5}

# Loaded by every Python process of the run: counts and times the target's passes, one line per process at exit.
RECORDER = '''
import atexit, os, time
try:
    import specdec_np.gpt2 as _g
except Exception:
    _g = None
if _g is not None:
    _shape, _calls, _spent, _forward = (N_LAYER, N_EMBD), {}, [0.0], _g.forward

    def forward(model, tokens, cache, *a, **k):
        t = time.perf_counter()
        try:
            return _forward(model, tokens, cache, *a, **k)
        finally:
            if (model.config.n_layer, model.config.n_embd) == _shape:
                _spent[0] += time.perf_counter() - t
                key = (len(tokens), cache.length // 32 * 32, bool(k.get("logits_from") or (a[2] if len(a) > 2 else 0)))
                _calls[key] = _calls.get(key, 0) + 1
    _g.forward = forward

    @atexit.register
    def _write():
        try:
            with open(os.environ["TIME_GATES_LOG"], "a") as f:
                f.write(repr({"spent": _spent[0], "calls": _calls}) + "\\n")
        except OSError:  # a test that limits file sizes or closes files: its process is not counted
            pass
'''


def record(cmd: list[str], target_shape: tuple[int, int]) -> tuple[float, float, collections.Counter]:
    """(wall s, s in the target's passes, Counter of calls) of `cmd` run from the repository root."""
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "sitecustomize.py"
        site.write_text(RECORDER.replace("N_LAYER", str(target_shape[0])).replace("N_EMBD", str(target_shape[1])))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(ROOT)]), TIME_GATES_LOG=str(Path(tmp) / "log"))
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[1:])} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
        spent, calls = 0.0, collections.Counter()
        log = Path(tmp) / "log"
        for line in log.read_text().splitlines() if log.exists() else []:
            d = ast.literal_eval(line)
            spent += d["spent"]
            calls.update(d["calls"])
    return wall, spent, calls


def replay(calls: collections.Counter, shapes: dict[str, tuple[int, int, int]], rounds: int,
           n_ctx: int) -> dict[str, float]:
    """{name: s} for the calls on random-weight targets of each shape ({name: (n_layer, n_head, n_embd)}; the
    minimum over `rounds` per distinct call)."""
    models = {s: random_params(GPT2Config(n_vocab=8193, n_ctx=n_ctx, n_layer=n_layer, n_head=n_head, n_embd=n_embd),
                               seed=0) for s, (n_layer, n_head, n_embd) in shapes.items()}
    rng, best = np.random.default_rng(0), {}
    for _ in range(rounds):  # the shapes interleaved, so that a busy moment touches all of them
        for (n, length, last_only) in calls:
            length = min(length, n_ctx - n)
            for s, model in models.items():
                cache = new_cache(model)
                cache.length = length  # the prefix's keys and values: zeros (the cost does not depend on them)
                tokens = rng.integers(0, 8192, n)
                t = time.perf_counter()
                forward(model, tokens, cache, logits_from=n - 1 if last_only else 0)
                best[s, n, length, last_only] = min(best.get((s, n, length, last_only), np.inf), time.perf_counter() - t)
    return {s: sum(c * best[s, n, min(length, n_ctx - n), last] for (n, length, last), c in calls.items())
            for s in shapes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", default="suite,demo", help="suite, demo or both (default: %(default)s)")
    ap.add_argument("--shapes", default="8L/384,8L/448", help=f"target shapes to price, of {', '.join(SHAPES)}")
    ap.add_argument("--rounds", type=int, default=5, help="replay rounds; the minimum is kept (default: %(default)s)")
    a = ap.parse_args(argv)
    runs, shapes = a.runs.split(","), a.shapes.split(",")
    if bad := [r for r in runs if r not in RUNS]:
        ap.error(f"--runs: unknown {', '.join(bad)} (suite, demo)")
    if bad := [s for s in shapes if s not in SHAPES]:
        ap.error(f"--shapes: unknown {', '.join(bad)} ({', '.join(SHAPES)})")
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, not {a.rounds}")
    today = load("tiny-target").config
    base = f"{today.n_layer}L/{today.n_embd}"
    targets = {base: (today.n_layer, today.n_head, today.n_embd)} | {s: SHAPES[s] for s in shapes if s != base}
    for run in runs:
        if run == "demo":  # the gate's demo is a warm one: its costs cached by a run before
            subprocess.run(RUNS[run], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall, spent, calls = record(RUNS[run], (today.n_layer, today.n_embd))
        priced = replay(calls, targets, a.rounds, today.n_ctx)
        print(f"{run}: {wall:.1f} s, of which {spent:.1f} s ({spent / wall:.0%}) in the {base} target's "
              f"{sum(calls.values())} passes ({len(calls)} distinct); gate {GATES[run]}x")
        for s in shapes:
            ratio = priced[s] / priced[base]
            est = (wall + spent * (ratio - 1)) / wall
            print(f"  {s}: its passes {ratio:.2f}x as long -> {run} about {est:.2f}x today's "
                  f"({'within' if est <= GATES[run] else 'over'} the gate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
