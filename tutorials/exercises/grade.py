"""Grade the exercises exactly: `make exercises`, or `python tutorials/exercises/grade.py [DIR]`.

One line per exercise: not yet written (the stub still raises NotImplementedError), correct, or
wrong at the smallest failing case; under a wrong line, what differs (the distribution of the first
token your code emits beside the target's, the node, coin or draw where it departs) and a command
that reruns that case alone, printing it in full. Exit 0 when every exercise is correct, 1 otherwise.

checks.py holds what each exercise is checked against (the rules by the library's exact one-step
check, `specdec_np.proofs.exact`); runner.py runs each exercise in a process of its own with a time
limit, so that an exit, an endless loop or an exception in your code makes that exercise wrong, with
the reason, and leaves the others graded. DIR (default: this folder) holds the four files;
`solutions/` holds reference solutions.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import signal
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


runner = module_at(HERE / "runner.py", "exercises_runner")
try:
    checks = module_at(HERE / "checks.py", "exercises_checks")
    MISSING = None
except ImportError as e:  # a Python without the venv's packages: main() says which Python to use
    MISSING = e.name or str(e)
except KeyboardInterrupt:
    print("grade.py: interrupted", file=sys.stderr)
    sys.exit(130)


# -- the exercises, each graded apart ------------------------------------------------------------
EXERCISES = [  # (title, file, the functions it defines, the checks' function that makes its cases)
    ("chain rule with its residual", "chain_rule.py", ("verify_chain",), "chain_cases"),
    ("tree attention mask and positions", "tree_attention.py", ("attention_mask", "positions"), "mask_cases"),
    ("recursive rejection without replacement", "recursive_rejection.py", ("verify_recursive_wor",), "tree_cases"),
    ("the speculative decoding loop", "write_the_loop.py", ("speculative_decode",), "loop_cases"),
]


def load(path: Path, names) -> dict:
    """The named functions of the file at `path` (Wrong if it cannot be imported or lacks one)."""
    if not path.is_file():
        raise checks.Wrong(f"{path} is missing")
    try:
        module = module_at(path, f"exercise_{path.stem}")
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: importing a solution must not end the grading
        raise checks.Wrong(f"importing {path.name} raised {checks.failure(e)}") from None
    missing = [n for n in names if not callable(getattr(module, n, None))]
    if missing:
        raise checks.Wrong(f"{path.name} defines no function {missing[0]}")
    return {n: getattr(module, n) for n in names}


def rerun_command(n: int, i: int, folder: Path) -> str:
    """The command that reruns case i of exercise n alone, paths relative to here where shorter."""
    def short(path) -> str:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else str(path)

    where = [] if Path(folder).resolve() == HERE else [short(folder)]
    return shlex.join([short(sys.executable), short(HERE / "grade.py"), *where, "--case", f"{n}:{i}"])


def grade(n: int, folder: Path) -> tuple[str, str, list]:
    """(status, line, diagnosis lines) of exercise n on the files in `folder`, in this process:
    status is "not yet written", "correct" or "wrong"; the learner's exceptions become "wrong"."""
    title, filename, names, cases = EXERCISES[n - 1]
    try:
        funcs = load(Path(folder) / filename, names)
        cases = getattr(checks, cases)()
        for i, (name, check) in enumerate(cases, 1):
            where, again = f"case {i} of {len(cases)} ({name})", f"rerun: {rerun_command(n, i, folder)}"
            try:
                checks.quietly(check, funcs)
            except NotImplementedError:
                raise
            except checks.Wrong as e:
                raise checks.Wrong(f"{where}: {e.line}", e.diagnosis + [again]) from None
            except BaseException as e:  # anything the learner's code raised or ended with: one line, no traceback
                raise checks.Wrong(f"{where}: {checks.failure(e)}", [again]) from None
        return "correct", f"correct ({len(cases)} cases)", []
    except NotImplementedError:
        return "not yet written", "not yet written", []
    except checks.Wrong as e:
        return "wrong", f"wrong: {e.line}", e.diagnosis


def rerun(n: int, i: int, folder: Path) -> int:
    """--case n:i: run one case in this process and print it in full (the learner's output and tracebacks show)."""
    title, filename, names, cases = EXERCISES[n - 1]
    cases = getattr(checks, cases)()
    if not 1 <= i <= len(cases):
        print(f"grade.py: --case {n}:{i}: exercise {n} has cases 1 to {len(cases)}", file=sys.stderr)
        return 2
    name, check = cases[i - 1]
    print(f"exercise {n}, {title} ({filename}), case {i} of {len(cases)} ({name})", flush=True)
    try:
        check(load(Path(folder) / filename, names))
    except NotImplementedError:
        print("not yet written")
        return 1
    except checks.Wrong as e:
        print(f"wrong: {e.line}", *e.diagnosis, *e.detail, sep="\n")
        return 1
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
                    "recursive_rejection.py and write_the_loop.py (tutorials/exercises/solutions/ holds reference "
                    "solutions)")
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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(PARSER.format_help(), end="")
        return 0
    if MISSING:
        print(f"grade.py: this Python ({sys.executable}) cannot import {MISSING}: run `make exercises`, or "
              "`.venv/bin/python tutorials/exercises/grade.py` (`make venv` creates .venv)", file=sys.stderr)
        return 2
    if argv[:1] == ["--worker"] and len(argv) == 5:  # run_apart's process: --worker N DIR RESULT SECONDS
        runner.worker(lambda: grade(int(argv[1]), Path(argv[2])), Path(argv[3]), float(argv[4]))
    try:
        opts = parse(argv)
    except ValueError as e:
        print(f"grade.py: {e}", file=sys.stderr)
        return 2
    if opts.case:
        return rerun(*opts.case, opts.folder)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # killed politely: stop the worker on the way out (run_apart)
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    statuses = []
    for n, (title, filename, _, _) in enumerate(EXERCISES, 1):
        command = [sys.executable, str(HERE / "grade.py"), "--worker", str(n), str(opts.folder)]
        status, line, diagnosis = runner.run_apart(command, opts.time_limit)
        statuses.append(status)
        print(f"exercise {n}, {title} ({filename}): {line}", *(f"    {d}" for d in diagnosis), sep="\n", flush=True)
    return 0 if all(s == "correct" for s in statuses) else 1


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the goodbye
        print("grade.py: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # `grade.py | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
