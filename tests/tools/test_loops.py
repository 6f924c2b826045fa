"""The loop measure (tools/loops.py) on hand-made outputs: which tokens count as repeats of a 4-gram."""

import pytest

from specdec_np.tools.loops import repeat_line, repeat_share


def test_no_repeat_scores_zero():
    assert repeat_share(range(20)) == 0.0
    assert repeat_share([]) == 0.0


def test_a_loop_counts_every_token_after_its_first_4_grams():
    # "a b c a b c a b c": 4-grams abca, bcab, cabc end at tokens 3-5, and again at tokens 6-8.
    assert repeat_share(list("abcabcabc")) == pytest.approx(3 / 9)
    # A period-1 loop: after "x x x x" every further x ends the 4-gram xxxx again.
    assert repeat_share([7] * 10) == pytest.approx(6 / 10)


def test_the_token_ending_the_repeat_counts_not_the_ones_before_it():
    tokens = [1, 2, 3, 4, 9, 1, 2, 3, 4]  # 1 2 3 4 occurs twice: only its second 4 counts
    assert repeat_share(tokens) == pytest.approx(1 / 9)
    assert repeat_share(tokens[:-1]) == 0.0  # 1 2 3 alone is no 4-gram


def test_shorter_grams_and_bad_n():
    assert repeat_share([1, 2, 1, 2], n=2) == pytest.approx(1 / 4)  # "1 2" again at the end
    assert repeat_share([5, 5], n=1) == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="n must be >= 1"):
        repeat_share([1], n=0)


def test_the_line_gives_average_and_range():
    assert repeat_line([0.25, 0.75]).endswith("0.50 on average (0.25-0.75)")
