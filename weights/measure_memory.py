"""Peak resident memory of `generate` with a gpt2-large-shaped target and a gpt2-shaped draft, run as a user runs it.

    python weights/measure_memory.py                  # --plan default (make memory)
    python weights/measure_memory.py --plan machine   # this machine's plan: measures costs on first use
    python weights/measure_memory.py --dir /tmp/ck    # keep the checkpoints there (reused by the next run)

Writes checkpoints of the real shapes with random weights (`checkpoint.save`, fp16 files as the
hub ships them, about 1.8 GB; never committed) to a temporary directory, then runs

    python -m specdec_np generate 'def f(x):' --target DIR/gpt2-large --draft DIR/gpt2
        --method speculative --plan default --max-new-tokens 8

in a fresh process with an empty cache directory (a first run), and reports its peak resident set
size (`ru_maxrss` of that process, loading included) against the float32 bytes of the two models'
weights. The checkpoints are deleted afterwards unless --dir names where to keep them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# --help's line: a literal, not __doc__'s first line (python -OO drops docstrings)
DESCRIPTION = ("Peak resident memory of `generate` with a gpt2-large-shaped target and a gpt2-shaped draft, run as a "
               "user runs it.")

from specdec_np import checkpoint  # noqa: E402
from specdec_np.gpt2 import GPT2_SHAPES, random_params  # noqa: E402

PAIR = {"target": "gpt2-large", "draft": "gpt2"}


def write_checkpoints(root: Path) -> dict:
    """{role: directory} of random models of the pair's shapes, written once (kept if present)."""
    dirs = {}
    for role, name in PAIR.items():
        d = root / name
        if not (d / checkpoint.MODEL_FILE).is_file():
            print(f"writing {d} (random weights, fp16)", file=sys.stderr)
            checkpoint.save(random_params(GPT2_SHAPES[name], seed=0), d)
        dirs[role] = d
    return dirs


def fp32_bytes(directory: Path) -> int:
    """Bytes of a checkpoint's weights as float32, from its header (what `load` allocates)."""
    header, _ = checkpoint.read_header(directory / checkpoint.MODEL_FILE)
    return sum(4 * int(n) for entry in header.values() for n in [_numel(entry["shape"])])


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def peak_rss(argv: list[str], env: dict) -> tuple[int, float, int]:
    """(peak resident bytes, seconds, exit code) of one process running `argv`."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss * 1024, time.perf_counter() - t, proc.returncode  # ru_maxrss is in kB on Linux


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.add_argument("--plan", default="default", choices=("default", "machine"))
    ap.add_argument("--dir", default=None, help="where to write (and keep) the checkpoints (default: a temporary "
                    "directory, deleted afterwards)")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    a = ap.parse_args(argv)
    root = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="specdec_np-memory-"))
    try:
        dirs = write_checkpoints(root)
        weights = sum(fp32_bytes(d) for d in dirs.values())
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, XDG_CACHE_HOME=cache)
            cmd = [sys.executable, "-m", "specdec_np", "generate", "def f(x):", "--target", str(dirs["target"]),
                   "--draft", str(dirs["draft"]), "--method", "speculative", "--plan", a.plan,
                   "--max-new-tokens", str(a.max_new_tokens)]
            print("$ " + " ".join(cmd[1:]), file=sys.stderr)
            rss, seconds, rc = peak_rss(cmd, env)
    finally:
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"peak resident {rss / 1e9:.2f} GB, {rss / weights:.2f}x the {weights / 1e9:.2f} GB of float32 weights "
          f"({PAIR['target']} + {PAIR['draft']} shapes, --plan {a.plan}); {seconds:.1f} s, exit code {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
