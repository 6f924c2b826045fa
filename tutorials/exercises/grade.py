"""Grade the exercises exactly: `make exercises`, or `python tutorials/exercises/grade.py [DIR]`.

One line per exercise: not yet written (the stub still raises NotImplementedError), correct, or
wrong at the smallest failing case; under a wrong line, what differs (the distribution of the first
token your code emits beside the target's, the node, coin or draw where it departs) and a command
that reruns that case alone, printing it in full. Exit 0 when every exercise is correct, 1 otherwise.

checks.py holds what each exercise is checked against (the rules by the library's exact one-step
check, `specdec_np.proofs.exact`). The checks run here; your file runs in a worker process of its own
(runner.py says what that isolates and what not): it answers the checks' calls over a pipe, so the
verdict is this process's comparison of what your code returned. An exit, an endless loop (past
--time-limit, with --case too), an exception or a signal sent to the grader makes that exercise wrong,
with the reason, and leaves the others graded; changes to the clone while it ran are named under its
line. DIR (default: this folder) holds the five files; `solutions/` holds reference solutions.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import shlex
import signal
import stat
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIME_LIMIT = 60.0  # seconds each exercise may run (--time-limit)


def module_at(path: Path, name: str):
    """The module the Python file at `path` defines, imported under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


try:
    runner = module_at(HERE / "runner.py", "exercises_runner")
    checks = module_at(HERE / "checks.py", "exercises_checks")
    MISSING = None
except ImportError as e:  # a Python without the venv's packages: main() says which Python to use
    MISSING = e.name or str(e)
except KeyboardInterrupt:
    print("grade.py: interrupted", file=sys.stderr)
    sys.exit(130)


# -- the exercises, each graded apart ------------------------------------------------------------
EXERCISES = [  # (title, file, the functions it defines, the checks' function that makes its cases, harness)
    ("block verification of a chain", "chain_rule.py", ("verify_block",), "chain_cases", None),
    ("the accepted path kept in the cache", "tree_attention.py", ("keep_path",), "keep_cases", None),
    ("recursive rejection without replacement", "recursive_rejection.py", ("verify_recursive_wor",), "tree_cases",
     None),
    ("the speculative decoding loop", "write_the_loop.py", ("speculative_decode",), "loop_cases", "loop"),
    ("the EAGLE head's step", "eagle_head.py", ("head_step", "head_keep"), "head_cases", None),
]
CLONE = HERE.parents[1]  # the clone: the graded code's changes to it are named


def file_problem(path: Path) -> str:
    """What is wrong with the exercise file at `path` in words ("" if it is a file)."""
    try:
        mode = path.stat().st_mode  # through a symbolic link
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{path} is a symbolic link that loops (it never reaches a file)"
        if path.is_symlink():
            return f"{path} is a symbolic link to {os.readlink(path)}, which does not exist"
        return f"{path} is missing" if e.errno == errno.ENOENT else f"{path} cannot be read ({e.strerror})"
    if stat.S_ISDIR(mode):
        return f"{path} is a folder, not a file"
    return "" if stat.S_ISREG(mode) else f"{path} is not a regular file"


def start_worker(n: int, folder: Path, time_limit: float, signals, show_output: bool = False):
    """The worker that grades exercise n's file in `folder`, and the proxies of the file's functions."""
    title, filename, names, cases, harness = EXERCISES[n - 1]
    path = Path(folder) / filename
    if problem := file_problem(path):
        raise checks.Wrong(problem)
    command = [sys.executable, str(HERE / "grade.py"), "--worker"]
    worker = runner.Worker(command, path.resolve(), names, time_limit, checks.shared(), signals, show_output)

    def proxy(name):
        return lambda *args: worker.call(name, args, harness)

    return worker, {name: proxy(name) for name in names}


def rerun_command(n: int, i: int, folder: Path) -> str:
    """The command that reruns case i of exercise n alone, paths relative to here where shorter."""
    def short(path) -> str:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else str(path)

    where = [] if Path(folder).resolve() == HERE else [short(folder)]
    return shlex.join([short(sys.executable), short(HERE / "grade.py"), *where, "--case", f"{n}:{i}"])


def grade(n: int, folder: Path, time_limit: float = TIME_LIMIT, signals=None) -> tuple[str, str, list]:
    """(status, line, diagnosis lines) of exercise n on the files in `folder`: status is "not yet written",
    "correct" or "wrong". The file runs in a worker process (runner.py); the checks run here, on what it returns."""
    signals = signals or runner.Signals(install=False)
    before = runner.clone_files(CLONE)
    status, line, diagnosis, signalled = judge(n, folder, time_limit, signals)
    if signalled:  # noticed only after the verdict: it still counts
        return "wrong", f"wrong: {signalled}", []
    if changed := runner.changes(before, runner.clone_files(CLONE)):  # named, not judged: another program may
        diagnosis = [f"note: the clone changed while your code ran ({changed}): your code runs in a scratch "
                     "folder; if it wrote there, write in the folder it runs in"] + diagnosis  # have written them
    return status, line, diagnosis


def judge(n: int, folder: Path, time_limit: float, signals) -> tuple[str, str, list, str]:
    """grade()'s verdict and, last, the line saying the graded code signalled the grader ("" if it did not)."""
    worker = None
    try:
        worker, funcs = start_worker(n, folder, time_limit, signals)
        cases = getattr(checks, EXERCISES[n - 1][3])()
        for i, (name, check) in enumerate(cases, 1):
            where, again = f"case {i} of {len(cases)} ({name})", f"rerun: {rerun_command(n, i, folder)}"
            try:
                checks.quietly(check, funcs)
            except (NotImplementedError, runner.Failed) as e:
                if isinstance(e, runner.Failed) and e.in_case:  # the worker's own diagnosis of this case
                    raise checks.Wrong(f"{where}: {e.line}", e.diagnosis + [again]) from None
                raise
            except checks.Wrong as e:
                raise checks.Wrong(f"{where}: {e.line}", e.diagnosis + [again]) from None
            except Exception as e:  # what the learner's code raised (runner.Raised) or made the checks raise
                raise checks.Wrong(f"{where}: {runner.failure(e)}", [again]) from None
        verdict = "correct", f"correct ({len(cases)} cases)", []
    except NotImplementedError:
        verdict = "not yet written", "not yet written", []
    except (checks.Wrong, runner.Failed) as e:
        verdict = "wrong", f"wrong: {e.line}", e.diagnosis
    finally:
        if worker is not None:
            worker.close()
    return *verdict, worker.signalled() if worker is not None else ""


def rerun(n: int, i: int, folder: Path, time_limit: float, signals) -> int:
    """--case n:i: run one case and print it in full (the learner's output and tracebacks show), in the time limit."""
    title, filename, names, cases, _ = EXERCISES[n - 1]
    cases = getattr(checks, cases)()
    if not 1 <= i <= len(cases):
        print(f"grade.py: --case {n}:{i}: exercise {n} has cases 1 to {len(cases)}", file=sys.stderr)
        return 2
    name, check = cases[i - 1]
    print(f"exercise {n}, {title} ({filename}), case {i} of {len(cases)} ({name})", flush=True)
    worker = None
    try:
        path = Path(folder) / filename
        if problem := file_problem(path):
            raise checks.Wrong(problem)
        worker = runner.Worker([sys.executable, str(HERE / "grade.py"), "--worker"], path.resolve(), names,
                               time_limit, checks.shared(), signals, show_output=True)
        check({name: (lambda name: lambda *args: worker.call(name, args, EXERCISES[n - 1][4]))(name)
               for name in names})
    except NotImplementedError:
        print("not yet written")
        return 1
    except (checks.Wrong, runner.Failed) as e:
        print(f"wrong: {e.line}", *e.diagnosis, *getattr(e, "detail", []), sep="\n")
        return 1
    except Exception as e:  # what the learner's code raised (its traceback above)
        print(f"wrong: {runner.failure(e)}")
        return 1
    finally:
        if worker is not None:
            worker.close()
    print("correct")
    return 0


# -- the command line ----------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage: main prints it
        raise ValueError(message)


PARSER = Parser(prog="grade.py", usage="%(prog)s [DIR] [--case E:N] [--time-limit SECONDS]", add_help=False,
                description="Grade the exercises in DIR (default: tutorials/exercises/), one line each: not yet "
                "written, correct, or wrong at the smallest failing case, with what differs and a command that "
                "reruns that case.",
                epilog="Exit status: 0 when every exercise is correct, 1 otherwise, 2 for a usage error, 130 on "
                "Ctrl-C.")
PARSER.add_argument("folder", nargs="*", metavar="DIR", help="a folder with chain_rule.py, tree_attention.py, "
                    "recursive_rejection.py, write_the_loop.py and eagle_head.py (tutorials/exercises/solutions/ "
                    "holds reference solutions)")
PARSER.add_argument("--case", metavar="E:N", help="rerun case N of exercise E alone and print it in full; your "
                    "code's output and tracebacks show (grading hides them)")
PARSER.add_argument("--time-limit", metavar="SECONDS", default=str(TIME_LIMIT), help="how long each exercise may "
                    "run before it counts as wrong (default 60)")
PARSER.add_argument("-h", "--help", action="store_true", help="this help")


def parse(argv) -> argparse.Namespace:
    """The command line; ValueError with a one-line message for a bad one."""
    opts, unknown = PARSER.parse_known_args(argv)
    folders = opts.folder + [a for a in unknown if not a.startswith("-") or a == "-"]
    if bad := [a for a in unknown if a.startswith("-") and a != "-"]:
        raise ValueError(f"unknown option {bad[0]} (see --help)")
    if len(folders) > 1:
        raise ValueError(f"give one folder of exercises, got two: {folders[0]} and {folders[1]}")
    if opts.case is not None:
        e, _, i = opts.case.partition(":")
        if not (e.isdigit() and i.isdigit() and 1 <= int(e) <= len(EXERCISES)):
            raise ValueError(f"--case wants EXERCISE:CASE with EXERCISE 1 to {len(EXERCISES)}, e.g. --case 1:2, "
                             f"got {opts.case!r}")
        opts.case = int(e), int(i)
    try:
        limit = float(opts.time_limit)
    except ValueError:
        limit = 0.0
    if not 0 < limit <= 86400:
        raise ValueError(f"--time-limit wants a number of seconds above 0 (at most 86400), got {opts.time_limit!r}")
    opts.time_limit = limit
    folder = Path(folders[0]) if folders else HERE
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (give the folder that holds the exercise files)")
    opts.folder = folder.resolve()
    return opts


def main(argv=None, signals=None) -> int:
    """The command line; `signals`: a runner.Signals, which the script installs (a signal from the graded code is
    then named, not obeyed); a program calling main keeps its own signals as they are."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(PARSER.format_help(), end="")
        return 0
    if MISSING:
        print(f"grade.py: this Python ({sys.executable}) cannot import {MISSING}: run `make exercises`, or "
              "`.venv/bin/python tutorials/exercises/grade.py` (`make venv` creates .venv)", file=sys.stderr)
        return 2
    if argv[:1] == ["--worker"] and len(argv) == 6:  # runner.Worker's process: --worker FILE NAMES RFD WFD SECONDS
        runner.worker(argv[1], argv[2].split(","), int(argv[3]), int(argv[4]), checks.shared(), checks.HARNESSES,
                      checks.Wrong, float(argv[5]))
    try:
        opts = parse(argv)
    except ValueError as e:
        print(f"grade.py: {e}", file=sys.stderr)
        return 2
    signals = signals or runner.Signals(install=False)
    if opts.case:
        return rerun(*opts.case, opts.folder, opts.time_limit, signals)
    statuses = []
    for n, (title, filename, _, _, _) in enumerate(EXERCISES, 1):
        status, line, diagnosis = grade(n, opts.folder, opts.time_limit, signals)
        statuses.append(status)
        print(f"exercise {n}, {title} ({filename}): {line}", *(f"    {d}" for d in diagnosis), sep="\n", flush=True)
    return 0 if all(s == "correct" for s in statuses) else 1


if __name__ == "__main__":
    try:
        code = main(signals=None if MISSING or sys.argv[1:2] == ["--worker"] else runner.Signals())
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the goodbye
        print("grade.py: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # `grade.py | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
