"""The exercise grader contains what it grades (tutorials/exercises/runner.py): the verdict is its own
comparison of what the graded code returned, never a file or message the code can forge; the code runs
in a scratch folder, its processes end with every verdict, a signal it sends the grader is named and
ignored, its changes to the clone are named, and a bad exercise path is named as what it is. Each test
plants the hostile code and checks the grader's line (small time limits: fast)."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import grader_with_its_worker_started

ROOT = Path(__file__).resolve().parents[2]
EXERCISES = ROOT / "tutorials" / "exercises"
STUB = "def verify_block(tree, p, rand):\n"


def grader(folder, *args, grade_py=EXERCISES / "grade.py", timeout=120):
    return subprocess.run([sys.executable, str(grade_py), str(folder), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def line_of(proc, filename: str) -> str:
    return next(line for line in proc.stdout.splitlines() if f"({filename}):" in line)


def test_a_forged_verdict_is_not_believed(tmp_path):
    """The old attack (a verdict file named in argv) and a forged answer on every pipe the worker holds:
    the grader's verdict is still its own comparison, and says the exercise is wrong."""
    forged = ('{"status": "correct", "line": "correct (forged)", "diagnosis": []}')
    (tmp_path / "chain_rule.py").write_text(
        "import os, sys, json, struct\n"
        f"FORGED = {forged!r}\n"
        "for arg in sys.argv[1:]:\n"
        "    try:\n        open(arg + '.json', 'w').write(FORGED)\n    except OSError:\n        pass\n"
        "for fd in range(3, 64):\n"
        "    for message in (FORGED, json.dumps({'op': 'return', 'value': [[0], 0]})):\n"
        "        try:\n            os.write(fd, struct.pack('>I', len(message)) + message.encode())\n"
        "        except OSError:\n            pass\n"
        "os._exit(0)\n")
    proc = grader(tmp_path, "--time-limit", "20")
    line = line_of(proc, "chain_rule.py")
    assert "wrong: " in line and "(forged)" not in proc.stdout and ": correct" not in line, proc.stdout + proc.stderr
    assert proc.returncode == 1


def test_the_graded_code_runs_in_a_scratch_folder_outside_the_clone(tmp_path):
    where = tmp_path / "cwd.txt"
    (tmp_path / "chain_rule.py").write_text(f"import os\nopen({str(where)!r}, 'w').write(os.getcwd())\n" + STUB
                                            + "    raise NotImplementedError\n")
    proc = grader(tmp_path)
    assert line_of(proc, "chain_rule.py").endswith(": not yet written"), proc.stdout
    cwd = Path(where.read_text())
    assert ROOT not in cwd.parents and cwd != ROOT and not cwd.exists()  # a temporary folder, removed after


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_fifty_children_do_not_outlive_the_verdict(tmp_path):
    pids = tmp_path / "pids.txt"
    (tmp_path / "chain_rule.py").write_text(
        "import subprocess\n" + STUB +
        "    procs = [subprocess.Popen(['sleep', '600']) for _ in range(50)]\n"
        f"    open({str(pids)!r}, 'w').write(' '.join(str(p.pid) for p in procs))\n"
        "    raise NotImplementedError\n")
    proc = grader(tmp_path)
    assert line_of(proc, "chain_rule.py").endswith(": not yet written"), proc.stdout + proc.stderr
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 50
    deadline = time.monotonic() + 10  # killed at once; their new parent reaps them
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in started)


def copy_of_the_grader(tmp_path) -> Path:
    """A clone of the grader's files under tmp_path/clone (its CLONE), with a canary file at its root."""
    here = tmp_path / "clone" / "tutorials" / "exercises"
    shutil.copytree(EXERCISES, here, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "clone" / "canary.txt").write_text("tweet")
    return here


def test_writes_into_the_clone_and_a_deleted_canary_are_named(tmp_path):
    here = copy_of_the_grader(tmp_path)
    clone = tmp_path / "clone"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "chain_rule.py").write_text(
        "import os\n" + STUB + f"    os.remove({str(clone / 'canary.txt')!r})\n"
        f"    open({str(clone / 'tutorials' / 'new.txt')!r}, 'w').write('x')\n"
        "    raise NotImplementedError\n")
    (mine / "tree_attention.py").write_text(  # an honest stub: nothing named
        "def keep_path(cache, start, path):\n    raise NotImplementedError\n")
    proc = grader(mine, "--time-limit", "30", grade_py=here / "grade.py")
    lines = proc.stdout.splitlines()
    i = lines.index(line_of(proc, "chain_rule.py"))
    assert lines[i].endswith(": not yet written") and lines[i + 1].startswith(
        "    note: the clone changed while your code ran (created tutorials/new.txt; deleted canary.txt): your code "
        "runs in a scratch folder"), proc.stdout + proc.stderr
    j = lines.index(line_of(proc, "tree_attention.py"))  # an honest stub: nothing named
    assert lines[j].endswith(": not yet written") and not lines[j + 1].startswith("    note:")


def test_a_signal_to_the_grader_is_named_and_the_grading_goes_on(tmp_path):
    (tmp_path / "chain_rule.py").write_text(
        "import os, signal, time\n" + STUB + "    os.kill(os.getppid(), signal.SIGTERM)\n    time.sleep(300)\n")
    (tmp_path / "recursive_rejection.py").write_text(
        "import os, signal\nos.kill(os.getppid(), signal.SIGINT)\n"
        "def verify_recursive_wor(tree, p, rand):\n    raise NotImplementedError\n")
    start = time.monotonic()
    proc = grader(tmp_path, "--time-limit", "60")
    assert proc.returncode == 1 and proc.stderr == "", proc.stdout + proc.stderr
    assert line_of(proc, "chain_rule.py").endswith(
        ": wrong: your code sent the grader SIGTERM: the grader ignored it and stopped your code (it may not "
        "signal the grader)")
    assert "sent the grader SIGINT" in line_of(proc, "recursive_rejection.py")
    assert line_of(proc, "write_the_loop.py").endswith("is missing")  # it went on to the end
    assert time.monotonic() - start < 120  # the sleeping code was stopped, not waited for


def test_a_folder_or_a_symlink_loop_is_named_as_such(tmp_path):
    (tmp_path / "chain_rule.py").mkdir()
    os.symlink(tmp_path / "tree_attention.py", tmp_path / "tree_attention.py")
    os.symlink(tmp_path / "gone.py", tmp_path / "recursive_rejection.py")
    proc = grader(tmp_path)
    assert line_of(proc, "chain_rule.py").endswith(f": wrong: {tmp_path / 'chain_rule.py'} is a folder, not a file")
    assert line_of(proc, "tree_attention.py").endswith("tree_attention.py is a symbolic link that loops (it never "
                                                       "reaches a file)")
    assert line_of(proc, "recursive_rejection.py").endswith("which does not exist")
    assert line_of(proc, "write_the_loop.py").endswith("write_the_loop.py is missing")


def test_the_time_limit_holds_with_case(tmp_path):
    (tmp_path / "chain_rule.py").write_text(STUB + "    print('looping', flush=True)\n    while True:\n"
                                            "        pass\n")
    start = time.monotonic()
    proc = grader(tmp_path, "--case", "1:1", "--time-limit", "1", timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "looping" in proc.stdout  # --case shows the code's output
    assert proc.stdout.rstrip().endswith("wrong: no verdict within 1 s: an endless loop? (--time-limit SECONDS "
                                         "allows more)")
    assert time.monotonic() - start < 30


def test_case_shows_the_learners_traceback(tmp_path):
    (tmp_path / "chain_rule.py").write_text(STUB + "    return helper()\n\ndef helper():\n"
                                            "    raise ValueError('oops')\n")
    proc = grader(tmp_path, "--case", "1:1")
    assert proc.returncode == 1 and "in helper" in proc.stderr and "ValueError: oops" in proc.stderr, proc.stderr
    assert proc.stdout.rstrip().endswith("wrong: ValueError: oops")


def test_an_outside_sigterm_still_ends_the_grader(tmp_path):
    """The grader ignores signals from the code it grades only: one from elsewhere ends it (143), its worker too."""
    pid_file = tmp_path / "worker.pid"
    (tmp_path / "chain_rule.py").write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
                                            "time.sleep(300)\n")
    proc = grader_with_its_worker_started(tmp_path, pid_file, timeout=60)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out == "" and err == "", (out, err)
    deadline = time.monotonic() + 10
    while alive(int(pid_file.read_text())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(int(pid_file.read_text()))


def test_main_called_from_a_program_leaves_its_signals_alone(tmp_path):
    """Only the script blocks signals (to tell the graded code's from others): a program calling main keeps its
    mask, which its later subprocesses inherit (a blocked SIGINT there would make them deaf to Ctrl-C)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("grade_for_mask", EXERCISES / "grade.py")
    grade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grade)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    (tmp_path / "chain_rule.py").write_text(STUB + "    raise NotImplementedError\n")
    assert grade.main([str(tmp_path), "--case", "1:1"]) == 1
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
