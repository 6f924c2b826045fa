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
CELL_TIMEOUT = 900  # seconds for one cell: a lesson's timed cells take a minute on a busy 2-core machine


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
        NotebookClient(nb, kernel_name=kernel, timeout=CELL_TIMEOUT, record_timing=False,
                       resources={"metadata": {"path": work}}).execute()
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


def main(argv=None, load_check=busy, register=register_kernel) -> int:
    try:
        return run(argv, load_check, register)
    except BaseException as error:
        if not interrupted(error):
            raise
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during the cleanup below changes nothing
        print("make_notebooks: interrupted (the notebooks already written are whole)", file=sys.stderr, flush=True)
        return 130


def run(argv, load_check, register) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", type=Path, help="lesson files (default: every lesson)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    parser.add_argument("--kernel", default=KERNEL,
                        help="Jupyter kernel to run them in (registered first if it is specdec_np)")
    args = parser.parse_args(argv)
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
