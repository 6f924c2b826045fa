"""Every lesson run directly under `python -O` refuses in one line before it prints anything (its checks are
asserts and `lesson.check`s, and -O removes the asserts), and under `python -I` (which leaves tutorials/ off
sys.path, so tutorials/lesson.py cannot be imported) says in one line how to run it. Negative control: run as that
line says, under -I, the lesson starts (its first line printed)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.py"))


def python(*args, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONOPTIMIZE", "PYTHONPATH")}
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=clean | env)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_refuses_dash_o_in_one_line(path):
    for args, env in ((["-O"], {}), ([], {"PYTHONOPTIMIZE": "1"})):
        r = python(*args, f"tutorials/{path.name}", **env)
        assert r.returncode == 1 and r.stdout == "", (args, env, r.stdout[-500:], r.stderr[-1000:])
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "refused: python -O (or PYTHONOPTIMIZE) removes the asserts" in err[0], err


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_a_lesson_under_dash_i_says_how_to_run_it(path):
    r = python("-I", f"tutorials/{path.name}")
    assert r.returncode == 1 and r.stdout == "", r.stderr[-1000:]
    line = f"run python tutorials/lesson.py tutorials/{path.name}"
    assert r.stderr.strip().splitlines() == [f"tutorials/ is off sys.path (python -I): {line}"], r.stderr[-1000:]


def test_run_as_the_line_says_a_lesson_starts_under_dash_i():
    """The negative control of the one line: the command it gives runs the lesson under -I (stopped after its first
    printed line; lesson 9 is quick)."""
    proc = subprocess.Popen([sys.executable, "-I", "tutorials/lesson.py", "tutorials/09_optimal_verification.py"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first.startswith("16 ordered pairs of drafts"), first
