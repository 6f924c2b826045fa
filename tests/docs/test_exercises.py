"""The exercise grader (tutorials/exercises/grade.py, `make exercises`) accepts the reference solutions,
rejects each named plausible mistake at its smallest case, and says "not yet written" for the
untouched stubs, in one line per exercise and without a traceback."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = ROOT / "tutorials" / "exercises"
SOLUTIONS = EXERCISES / "solutions"


@pytest.fixture(scope="module")
def grade():
    spec = importlib.util.spec_from_file_location("grade", EXERCISES / "grade.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_grader(folder=None):
    args = [sys.executable, str(EXERCISES / "grade.py")] + ([str(folder)] if folder else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_untouched_stubs_are_not_yet_written():
    proc = run_grader()
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1
    assert len(lines) == 3 and all(line.endswith(": not yet written") for line in lines), proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_reference_solutions_are_correct():
    proc = run_grader(SOLUTIONS)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == 3 and all(": correct (" in line for line in lines), proc.stdout


# (file, mistake, text in the solution, the mistake's text, the smallest case that can tell them apart)
MISTAKES = [
    ("chain_rule.py", "correction drawn from p, not the residual", "rand.draw(np.maximum(p[node] - q, 0))",
     "rand.draw(p[node])", "case 1 of 6"),
    ("chain_rule.py", "ratio q/p instead of p/q", "p[node][x] / q[x]", "q[x] / p[node][x] if p[node][x] > 0 else 1.0",
     "case 1 of 6"),
    # With 2 tokens, a rejected sibling leaves one token in both p_res and q_res, so these two
    # mistakes change nothing there: the first case with 3 tokens and 2 siblings is the smallest.
    ("recursive_rejection.py", "residual not renormalised", "p_res = r / r.sum() if r.sum() > 0 else p_res",
     "p_res = r if r.sum() > 0 else p_res", "case 2 of 7"),
    ("recursive_rejection.py", "q not renormalised after a rejected sibling is removed",
     "q_res = q_res / q_res.sum()  # ... renormalised", "pass", "case 2 of 7"),
    # Cases 1 and 2 are chains (checked below): the first tree with siblings is the smallest.
    ("tree_attention.py", "a sibling visible in the mask",
     "mask[i] = mask[tree.parents[i]]  # the parent's row: every ancestor", "mask[i, :i] = True",
     "case 3 of 14 (the tree with parents [-1, 0, 0])"),
    ("tree_attention.py", "position = node index instead of prefix + depth", "return prefix_len + depth",
     "return prefix_len + np.arange(len(depth))", "case 3 of 14 (the tree with parents [-1, 0, 0])"),
    ("tree_attention.py", "an exception in the learner's code", "return prefix_len + depth",
     "raise ValueError('oops')", "case 1 (the tree with parents [-1, 0]): ValueError: oops"),
]


@pytest.mark.parametrize("filename, mistake, right, wrong, first_case", MISTAKES, ids=[m[1] for m in MISTAKES])
def test_each_mistake_is_caught_at_its_smallest_case(grade, tmp_path, filename, mistake, right, wrong, first_case):
    source = (SOLUTIONS / filename).read_text()
    assert right in source
    (tmp_path / filename).write_text(source.replace(right, wrong))
    title, _, names, grader = next(e for e in grade.EXERCISES if e[1] == filename)
    status, line = grade.grade(title, grade.load(tmp_path / filename, names), grader)
    assert status == "wrong" and line.startswith(f"wrong: {first_case}"), line


def test_the_first_mask_cases_have_no_siblings(grade):
    trees = grade.random_trees()
    assert [t.parents.tolist() for t in trees[:2]] == [[-1, 0], [-1, 0]]
    assert trees[2].parents.tolist() == [-1, 0, 0]
    assert [len(t) for t in trees] == sorted(len(t) for t in trees)  # smallest first


def test_a_broken_file_is_wrong_in_one_line(tmp_path):
    for name in ("chain_rule.py", "tree_attention.py"):
        (tmp_path / name).write_text((SOLUTIONS / name).read_text())
    (tmp_path / "recursive_rejection.py").write_text("def verify_recursive_wor(tree, p, rand)\n")  # a syntax error
    proc = run_grader(tmp_path)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and len(lines) == 3
    assert lines[2].startswith("exercise 3")
    assert ": wrong: cannot import recursive_rejection.py: SyntaxError" in lines[2]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_tables_are_distributions(grade):
    for V, _, seed in grade.CHAIN_CASES + grade.TREE_CASES:
        for M in grade.tables(V, seed):
            assert np.allclose(M.sum(axis=1), 1) and (M >= 0).all()
