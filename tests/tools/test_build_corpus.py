"""weights/build_corpus.py's near-duplicate detection on synthetic files: a near copy (a licence header, other
spacing, a few lines edited) is found; a different file is not, nor one sharing 35 of its 60 lines (Jaccard 0.4), which
LSH does offer as a candidate: the threshold turns it away."""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "weights"))
import build_corpus  # noqa: E402

ORIGINAL = "\n".join(f"    total_{i} = combine(x[{i}], y, scale={i * 7})" for i in range(60)) + "\n"


def near_copy(text: str) -> str:
    """`text` with a licence header, blank lines, other indentation and 3 of its 60 lines edited."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    for i in (10, 30, 50):
        lines[i] += " + 1"
    return "# Copyright (c) someone else\n# Licensed under some licence\n\n" + "\n\n".join(lines) + "\n"


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    return len(np.intersect1d(a, b)) / len(np.union1d(a, b))


def test_a_near_copy_is_found_and_a_different_file_is_not():
    copy = near_copy(ORIGINAL)
    other = "\n".join(f"def f_{i}(a):\n    return a ** {i} - {i}" for i in range(30)) + "\n"
    shares_35 = "\n".join(ORIGINAL.splitlines()[:35] + other.splitlines()[:25]) + "\n"
    kept, any_candidate = build_corpus.NearDuplicates(), build_corpus.NearDuplicates(threshold=0.0)
    for index in (kept, any_candidate):
        index.add("original.py", build_corpus.minhash(build_corpus.shingles(ORIGINAL)))

    name, similarity = kept.find(build_corpus.minhash(build_corpus.shingles(copy)))
    exact = jaccard(build_corpus.shingles(ORIGINAL), build_corpus.shingles(copy))
    assert name == "original.py" and similarity >= build_corpus.NEAR_DUPLICATE
    assert 0.5 < exact < 1 and abs(similarity - exact) < 0.1  # MinHash estimates the shingles' Jaccard similarity
    assert kept.find(build_corpus.minhash(build_corpus.shingles(other))) is None
    assert kept.find(build_corpus.minhash(build_corpus.shingles(shares_35))) is None
    name, similarity = any_candidate.find(build_corpus.minhash(build_corpus.shingles(shares_35)))
    assert name == "original.py" and 0.3 < similarity < build_corpus.NEAR_DUPLICATE


def test_comments_blank_lines_and_spacing_do_not_count():
    assert build_corpus.code_lines("# header\n\nx  =  1   # note\n\n   y = 2\n") == ["x = 1 # note", "y = 2"]
    assert np.array_equal(build_corpus.shingles("# only a comment\n\n"), np.zeros(0, np.uint64))
