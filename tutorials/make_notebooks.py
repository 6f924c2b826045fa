"""Build tutorials/notebooks/NN_name.ipynb from the lessons, executed, with their outputs: `make notebooks`.

Each lesson (a percent-format .py file) is read with jupytext, run top to bottom by nbclient in
the `specdec_np` Jupyter kernel (registered here, for the current user) in a temporary folder,
and saved with its outputs. The first output names the machine (CPU model, last-level cache,
cores, BLAS kernel), so a reader knows where the timed figures come from. The kernel inherits this
process's environment: `make notebooks` unsets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, so OpenBLAS
picks its own kernel for the CPU, as it does on a learner's machine.

The kernel is registered first, so that the README's `specdec_np` kernel exists even when the build
then refuses: timed figures are only worth showing from a quiet machine, and the build refuses, in one
line, when the tools' load check sees other processes using the cores. Lessons import tutorials/lesson.py:
the kernel finds it on PYTHONPATH, which this script sets. Ctrl-C stops it with one line (exit 130).

    python tutorials/make_notebooks.py [LESSON.py ...] [--out DIR] [--kernel NAME]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent
OUT = TUTORIALS / "notebooks"
KERNEL = "specdec_np"
EXTRA = "make_notebooks: needs the notebooks extra (jupytext, nbclient, ipykernel): `make notebooks` installs it"
# --help's line: a literal, not __doc__'s first line (python -OO drops docstrings)
DESCRIPTION = "Build tutorials/notebooks/NN_name.ipynb from the lessons, executed, with their outputs: `make notebooks`."
CELL_TIMEOUT = 900  # seconds for one cell: a lesson's timed cells take a minute on a busy 2-core machine


def optimized() -> str:
    """Why the lessons' checks would not run here ("" if they would): they are asserts, which python -O removes,
    in this process or in the kernel (it inherits PYTHONOPTIMIZE)."""
    if sys.flags.optimize or os.environ.get("PYTHONOPTIMIZE"):
        return ("python -O (or PYTHONOPTIMIZE) removes the asserts that check each lesson: run it without them, "
                "e.g. `env -u PYTHONOPTIMIZE make notebooks`")
    return ""


def lessons() -> list[Path]:
    return sorted(TUTORIALS.glob("[0-9][0-9]*_*.py"))


def machine_line() -> str:
    """The machine in one line; the kernel, started from this process's environment, runs the same BLAS."""
    from specdec_np.tools.machine import machine_name

    return f"machine: {machine_name()}\n"


def register_kernel(name: str = KERNEL) -> None:
    """Install the Jupyter kernel `name` (this venv's python) for the current user."""
    from ipykernel.kernelspec import install  # ModuleNotFoundError without the notebooks extra (main says so)

    install(user=True, kernel_name=name, display_name=f"Python ({name})")


def build(lesson: Path, out_dir: Path, kernel: str = KERNEL, machine: str | None = None) -> Path:
    """Execute one lesson as a notebook and write out_dir/<lesson>.ipynb (atomically); its path."""
    import jupytext
    import nbformat
    from nbclient import NotebookClient

    nb = jupytext.read(lesson)
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": f"Python ({kernel})", "language": "python"}
    nb.metadata.pop("jupytext", None)
    with tempfile.TemporaryDirectory() as work:  # the files a lesson writes (out/...) land here
        with open(Path(work) / "kernel.stderr", "w+", encoding="utf-8", errors="replace") as said:
            try:  # the kernel's own standard error goes to `said`: shown where the build fails, not on Ctrl-C
                NotebookClient(nb, kernel_name=kernel, timeout=CELL_TIMEOUT, record_timing=False,
                               resources={"metadata": {"path": work}},
                               on_notebook_start=take_back_ctrl_c).execute(stderr=said)
            except Exception:
                if not ctrl_c:
                    said.seek(0)
                    sys.stderr.write(said.read()[-4000:])
                raise
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.outputs.insert(0, nbformat.v4.new_output("stream", name="stdout", text=machine or machine_line()))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{lesson.stem}.ipynb"
    tmp = path.with_suffix(".ipynb.tmp")
    try:
        nbformat.write(nb, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # interrupted: no half-written file left
    return path


def busy() -> str:
    """Other processes' load in words when they use the cores ("" on a quiet machine)."""
    from specdec_np.tools import machine

    return machine.busy(1.0)


def interrupted(error: BaseException | None) -> bool:
    """Whether `error` is, or was raised while handling, a KeyboardInterrupt (nbclient's cleanup chains others)."""
    while error is not None:
        if isinstance(error, KeyboardInterrupt):
            return True
        error = error.__cause__ or error.__context__
    return False


INTERRUPTED = "make_notebooks: interrupted (the notebooks already written are whole)"
ctrl_c = []  # set once Ctrl-C reached this process (whatever the kernel, which gets it too, did first)


def on_ctrl_c(signum, frame):
    """Ctrl-C: the one line now, then nothing more on standard error. The kernel gets the signal too and may die
    first, and jupyter_client and pyzmq then report it (a ZMQ traceback) while this process stops: not shown."""
    if not ctrl_c:
        ctrl_c.append(signum)
        say_interrupted()
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), sys.stderr.fileno())
    raise KeyboardInterrupt


def take_back_ctrl_c(**_) -> None:
    """nbclient's hook once its kernel runs: nbclient has just made Ctrl-C its own (an asyncio handler that shuts
    the kernel down and lets the cell fail with DeadKernelError, ZMQError and AssertionError tracebacks, exit 1);
    Ctrl-C is on_ctrl_c's again, so it still says one line and exits 130 (nbclient's cleanup still stops the kernel)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # not where Ctrl-C already came (the cleanup)
        signal.signal(signal.SIGINT, on_ctrl_c)


def say_interrupted():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during the cleanup changes nothing
    sys.stdout.flush()
    print(INTERRUPTED, file=sys.stderr, flush=True)


def main(argv=None, load_check=busy, register=register_kernel) -> int:
    ctrl_c.clear()
    before = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        return run(argv, load_check, register)
    except BaseException as error:
        if not (ctrl_c or interrupted(error)):  # an error of its own, not one that Ctrl-C caused
            raise
        if not ctrl_c:
            say_interrupted()
        return 130
    finally:
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:
            signal.signal(signal.SIGINT, before)


def run(argv, load_check, register) -> int:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("lessons", nargs="*", type=Path, help="lesson files (default: every lesson)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--kernel", default=KERNEL,
                        help="Jupyter kernel to run them in (registered first if it is specdec_np)")
    args = parser.parse_args(argv)
    if why := optimized():
        print(f"make_notebooks: refused: {why}")
        return 1
    for path in args.lessons:
        if not path.is_file():
            print(f"make_notebooks: no lesson file {path}")
            return 1
    if args.kernel == KERNEL:
        try:
            register(KERNEL)  # first: the README's kernel exists even where the build refuses below
        except ModuleNotFoundError:
            print(EXTRA)
            return 1
    if why := load_check():
        print(f"make_notebooks: refused: {why}; the notebooks hold a quiet machine's timings: "
              "run it when nothing else runs")
        return 1
    try:
        import jupytext, nbclient, nbformat  # noqa: F401, E401
    except ModuleNotFoundError:
        print(EXTRA)
        return 1
    # The lessons import tutorials/lesson.py; the kernel (this process's environment) finds it here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TUTORIALS), os.environ.get("PYTHONPATH")]))
    machine = machine_line()
    print(machine, end="", flush=True)
    for lesson in args.lessons or lessons():
        print(f"wrote {os.path.relpath(build(lesson, args.out, args.kernel, machine))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
