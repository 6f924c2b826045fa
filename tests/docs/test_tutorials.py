"""Every tutorial runs top to bottom with the venv's python: they cannot rot. They run in a temporary
folder, so the files they write (`out/`) do not land in the repository. Each lesson's notebook
(tutorials/notebooks/, written by `make notebooks`) holds the lesson's code and prints the same
deterministic lines as the suite's own run of it (lines marked by `tools.machine.print_timed` excepted).

Each tutorial checks its own lesson with asserts (exact distributions, equal logits, identical
trees and tokens), so a tutorial that runs to the end has passed its checks.
"""

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from specdec_np.tools.machine import MARKS

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def test_all_lessons_present():
    assert [t.name[:2] for t in TUTORIALS] == [f"{i:02d}" for i in range(1, 11)]


@functools.lru_cache(maxsize=None)
def run_lesson(path: Path) -> subprocess.CompletedProcess:
    """One run of a lesson, in a temporary folder, shared by the tests that read its output."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # works uninstalled too
    env.setdefault("NO_COLOR", "1")
    # On a busy machine multi-threaded OpenBLAS stalls on small blocks (threads wait for each other),
    # which only costs time: the tutorials' checks do not depend on the thread count.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as work:
        return subprocess.run([sys.executable, str(path)], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)


@pytest.mark.parametrize("path", TUTORIALS, ids=[t.stem for t in TUTORIALS])
def test_tutorial_runs(path):
    proc = run_lesson(path)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------------------------- the notebooks (make notebooks)
NOTEBOOKS = ROOT / "tutorials" / "notebooks"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def percent_cells(path: Path) -> list[str]:
    """The code cells of a percent-format lesson, as jupytext reads them (blank edges stripped)."""
    cells, kind, lines = [], None, []
    for line in path.read_text(encoding="utf-8").splitlines() + ["# %%"]:
        if line.startswith("# %%"):
            if kind == "code" and "\n".join(lines).strip():
                cells.append("\n".join(lines).strip("\n"))
            kind, lines = ("markdown" if "[markdown]" in line else "code"), []
        else:
            lines.append(line)
    return cells


def deterministic(lines) -> list[str]:
    """The lines a lesson prints that depend on neither a clock nor the BLAS's rounding (`tools.machine`'s
    print_timed and print_rounding mark the others) nor an optional extra (the charts' "wrote" lines, printed
    only where matplotlib is installed)."""
    return [ANSI.sub("", line).rstrip() for line in lines
            if not line.startswith(MARKS) and not line.startswith("wrote out/tutorial_")]


def text(value) -> str:
    """A notebook's text field: a string, or a list of lines."""
    return "".join(value) if isinstance(value, list) else value


def stdout_lines(cell) -> list[str]:
    return "".join(text(o["text"]) for o in cell["outputs"]
                   if o["output_type"] == "stream" and o["name"] == "stdout").splitlines()


def test_every_lesson_has_a_notebook():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == [t.stem for t in TUTORIALS]


@pytest.mark.parametrize("path", TUTORIALS, ids=[t.stem for t in TUTORIALS])
def test_notebook_holds_the_lessons_run(path):
    """The notebook `make notebooks` wrote: the lesson's code, executed in order without an error,
    the machine named first, and the same deterministic lines the suite's own run prints."""
    nb_path = NOTEBOOKS / f"{path.stem}.ipynb"
    assert nb_path.stat().st_size < 1_000_000, f"{nb_path.name} is {nb_path.stat().st_size} bytes"
    nb = json.loads(nb_path.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    source = [text(c["source"]) for c in code]
    assert source == percent_cells(path), f"{nb_path.name} is not {path.name}'s code: run make notebooks"
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    for cell, src in zip(code, source):
        assert not any(o["output_type"] == "error" for o in cell["outputs"]), src[:200]
        # A cell that prints unconditionally has output.
        if re.search(r"^(print|print_timed|print_rounding|trace\.show_page)\(", src, flags=re.M):
            assert cell["outputs"], f"a printing cell has no output: {src[:200]}"
    first = stdout_lines(code[0])
    assert first and first[0].startswith("machine: ") and "BLAS kernel" in first[0], first[:1]
    printed = [line for cell in code for line in stdout_lines(cell)][1:]  # without the machine's line
    run = run_lesson(path)
    assert run.returncode == 0, f"{path.name} failed"
    assert deterministic(printed) == deterministic(run.stdout.splitlines()), (
        f"{nb_path.name}'s deterministic lines differ from this run of {path.name}: run make notebooks")


def test_readme_images_exist_and_parse():
    """Every image the README shows is in the repository, and a hand-written SVG is well-formed XML."""
    import re
    import xml.dom.minidom

    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/loop.svg" in images  # the picture of the whole loop, in "The paper in a few lines"
    for image in images:
        assert (ROOT / image).is_file(), f"README shows {image}, which is missing"
        if image.endswith(".svg"):
            xml.dom.minidom.parse(str(ROOT / image))


def test_make_notebooks_refuses_on_a_busy_machine(capsys):
    """One line, before any Jupyter import or kernel registration, when the load check sees others."""
    sys.path.insert(0, str(ROOT / "tutorials"))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(ROOT / "tutorials"))
    assert make_notebooks.main([], load_check=lambda: "other processes use 1.4 of its 2 cores") == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("make_notebooks: refused: other processes use 1.4 of its 2 cores")
    assert make_notebooks.main(["no_such_lesson.py"], load_check=lambda: "") == 1
    assert capsys.readouterr().out == "make_notebooks: no lesson file no_such_lesson.py\n"


def test_lessons_import_no_plan_chooser_from_the_tools():
    """Lessons take from the tools only the machine's load and print helpers, the timers of the cost
    curve (and lesson 10 the BLAS's name), and the trace: never the plan chooser."""
    import ast

    allowed = {"machine", "costcurve", "blas", "trace"}
    for path in TUTORIALS:
        used = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "specdec_np.tools":
                used |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specdec_np.tools."):
                used.add(node.module.split(".")[2])
        assert used <= allowed, f"{path.name} imports tools.{', tools.'.join(sorted(used - allowed))}"
