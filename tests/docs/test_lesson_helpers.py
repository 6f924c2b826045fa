"""tutorials/lesson.py's verdicts on timed figures and its "Try this" checks, on made-up numbers (no timing)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tutorials"))
try:
    import lesson
finally:
    sys.path.pop(0)


def test_a_verdict_is_within_noise_where_the_range_straddles_the_threshold():
    said = lesson.verdict([0.9, 1.3, 1.1], 1, "faster", "slower", "x")
    assert said == "1.10x (range 0.90 to 1.30 over 3 runs): within noise: the range straddles 1x"
    assert lesson.verdict([1.05, 1.3, 1.1], 1, "faster", "slower", "x").endswith(": faster")  # the controls
    assert lesson.verdict([0.5, 0.8, 0.95], 1, "faster", "slower", "x").endswith(": slower")
    assert "within noise" in lesson.verdict([-2.0, 3.0], 0, "saved", "lost")
    assert "within noise" in lesson.verdict([0.0, 3.0], 0, "saved", "lost")  # touching the line is no verdict


def test_a_cost_curve_that_falls_is_named_with_its_causes():
    bent = lesson.bends({1: 10.75, 2: 6.04, 4: 7.0, 8: 9.1})  # lesson 2 on a Zen 4: one token dearer than two
    assert bent.startswith("not monotone here: 2 rows 6.04 ms < 1 rows 10.75 ms.")
    assert "the BLAS's kernel for that row count (a 1-row product goes to a matrix-vector routine" in bent
    assert "threads" in bent and "busy machine" in bent
    later = lesson.bends({1: 5.0, 2: 6.0, 4: 5.5, 8: 9.0})
    assert "4 rows 5.50 ms < 2 rows 6.00 ms" in later and "matrix-vector" not in later
    assert lesson.bends({1: 5.0, 2: 5.0, 4: 6.0, 8: 9.0}) == ""  # flat or rising: nothing to name
    assert lesson.bends({1: 5.0, 2: 110.0, 4: 109.0}) == ""  # a dip under 3%: noise, not a bend


def test_a_check_stops_the_lesson_unless_a_try_this_edit_is_in_effect(capsys):
    assert lesson.check(True, "never said") is True
    with pytest.raises(AssertionError, match="the logits differ"):
        lesson.check(False, "the logits differ")
    try:
        assert lesson.try_this("no positions", True) is True
        assert lesson.check(False, "the logits differ") is False
        assert lesson.try_this("no positions", True)  # said once
        out = capsys.readouterr().out.splitlines()
        assert out == ["Try this: no positions", "check failed under your edit (no positions): the logits differ"]
    finally:
        lesson.try_this("no positions", False)  # undone (a notebook's cell run again without it)
    assert lesson.EDITS == []
    with pytest.raises(AssertionError):
        lesson.check(False, "stops again")


def test_the_tests_quick_runs_time_each_figure_once():
    """The tests run the lessons with LESSON_QUICK_TIMING=1: each timing loop of one round (`timing_rounds`);
    without it a lesson times as many rounds as it says."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "LESSON_QUICK_TIMING"}
    code = "import lesson; print(lesson.timing_rounds(9))"
    tutorials = str(Path(lesson.__file__).parent)
    runs = [subprocess.run([sys.executable, "-c", code], env=env | extra, cwd=tutorials, capture_output=True,
                           text=True, timeout=60).stdout for extra in ({}, {"LESSON_QUICK_TIMING": "1"})]
    assert runs == ["9\n", "1\n"], runs
