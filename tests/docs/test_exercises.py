"""The exercise grader (tutorials/exercises/grade.py, `make exercises`) accepts the reference solutions,
says "not yet written" for the untouched stubs, and rejects each named plausible mistake at an early
case with the lines that diagnose it (the first token's distribution beside the target's, the node or
token that differs, a command that reruns the case). Each exercise is graded in a process of its own:
an exit, a hang or an exception in a solution is that exercise's "wrong" line, never the grader's end."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import grader_with_its_worker_started

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = ROOT / "tutorials" / "exercises"
SOLUTIONS = EXERCISES / "solutions"
FILES = ["chain_rule.py", "tree_attention.py", "recursive_rejection.py", "write_the_loop.py", "eagle_head.py"]


@pytest.fixture(scope="module")
def grade():
    import importlib.util

    spec = importlib.util.spec_from_file_location("grade", EXERCISES / "grade.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_grader(*args, timeout=120, **kwargs):
    return subprocess.run([sys.executable, str(EXERCISES / "grade.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, **kwargs)


def test_untouched_stubs_are_not_yet_written():
    proc = run_grader()
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1
    assert [line.split(" (")[0] for line in lines] == [f"exercise {n}, {t}" for n, t in enumerate(
        ["block verification of a chain", "the accepted path kept in the cache",
         "recursive rejection without replacement", "the speculative decoding loop", "the EAGLE head's step"],
        1)], proc.stdout
    assert all(line.endswith(": not yet written") for line in lines), proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_reference_solutions_are_correct():
    proc = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(EXERCISES / "grade.py"), str(SOLUTIONS)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(lines) == 5 and all(": correct (" in line for line in lines), proc.stdout
    assert proc.stderr == ""  # under -X dev -W error: no warning (the worker's pipe is closed)


HEAD_CASE = "case 1 of 2 ('def add(a, b):\\n    return', chains of 2, 3 steps):"
# (file, mistake, text in the solution, the mistake's text, how the wrong line starts, diagnosis fragments)
MISTAKES = [
    ("chain_rule.py", "the stopping weight left out (h_i = a_i)", "        if rand.coin(h):",
     "        if rand.coin(a[i]):", "case 2 of 7 (V=3, a chain of 2): TV 0.0172",
     ["with node 2 rejected: the library's verify_block tests node 1 (token 2) with a coin of probability 0; you "
      "toss a coin of probability 0.0176"]),
    ("chain_rule.py", "what is owed without the weight (p - q, not a p - q)", "np.maximum(a[i] * p[i] - q[i], 0)",
     "np.maximum(p[i] - q[i], 0)", "case 2 of 7 (V=3, a chain of 2): TV 0.137", ["(they differ)"]),
    ("chain_rule.py", "the correction drawn from p, not the residual",
     "rand.draw(np.maximum(p[0] - q[0], 0) if k else p[0])", "rand.draw(p[0])", "case 1 of 7 (V=2, a chain of 1)",
     ["with node 1 rejected: the library's verify_block draws from {0: 1}; you draw from {0: 0.773, 1: 0.227}"]),
    ("chain_rule.py", "the q row off by one", "a[-1] * p[i - 1][x[i]] / q[i - 1][x[i]]",
     "a[-1] * p[i - 1][x[i]] / q[i][x[i]]", "case 1 of 7 (V=2, a chain of 1): TV 0.0504",
     ["at the first test: the library's verify_block tests node 1 (token 1) with a coin of probability 0.818; you "
      "toss a coin of probability 1"]),
    ("chain_rule.py", "a kept prefix's token drawn from p, not from what is owed",
     "return list(range(i + 1)), rand.draw(owed)", "return list(range(i + 1)), rand.draw(p[i])",
     "case 2 of 7 (V=3, a chain of 2): TV 4.49e-05", ["the library's verify_block draws from {0: 0.223, 1: 0.777}"]),
    ("recursive_rejection.py", "the root's q at every level", "tree.draft_dists[node]", "tree.draft_dists[0]",
     "case 2 of 7 (V=3, widths 2,1)",
     ["(the same)", "with node 1 accepted: the library's verify_recursive_wor tests node 3 (token 2) with a "
                    "coin of probability 0.622; you toss a coin of probability 0.262"]),
    ("recursive_rejection.py", "the residual not renormalised", "p_res = r / r.sum() if r.sum() > 0 else p_res",
     "p_res = r if r.sum() > 0 else p_res", "case 2 of 7",
     ["with node 1 rejected: the library's verify_recursive_wor tests node 2 (token 0) with a coin of probability "
      "0.223; you toss a coin of probability 0.218"]),
    ("recursive_rejection.py", "q not renormalised after a rejected sibling is removed",
     "q_res = q_res / q_res.sum()  # ... renormalised", "pass", "case 2 of 7", ["you toss a coin of probability 1"]),
    ("recursive_rejection.py", "the residual the wrong way round", "np.maximum(p_res - q_res, 0)",
     "np.maximum(q_res - p_res, 0)", "case 1 of 7",
     ["with node 1 rejected: the library's verify_recursive_wor draws from {1: 1}; you draw from {0: 1}"]),
    ("recursive_rejection.py", "the rejected node left in the path", "return path, rand.draw(p_res)",
     "return path + [int(c)] * bool(len(children(tree, node))), rand.draw(p_res)", "case 1 of 7",
     ["your path is [0, 1], the library's verify_recursive_wor's [0]"]),
    # Cases 1 and 2 are chains (checked below): the first tree with siblings is the smallest.
    ("tree_attention.py", "the rows not moved (right for a chain only)", "rows = start + np.asarray(path)",
     "rows = start + np.arange(len(path))",
     "case 3 of 14 (the path to node 2 of the tree with parents [-1, 0, 0]): after keep_path slot 4 (the path's "
     "node 2, position 4) holds node 1's keys",
     ["the path [0, 2] of the tree with parents [-1, 0, 0]: its rows belong at slots 3 to 4, in path order"]),
    ("tree_attention.py", "the keys moved, not the values", "    cache.v[:, :, start:start + n] = cache.v[:, :, rows]",
     "    pass", "case 3 of 14 (the path to node 2 of the tree with parents [-1, 0, 0]): after keep_path slot 4 (the "
     "path's node 2, position 4) holds node 1's values", []),
    ("tree_attention.py", "the path's node ids as slots (start forgotten)", "rows = start + np.asarray(path)",
     "rows = np.asarray(path)", "case 1 of 14 (the path to node 1 of the tree with parents [-1, 0]): after keep_path "
     "slot 3 (the path's node 0, position 3) holds no node's keys", []),
    ("tree_attention.py", "the cache's length left at the block's end", "    cache.length = start + n", "    pass",
     "case 2 of 14 (the path to node 0 of the tree with parents [-1, 0]): after keep_path the cache's length is 5, "
     "expected 4: the prefix (3) and the path's 1 node", []),
    ("tree_attention.py", "an exception in the learner's code", "    cache.length = start + n",
     "    raise ValueError('oops')", "case 1 of 14 (the path to node 1 of the tree with parents [-1, 0]): ValueError: "
     "oops", []),
    ("write_the_loop.py", "the correction drawn from p, not the residual", "return np.maximum(p - q, 0)",
     "return p", "case 3 of 8 (exact, temperature 1 top-k 2, k=1, 3 tokens): TV 0.165",
     ["first token: yours {10: 0.93, 12: 0.0704}, the target's {10: 0.767, 12: 0.233} (they differ)"]),
    # Cache mistakes are named as such, with the first step and cache that differ, before any draw is compared.
    ("write_the_loop.py", "the target's cache cut one token short", "t_cache.truncate(start + 1 + len(accepted))",
     "t_cache.truncate(start + len(accepted))", "case 1 of 8 (temperature 0, k=2, the draft = the target, 8 tokens): "
     "after step 1 your target's cache holds 4 tokens, lesson 4's loop's 5: every committed token but the last "
     "(the step committed 3): it lost committed tokens", []),
    ("write_the_loop.py", "the target's cache not cut", "t_cache.truncate(start + 1 + len(accepted))",
     "t_cache.truncate(t_cache.length)", "case 2 of 8 (temperature 0, k=3, 12 tokens): after step 2 your target's "
     "cache holds 10 tokens, lesson 4's loop's 8: every committed token but the last (the step committed 2): cut it "
     "back to the accepted guesses", []),
    ("write_the_loop.py", "the draft's cache not cut",
     "d_cache.truncate(min(d_cache.length, start + 1 + len(accepted)))", "pass",
     "case 2 of 8 (temperature 0, k=3, 12 tokens): after step 2 your draft's cache holds 9 tokens, more than "
     "the 8 committed tokens but the last (lesson 4's loop keeps 8): cut it back to the accepted guesses", []),
    ("write_the_loop.py", "keep = n - 1 + accepted for both caches", "start + 1 + len(accepted)",
     "start + len(accepted)", "case 1 of 8 (temperature 0, k=2, the draft = the target, 8 tokens): after step 1 "
     "your target's cache holds 4 tokens, lesson 4's loop's 5", []),
    ("write_the_loop.py", "the bonus token from the last guess's row", "token = rand.draw(p[k])",
     "token = rand.draw(p[k - 1])", "case 1 of 8", ["the tokens are plain greedy decoding's"]),
    ("write_the_loop.py", "the residual the wrong way round", "np.maximum(p - q, 0)",
     "np.maximum(q - p, 0)", "case 2 of 8 (temperature 0, k=3, 12 tokens): token 6 of 12 differs", []),
    # Lossless (a guess is kept with the same probability), but a seed gives other tokens than generate's.
    ("write_the_loop.py", "the coin asked the other way round", "if rand.coin(acceptance(p, q, x)):",
     "if not rand.coin(1 - acceptance(p, q, x)):", "case 6 of 8 (seed 0",
     ["your tokens passed the exact checks"]),
    # Exercise 4 pinpoints the first coin or draw that differs from lesson 4's loop, with its step.
    ("write_the_loop.py", "the bonus token from p[k - 1], named", "token = rand.draw(p[k])",
     "token = rand.draw(p[k - 1])", "case 1 of 8 (temperature 0, k=2, the draft = the target, 8 tokens): token 3 of 8",
     ["step 1, every guess kept: the bonus token is drawn from p[k] = p[2], the target's distribution after the "
      "last guess, {12: 1}; you draw from {10: 1}, which is p[k - 1] = p[1]"]),
    ("write_the_loop.py", "the correction drawn from p, pinpointed", "return np.maximum(p - q, 0)",
     "return p", "case 3 of 8",
     ["step 1, guess 1 rejected: the correction is drawn from the residual max(p[0] - q[0], 0) = {10: 0.229, "
      "12: 0.771}; you draw from {10: 0.767, 12: 0.233}, which is p[0]"]),
    ("write_the_loop.py", "the residual the wrong way round, pinpointed", "np.maximum(p - q, 0)",
     "np.maximum(q - p, 0)", "case 2 of 8",
     ["step 2, guess 2 rejected: the correction is drawn from the residual max(p[1] - q[1], 0) = {12: 1}; you draw "
      "from {7: 1}, which is q[1]"]),
    # A cache cut past what it holds: one line naming the invariant, not truncate's own error.
    ("write_the_loop.py", "the target's cache cut one token long", "t_cache.truncate(start + 1 + len(accepted))",
     "t_cache.truncate(start + 2 + len(accepted))", "case 1 of 8 (temperature 0, k=2, the draft = the target, "
     "8 tokens): your loop cuts a cache to 6 tokens when it holds 5: after a step the target's cache holds every "
     "committed token but the last", []),
    # The residual must use the q the rejected child was drawn from, before its token is removed.
    # Exercise 5 names the mistake: the q it matches (replayed by the library's head with that mistake), or the cache
    # after head_keep (its length against the library's).
    # ("<...>": what the shipped head's weights decide, its chains, differences, acceptances; any text there.)
    ("eagle_head.py", "each token fed with its own feature", "np.asarray(seq)[js], js, cache",
     "np.asarray(seq)[js - 1], js, cache", f"{HEAD_CASE} step 1 (the root at position 11, the chain <...>): your "
     "q after the root differs from the library's head's by <...>",
     ["the feature one position off: your q is the head's when the pair at position j holds t_(j-1)'s embedding"]),
    ("eagle_head.py", "the feature two positions back", "feats[js - 1]", "feats[js - 2]", f"{HEAD_CASE} step 1",
     ["the feature one position off: your q is the head's when token t_j is fed with f_(j-2)"]),
    ("eagle_head.py", "the feature before ln_f", 'layer_norm(top, **target.params["ln_f"], eps=target.config.'
     'layer_norm_epsilon)', "top", f"{HEAD_CASE} step 1 (the root at position 11, the chain <...>): your q after "
     "the root differs", ["the unnormed feature: your q is the head's fed the target's top-layer states before its "
                          "final layer norm (ln_f)"]),
    ("eagle_head.py", "the head's cache not cut", "    cache.truncate(root)  #", "    pass  #",
     f"{HEAD_CASE} after step 1 your head's cache holds 13 pairs, the library's 11: the cache not cut after "
     "verification", []),
    ("eagle_head.py", "the accepted nodes' pairs kept", "    cache.truncate(root)  #",
     # Named "you kept the k accepted node(s)" where the target accepted part of the chain, "the cache not cut" where
     # it accepted all of it (the same cache then): which comes first depends on the shipped head.
     "    cache.truncate(root + accepted)  #", "case <...>: after step <...> your head's cache holds <...> pairs, the "
     "library's <...>: ", []),
    ("eagle_head.py", "every node fed the root's guess", "fused_pass(head, guess[None]",
     "fused_pass(head, guesses[0][None]", f"{HEAD_CASE} step 1 (the root at position 11, the chain <...>): your q "
     "after node 2 differs", ["every node read the root's guessed feature: node i reads its parent's guess"]),
    ("eagle_head.py", "q over every token", "    if head.vocab is not None:", "    if False:", f"{HEAD_CASE} step 1",
     ["your q gives up to <...> of its mass to tokens outside head.vocab"]),
    ("recursive_rejection.py", "the residual computed with q after the rejected token is removed",
     "            r = np.maximum(p_res - q_res, 0)", "            q_res = q_res.copy()\n            q_res[x] = 0\n"
     "            r = np.maximum(p_res - q_res, 0)", "case 1 of 7 (V=2, widths 1): TV 0.129",
     ["with node 1 rejected: the library's verify_recursive_wor draws from {1: 1}; you draw from {0: 0.848, "
      "1: 0.152}"]),
]


def pattern(text: str) -> str:
    """`text` as a regular expression, each "<...>" in it standing for any text."""
    return ".*?".join(re.escape(piece) for piece in text.split("<...>"))


def write_mistake(folder: Path, filename: str, right: str, wrong: str) -> None:
    source = (SOLUTIONS / filename).read_text()
    assert right in source
    (folder / filename).write_text(source.replace(right, wrong))  # every occurrence


@pytest.mark.parametrize("filename, mistake, right, wrong, first, diagnosis", MISTAKES, ids=[m[1] for m in MISTAKES])
def test_each_mistake_is_caught_early_and_diagnosed(grade, tmp_path, filename, mistake, right, wrong, first, diagnosis):
    write_mistake(tmp_path, filename, right, wrong)
    n = FILES.index(filename) + 1
    status, line, lines = grade.grade(n, tmp_path)
    assert status == "wrong" and re.match(pattern(f"wrong: {first}"), line), line
    for fragment in diagnosis:
        assert any(re.search(pattern(fragment), d) for d in lines), (fragment, lines)
    case = line.split("case ")[1].split(" of")[0]
    assert lines[-1].startswith("rerun: ") and lines[-1].endswith(f"grade.py {tmp_path} --case {n}:{case}"), lines


def test_a_cache_cut_too_far_is_one_line(grade, tmp_path):
    write_mistake(tmp_path, "write_the_loop.py", "t_cache.truncate(start + 1 + len(accepted))",
                  "t_cache.truncate(start + 2 + len(accepted))")
    status, line, lines = grade.grade(4, tmp_path)
    assert status == "wrong" and "truncate" not in line and len(lines) == 1 and lines[0].startswith("rerun: "), line


def test_a_missing_guard_for_q_running_out_is_harmless(grade, tmp_path):
    """No sibling follows once q' has no mass left (every token q could draw is a child): the guard only
    avoids 0/0, so exercise 3's instructions ask for none and the grader cannot fail its absence."""
    write_mistake(tmp_path, "recursive_rejection.py", "            if q_res.sum() > 0:  # (no mass left: every token q "
                  "could draw was a child, there is no next one)\n                q_res = q_res / q_res.sum()",
                  "            q_res = q_res / q_res.sum()")
    assert grade.grade(3, tmp_path)[0] == "correct"
    assert "runs out" not in (EXERCISES / "recursive_rejection.py").read_text()


Q_OFF_BY_ONE = ("a[-1] * p[i - 1][x[i]] / q[i - 1][x[i]]", "a[-1] * p[i - 1][x[i]] / q[i][x[i]]")


def test_lesson_3s_token_wise_rule_is_not_block_verification(grade, tmp_path):
    """Lesson 3's rule is lossless too: exercise 1 asks for the step after it, and says so when given it."""
    (tmp_path / "chain_rule.py").write_text(
        "import numpy as np\n\n\ndef verify_block(tree, p, rand):\n    path = [0]\n"
        "    for node in range(len(tree) - 1):\n        x, q = tree.tokens[node + 1], tree.draft_dists[node]\n"
        "        if not rand.coin(min(1.0, p[node][x] / q[x])):\n"
        "            return path, rand.draw(np.maximum(p[node] - q, 0))\n        path.append(node + 1)\n"
        "    return path, rand.draw(p[path[-1]])\n")
    status, line, lines = grade.grade(1, tmp_path)
    assert status == "wrong" and line == ("wrong: case 2 of 7 (V=3, a chain of 2): lossless, but not verify_block: "
                                          "your rule keeps 0.03492 guesses a step on average, verify_block 0.03771")
    assert "at the first test: the library's verify_block tests node 2 (token 0) with a coin of probability " \
           "0.0196; you toss a coin of probability 0.0176" in lines[0]


def test_the_exercises_say_what_the_lessons_before_them_do_not_print():
    """Exercise 1 is block verification (lesson 3 prints the token-wise rule), exercise 2 the cache after a tree
    pass (lesson 5 prints the mask and positions); exercise 1 says a certain coin draws no random number."""
    one, two = ((EXERCISES / name).read_text() for name in ("chain_rule.py", "tree_attention.py"))
    assert "def verify_block(" in one and "A certain coin (prob >= 1) is True and draws no random number" in one
    assert "def keep_path(" in two and "def attention_mask(" not in two
    three, five = ((ROOT / "tutorials" / name).read_text() for name in ("03_speculative_sampling.py",
                                                                       "05_token_trees.py"))
    assert "verify.verify_block" not in three and "def verify_block" not in three
    assert ".keep(" not in five and "keep_path" not in five


def test_the_rerun_command_reruns_that_case_in_full(tmp_path):
    write_mistake(tmp_path, "chain_rule.py", *Q_OFF_BY_ONE)
    with open(tmp_path / "chain_rule.py", "a") as f:
        f.write("print('hello from the solution')\n")
    graded = run_grader(tmp_path)
    assert "hello from the solution" not in graded.stdout + graded.stderr  # grading hides the solution's output
    command = next(line for line in graded.stdout.splitlines() if "rerun: " in line).split("rerun: ")[1]
    proc = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "hello from the solution" in out
    assert "exercise 1, block verification of a chain (chain_rule.py), case 1 of 7 (V=2, a chain of 1)" in out
    assert "wrong: TV 0.0504 from the target's distribution\nfirst token: yours" in out
    assert "target P (row t: after token t)" in out and "node 1: token 1, parent 0" in out


def test_a_solution_that_exits_or_raises_is_wrong_with_its_reason(tmp_path):
    (tmp_path / "chain_rule.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "tree_attention.py").write_text(
        "import os\n\ndef keep_path(cache, start, path):\n    print('bye', flush=True)\n    os._exit(0)\n")
    (tmp_path / "recursive_rejection.py").write_text("def verify_recursive_wor(tree, p, rand):\n"
                                                     "    raise SystemExit(1)\n")
    (tmp_path / "write_the_loop.py").write_text("def speculative_decode(*args):\n    raise KeyboardInterrupt\n")
    proc = run_grader(tmp_path)
    lines = [line for line in proc.stdout.splitlines() if not line.startswith("    ")]
    assert proc.returncode == 1 and len(lines) == 5, proc.stdout + proc.stderr
    assert lines[0].endswith("(chain_rule.py): wrong: importing chain_rule.py raised SystemExit: 0")
    assert lines[1].endswith("(tree_attention.py): wrong: the grading process ended (exit status 0) before a verdict: "
                             "does your code end the process (os._exit, a crash)?; its last output: bye")
    assert lines[2].endswith("(recursive_rejection.py): wrong: case 1 of 7 (V=2, widths 1): SystemExit: 1")
    assert lines[3].endswith("(write_the_loop.py): wrong: case 1 of 8 (temperature 0, k=2, the draft = the target, "
                             "8 tokens): KeyboardInterrupt")
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_hang_is_wrong_after_the_time_limit(tmp_path):
    (tmp_path / "chain_rule.py").write_text("def verify_block(tree, p, rand):\n    while True:\n        pass\n")
    start = time.monotonic()
    proc = run_grader(tmp_path, "--time-limit", "1", timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 1 and len(lines) == 5, proc.stdout + proc.stderr
    assert lines[0].endswith("(chain_rule.py): wrong: no verdict within 1 s: an endless loop? (--time-limit SECONDS "
                             "allows more)")
    assert all(line.endswith(f"{name} is missing") for line, name in zip(lines[1:], FILES[1:]))
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "grade.py: interrupted\n"),
                                             (signal.SIGTERM, 143, "")], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_stops_the_grader_and_its_worker(tmp_path, sig, code, said):
    pid_file = tmp_path / "worker.pid"
    (tmp_path / "chain_rule.py").write_text(
        f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n\n"
        "def verify_block(tree, p, rand):\n    while True:\n        pass\n")
    proc = grader_with_its_worker_started(tmp_path, pid_file, timeout=30)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code and err == said and out == "", (out, err)
    with pytest.raises(ProcessLookupError):  # the worker was stopped and reaped
        os.kill(int(pid_file.read_text()), 0)


LIMIT = "--time-limit wants a number of seconds above 0 (at most 86400)"


@pytest.mark.parametrize("args, code, message", [
    (["--help"], 0, "usage: grade.py [DIR] [--case E:N] [--time-limit SECONDS]"),
    (["a", "b"], 2, "grade.py: give one folder of exercises, got two: a and b"),
    (["no-such-folder"], 2, "grade.py: no-such-folder is not a folder (give the folder that holds the exercise files)"),
    (["--case", "6:1"], 2, "grade.py: --case wants EXERCISE:CASE with EXERCISE 1 to 5, e.g. --case 1:2, got '6:1'"),
    (["--case", "1:99"], 2, "grade.py: --case 1:99: exercise 1 has cases 1 to 7"),
    (["--time-limit", "soon"], 2, f"grade.py: {LIMIT}, got 'soon'"),
    (["--time-limit=inf"], 2, f"grade.py: {LIMIT}, got 'inf'"),
    (["--verbose"], 2, "grade.py: unknown option --verbose (see --help)"),
])
def test_command_line(grade, capsys, args, code, message):
    assert grade.main(args) == code
    out, err = capsys.readouterr()
    if code:
        assert err == message + "\n" and out == ""
    else:
        assert out.startswith(message) and "--time-limit SECONDS" in out


def test_the_help_does_not_need_docstrings():
    proc = subprocess.run([sys.executable, "-OO", str(EXERCISES / "grade.py"), "--help"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("usage: grade.py [DIR] [--case E:N] [--time-limit SECONDS]")


def test_grading_survives_python_O(tmp_path):
    """The grader decides with comparisons and raises, never `assert` (which `python -O` removes): no file of
    tutorials/exercises/ holds an assert statement, and under -O a planted mistake is still wrong at its case
    (graded with --case, in the one optimized process)."""
    import ast

    for path in EXERCISES.glob("*.py"):
        assert not any(isinstance(node, ast.Assert) for node in ast.walk(ast.parse(path.read_text()))), path
    write_mistake(tmp_path, "chain_rule.py", *Q_OFF_BY_ONE)
    proc = subprocess.run([sys.executable, "-O", str(EXERCISES / "grade.py"), str(tmp_path), "--case", "1:1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "case 1 of 7 (V=2, a chain of 1)\nwrong: TV 0.0504 from the target's" in (
        proc.stdout), proc.stdout + proc.stderr


def test_a_python_without_numpy_gets_a_hint():
    if subprocess.run([sys.executable, "-S", "-c", "import numpy"], capture_output=True).returncode == 0:
        pytest.skip("this Python finds NumPy even without site-packages")
    proc = subprocess.run([sys.executable, "-S", str(EXERCISES / "grade.py")], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot import numpy: run `make exercises`, or " in proc.stderr
    assert "`.venv/bin/python tutorials/exercises/grade.py`" in proc.stderr


def test_a_broken_file_is_wrong_in_one_line(grade, tmp_path):
    (tmp_path / "recursive_rejection.py").write_text("def verify_recursive_wor(tree, p, rand)\n")  # a syntax error
    status, line, lines = grade.grade(3, tmp_path)
    assert status == "wrong" and line.startswith("wrong: importing recursive_rejection.py raised SyntaxError")
    assert lines == []


def test_the_second_case_of_each_rule_is_two_levels_deep_with_distinct_q_rows(grade):
    (V, k, seed), (V2, widths, seed2) = grade.checks.CHAIN_CASES[1], grade.checks.TREE_CASES[1]
    assert k == 2 and len(widths) == 2
    for V, seed in ((V, seed), (V2, seed2)):
        _, Q = grade.checks.tables(V, seed)
        assert len({tuple(row) for row in Q}) == V


def test_the_first_mask_cases_have_no_siblings(grade):
    trees = grade.checks.random_trees()
    assert [t.parents.tolist() for t in trees[:2]] == [[-1, 0], [-1, 0]]
    assert trees[2].parents.tolist() == [-1, 0, 0]
    assert [len(t) for t in trees] == sorted(len(t) for t in trees)  # smallest first


def test_each_tree_case_draws_the_widths_its_label_names(grade):
    """Without replacement a node gets fewer children than asked where q has fewer tokens: no case asks
    for more than every tree it draws gets."""
    for V, widths, seed in grade.checks.TREE_CASES:
        _, Q = grade.checks.tables(V, seed)
        level = {0}  # the tokens of one level's nodes (the root's: 0)
        for width in widths:
            assert all((Q[t] > 0).sum() >= width for t in level), (V, widths, seed)
            level = {int(x) for t in level for x in np.flatnonzero(Q[t])}


def test_tables_are_distributions(grade):
    for V, _, seed in grade.checks.CHAIN_CASES + grade.checks.TREE_CASES:
        for M in grade.checks.tables(V, seed):
            assert np.allclose(M.sum(axis=1), 1) and (M >= 0).all()


def test_the_head_exercise_hands_over_the_states_before_ln_f(grade):
    """Exercise 5's `top` is the target's top block's output before its final layer norm: ln_f of it is
    gpt2.hidden's feature (what the library's head reads), and it is not that feature itself."""
    from specdec_np.gpt2 import hidden, layer_norm

    target = grade.checks.shared()["eagle target"]
    tokens = grade.checks.HEAD_CASES[0][0]
    top = grade.checks.top_states(target, tokens)
    feats = hidden(target, tokens, grade.checks.new_cache(target))
    assert np.abs(layer_norm(top, **target.params["ln_f"], eps=target.config.layer_norm_epsilon) - feats).max() < 1e-12
    assert np.abs(top - feats).max() > 1.0
