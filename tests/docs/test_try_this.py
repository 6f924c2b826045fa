"""Every "Try this" edit a lesson proposes, made as a learner makes it (the lesson's text changed in a copy of the
lesson), runs the lesson to its end and prints what the lesson predicts. The lesson notices the edit
(`lesson.try_this`), says so, and turns the checks the edit breaks into one line each (`lesson.check`) instead of
dying on them. Negative control: the unedited lesson (tests/docs/test_tutorials.py's run of it) prints none of the
predicted lines. The "Try this" checks' own wrong inputs are in test_tutorials.py (WRONG).
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    from test_tutorials import run_lesson
finally:
    sys.path.remove(str(Path(__file__).resolve().parent))

# lesson: [(the edit's name, [(text in the lesson, what replaces it)], [lines the edited lesson prints])]
EDITS = {
    "01_gpt2_numpy": [
        ("all tokens visible", [("causal = np.tril(np.ones((n, n), dtype=bool))", "causal = np.ones((n, n), dtype=bool)")],
         ["Try this: every token visible to every other",
          "check failed under your edit (every token visible to every other): inline attention != gpt2.attention",
          "check failed under your edit (every token visible to every other): the walk-through disagrees with forward()"]),
        ("no positions", [('x = params["wte"][tokens] + params["wpe"][np.arange(n)]  # [n]', 'x = params["wte"][tokens]  # [n]')],
         ["Try this: no position embeddings",
          "check failed under your edit (no position embeddings): the walk-through disagrees with forward()"]),
    ],
    "02_kv_cache": [
        ("a new cache each step", [("    return cache  # the cache of the steps before", "    return new_cache(model)")],
         ["Try this: a new cache each step",
          "check failed under your edit (a new cache each step): step 1: cached and recomputed logits differ",
          "check failed under your edit (a new cache each step): the cache holds"]),
        ("KS with 3, 5 and 16", [("KS = [1, 2, 4, 8]", "KS = [1, 2, 3, 4, 5, 8, 16]")],
         ["[timed]            3 ", "[timed]            5 ", "[timed]           16 "]),  # "look at": the rows are there
    ],
    "03_speculative_sampling": [
        ("draft is target", [("my_q = np.array([0.50, 0.10, 0.10, 0.30])", "my_q = my_p.copy()")],
         ["Try this: my_q = my_p: the draft is the target, so every guess is kept"]),
        ("residual wrong way round", [("    return rand.draw(np.maximum(p - q, 0))  # draw()",
                                       "    return rand.draw(np.maximum(q - p, 0))  # draw()")],
         ["Try this: speculative_step changed: it no longer reproduces p",
          "check failed under your edit (speculative_step changed: it no longer reproduces p): the rule must reproduce "
          "p exactly"]),
        ("one guess", [("K = 3  # guesses per step", "K = 1  # guesses per step")],
         ["Try this: 1 guess(es) per step", "tokens per target pass: 1: 0.350, 2: 0.650  (expected 1.65)"]),
    ],
    "05_token_trees": [
        ("widths 2, 3", [("widths = [2, 2, 1]", "widths = [2, 3]")],
         ["Try this: widths=[2, 3]", "9 nodes (1 + 2 + 6); a leaf's row of the mask shows 3 nodes"]),
        ("no mask", [("tree_mask = attention_mask(tree)", "tree_mask = None")],
         ["Try this: no tree mask", "check failed under your edit (no tree mask (plain causal attention over the "
          "nodes)): the paths to nodes"]),
        ("raise B", [("B = 8\n", "B = 12\n")], ["12 drafted nodes, first step only."]),
    ],
    "06_verifying_trees": [
        ("D first", [("tokens=[A, B, D], parents=[-1, 0, 0], q=[1.0, q[B], q1[D]]",
                      "tokens=[A, D, B], parents=[-1, 0, 0], q=[1.0, q[D], verify.without(q, D)[B]]")],
         ["Try this: D first, B second", "verify_recursive_wor, first token: A 0.4029, B 0.0000, C 0.1971, D 0.4000",
          "check failed under your edit (D first, B second): the library's first token is not the hand-worked"]),
        ("three siblings", [("WIDTHS = [2, 1]", "WIDTHS = [3]")],
         ["Try this: trees of widths [3]", "recursive_wor  on sampled without replacement  children [3]: TV from the "
          "target = "]),
        ("seed 1", [("top_k=50, seed=0,\n                 keep_trees=True)",
                     "top_k=50, seed=1,\n                 keep_trees=True)")],
         []),  # "look at": it runs to its end with the other seed
    ],
    "07_staged": [
        ("no copies", [("COPY_LEN = 8\n", "COPY_LEN = 0\n")],
         ["Try this: copy_len=0", "0 of 9 steps verified a copied chain"]),
    ],
    "08_roofline": [
        ("chain of B", [('plans[B] = ("tree", Plan(budget=B))', 'plans[B] = ("speculative", Plan(chain=B))')],
         ["Try this: a chain of B guesses instead of a tree of budget B"]),
    ],
    "09_optimal_verification": [
        ("q = p", [("q = np.array([0.20, 0.50, 0.05, 0.25])", "q = p.copy()")],
         ["Try this: q = p: the draft is the target", "alpha* = 1.0000, reached at H = {}",
          "check failed under your edit (q = p: the draft is the target): no gap between two sampled siblings' rule "
          "and the optimum"]),
        ("d2 = t2", [("t2, d2 = (lambda ctx: np.array([1 / 3, 2 / 3])), (lambda ctx: np.array([2 / 3, 1 / 3]))",
                      "t2 = d2 = (lambda ctx: np.array([1 / 3, 2 / 3]))")],
         ["Try this: d2 = t2: the draft is the target", "token-wise: 18.00/9  block: 18.00/9  bound: 18.00/9"]),
        ("three drafts", [("K = 2  # drafts", "K = 3  # drafts")],
         ["Try this: 3 drafts", "64 ordered 3-tuples of drafts, e.g. (B, B, B) with probability 0.1250",
          "alpha* = 0.9781, reached at H = {B,D}"]),
    ],
    "11_eagle": [
        ("min_q 0.6", [("MIN_Q = 0.3\n", "MIN_Q = 0.6\n")], ["Try this: min_q=0.6", "verdict: min_q 0.6 made"]),
    ],
    "11b_the_head_answer": [
        ("no positions", [("by_hand_head = head  #", "by_hand_head = dataclasses.replace(head, wpe=0 * head.wpe)  #")],
         ["Try this: the answer runs a head without position embeddings",
          "check failed under your edit (the answer runs a head without position embeddings): the answer's "
          "fused_pass != eagle.head_pass"]),
    ],
}
CASES = [(lesson, name, replace, expected) for lesson, edits in EDITS.items() for name, replace, expected in edits]


def edited_run(lesson: str, replace) -> subprocess.CompletedProcess:
    """The lesson with each (old, new) of `replace` made (each old text found exactly once), run in a temporary
    folder beside a copy of tutorials/lesson.py."""
    source = (ROOT / "tutorials" / f"{lesson}.py").read_text(encoding="utf-8")
    for old, new in replace:
        assert source.count(old) == 1, f"{lesson}.py holds {old!r} {source.count(old)} times"
        source = source.replace(old, new)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "tutorials"), env.get("PYTHONPATH")]))
    env.setdefault("NO_COLOR", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["LESSON_QUICK_TIMING"] = "1"  # each timed figure measured once, as in run_lesson: the same lines
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"{lesson}.py"
        path.write_text(source, encoding="utf-8")
        return subprocess.run([sys.executable, str(path)], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)


@pytest.mark.parametrize("lesson, name, replace, expected", CASES, ids=[f"{c[0][:2]}-{c[1]}" for c in CASES])
def test_try_this_edit_runs_to_its_prediction(lesson, name, replace, expected):
    proc = edited_run(lesson, replace)
    assert proc.returncode == 0, f"{lesson} with {name!r} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    missing = [line for line in expected if line not in proc.stdout]
    assert not missing, f"{lesson} with {name!r} did not print {missing}:\n{proc.stdout[-3000:]}"
    plain = run_lesson(ROOT / "tutorials" / f"{lesson}.py")  # the negative control: unedited, none of them
    assert plain.returncode == 0
    assert not [line for line in expected if line in plain.stdout], f"{lesson} prints the prediction unedited"


@pytest.mark.parametrize("lesson", sorted(EDITS))
def test_an_unedited_lesson_notices_no_edit_and_breaks_no_check(lesson):
    """The lesson as shipped notices no "Try this" edit, so every check it makes stops it when it fails (a rule the
    lesson lets you edit, such as lesson 3's `speculative_step`, counts as edited once its own check fails: this
    is what keeps the shipped one honest)."""
    plain = run_lesson(ROOT / "tutorials" / f"{lesson}.py")
    assert plain.returncode == 0
    noticed = [line for line in plain.stdout.splitlines() if line.startswith(("Try this: ", "check failed under"))]
    assert not noticed, noticed
