"""Every tutorial runs top to bottom with the venv's python: they cannot rot. They run in a temporary
folder, so the files they write (`out/`) do not land in the repository. Each lesson's notebook
(tutorials/notebooks/, written by `make notebooks`) holds the lesson's code and prints the same
deterministic lines as the suite's own run of it (lines marked by `lesson.print_timed` excepted).

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

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tutorials"))
try:
    # tutorials/lesson.py: the lines a lesson's run and its notebook must both print, and a notebook's text fields
    from lesson import deterministic, notebook_lines, stdout_lines, text
finally:
    sys.path.remove(str(ROOT / "tutorials"))
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.py"))  # 04b (11b), the answer to lesson 4 (11), after it


def test_all_lessons_present():
    numbers = ["01", "02", "03", "04", "04b"] + [f"{i:02d}" for i in range(5, 12)] + ["11b"]
    assert [t.name.split("_")[0] for t in TUTORIALS] == numbers


# Each "Try this" check is a function the lesson calls on the changed input; here each is called again, after the
# lesson ran, on a deliberately wrong input (an expression in the lesson's names), where it must fail.
WRONG = {
    "01_gpt2_numpy": [("check_all_visible", "causal"), ("check_no_positions", "x")],
    "02_kv_cache": [("check_forgetful", "lambda cache: cache")],
    "03_speculative_sampling": [("check_draft_is_target", "my_p, my_q"), ("check_caught", "speculative_step"),
                                ("check_one_guess", "lambda rand: library_step(rand, k=2)"),
                                ("check_rule", "np.array([0.5, 0.6, 0.0, 0.0]), q")],
    "04b_the_loop_answer": [("spec.check_same_tokens", "partial(speculative_decode, acceptance=lambda p, q, x: 1.0), 1"),
                            ("check_always_keep", "answer.ratio"), ("check_top_k", "spec.SETTINGS")],
    "05_token_trees": [("check_wide", "[2, 2, 1]"), ("check_unmasked", "attention_mask(tree)")],
    "06_verifying_trees": [("check_d_first", "B, D"),
                           ("check_still_exact", "[('swapped', P, 'without', verify.verify_recursive)], [3]"),
                           ("check_without_never_less", "0, 1")],
    "07_staged": [("check_no_copies", "8")],
    "08_roofline": [("check_chain_passes", "chain_run, 3"),  # the wrong count, and a run of one step (too short)
                    ("check_chain_passes", "generate(target, prompt, 3, 'speculative', draft, plan=Plan(chain=4)), 4")],
    "09_optimal_verification": [("check_same_draft", "p, q"), ("check_equal_tables", "t2, d2")],
    "11_eagle": [("check_one_guess", "runs['EAGLE head']")],  # a tree of 8: steps emit more than two
}
DRIVER = """
import contextlib, io, json, os, runpy, sys
path, wrong = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(path))
names = runpy.run_path(path, run_name="__main__")
failed = []
for check, args in wrong:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            eval(check + "(" + args + ")", names)
        failed.append(False)
    except AssertionError:
        failed.append(True)
print("wrong inputs failed: " + json.dumps(failed), file=sys.stderr)
"""


@functools.lru_cache(maxsize=None)
def run_lesson(path: Path) -> subprocess.CompletedProcess:
    """One run of a lesson, in a temporary folder, shared by the tests that read its output; then its "Try this"
    checks on the wrong inputs of WRONG (the last line of stderr says which failed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # works uninstalled too
    env.setdefault("NO_COLOR", "1")
    # On a busy machine multi-threaded OpenBLAS stalls on small blocks (threads wait for each other),
    # which only costs time: the tutorials' checks do not depend on the thread count.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Each timed figure measured once (lesson.timing_rounds): the lines compared below are not timed, and
    # test_notebook_holds_the_lessons_run checks that this run prints the same ones as the notebook's full one.
    env["LESSON_QUICK_TIMING"] = "1"
    with tempfile.TemporaryDirectory() as work:
        return subprocess.run([sys.executable, "-c", DRIVER, str(path), json.dumps(WRONG.get(path.stem, []))],
                              cwd=work, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("path", TUTORIALS, ids=[t.stem for t in TUTORIALS])
def test_tutorial_runs(path):
    proc = run_lesson(path)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr


def try_this_checks(path: Path) -> set:
    """The checks (functions named check_*) a lesson defines after its "## Try this" heading."""
    import ast

    source = path.read_text(encoding="utf-8")
    start = source[:source.find("## Try this")].count("\n") + 1 if "## Try this" in source else 10 ** 9
    return {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.lineno > start
            and node.name.startswith("check_")}


@pytest.mark.parametrize("path", [t for t in TUTORIALS if t.stem in WRONG], ids=sorted(WRONG))
def test_try_this_checks_fail_on_a_wrong_input(path):
    """Every check of a lesson's "Try this" has a wrong input here, and fails on each."""
    assert try_this_checks(path) <= {check for check, _ in WRONG[path.stem]}, f"{path.name}: give each a wrong input"
    proc = run_lesson(path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = json.loads(proc.stderr.strip().splitlines()[-1].removeprefix("wrong inputs failed: "))
    assert failed == [True] * len(WRONG[path.stem]), list(zip(WRONG[path.stem], failed))


def test_every_try_this_check_has_a_wrong_input():
    """A function a "Try this" defines (its checks) has a wrong input in WRONG; so does every check WRONG names."""
    for path in TUTORIALS:
        assert try_this_checks(path) <= {check for check, _ in WRONG.get(path.stem, [])}, path.name
    assert all(check in path.read_text(encoding="utf-8") for path in TUTORIALS for check, _ in WRONG.get(path.stem, []))


def loop_implementation(path: Path) -> list[str]:
    """What in the code cells of a lesson (or of its notebook, NN_name.ipynb) implements speculative decoding's
    loop: a coin tossed (`.coin(`), a cache cut (`.truncate(`), a residual (`np.maximum(`), a verification rule or
    the library's loop imported (verify, methods, drafting), a function taking (target, draft, ...)."""
    import ast

    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = [text(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    else:
        cells = percent_cells(path) or [path.read_text(encoding="utf-8")]  # a plain module: one cell
    found = []
    for node in ast.walk(ast.parse("\n\n".join(cells))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "coin", "truncate", "maximum"):
            found.append(f"line {node.lineno}: a call to .{node.func.attr}()")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if {"verify", "methods", "drafting"} & {part for m in modules + names for part in m.split(".")}:
                found.append(f"line {node.lineno}: imports {', '.join(modules + names)}")
        elif isinstance(node, ast.FunctionDef) and [a.arg for a in node.args.args[:2]] == ["target", "draft"]:
            found.append(f"line {node.lineno}: def {node.name}(target, draft, ...)")
    return found


def test_lesson_4_holds_no_answer():
    """Lesson 4 specifies the loop and its checks and stops: no implementation in its code cells, no answer in its
    prose (the answer is exercise 4's solution, which lesson 4b loads and shows and where the same test finds one,
    so it can fail)."""
    four, answer = (ROOT / "tutorials" / name for name in ("04_write_the_loop.py", "04b_the_loop_answer.py"))
    assert loop_implementation(four) == [], loop_implementation(four)
    assert "## An answer" not in four.read_text(encoding="utf-8")
    assert "04b_the_loop_answer.py" in four.read_text(encoding="utf-8")  # it says where the answer is
    solution = ROOT / "tutorials" / "exercises" / "solutions" / "write_the_loop.py"
    assert len(loop_implementation(solution)) >= 4, loop_implementation(solution)
    assert '"exercises" / "solutions" / "write_the_loop.py"' in answer.read_text(encoding="utf-8")
    notebook = NOTEBOOKS / "04_write_the_loop.ipynb"
    assert loop_implementation(notebook) == [], f"{notebook.name} holds the answer: run make notebooks"


def test_lesson_11_holds_no_answer_to_exercise_5():
    """Lesson 11 points to exercise 5 and does not write the head's step: no fusion (head.fc), no block, no cut of the
    head's cache in its code; lesson 11b loads the exercise's solution, which holds all three."""
    eleven, answer = (ROOT / "tutorials" / name for name in ("11_eagle.py", "11b_the_head_answer.py"))
    code = "\n".join(percent_cells(eleven))
    for part in ('fc["w"]', "transformer_block", ".truncate("):
        assert part not in code, part
    assert "exercises/eagle_head.py" in eleven.read_text(encoding="utf-8")
    assert "11b_the_head_answer.py" in eleven.read_text(encoding="utf-8")
    solution = (ROOT / "tutorials" / "exercises" / "solutions" / "eagle_head.py").read_text(encoding="utf-8")
    assert all(part in solution for part in ('fc["w"]', "transformer_block", ".truncate("))
    assert '"exercises" / "solutions" / "eagle_head.py"' in answer.read_text(encoding="utf-8")

def test_the_prose_quotes_the_embedded_pairs_shapes():
    """The shapes lesson 11's prose and docs/performance.md state of the embedded pair are the shipped models'
    own: prose is not computed, so a new pair would leave a stale figure there without this check."""
    from specdec_np.models import load_head, load_model

    target, draft = load_model("tiny-target"), load_model("tiny-draft")
    t, d = target.config, draft.config

    def words(path):  # the text with line breaks and comment marks gone: a quote may span lines
        return " ".join(path.read_text(encoding="utf-8").replace("\n#", " ").split())

    eleven = words(ROOT / "tutorials" / "11_eagle.py")
    head = load_head("tiny-eagle", target)
    h = head.config
    for quoted in (f"the target's {t.n_vocab} x {t.n_embd} embedding", f"one block is {h.n_embd} wide, half the "
                   f"target's {t.n_embd}", f"wider than the whole draft model ({d.n_embd})",
                   f"(a {h.n_embd} x {head.ids.size} matrix", f"its own {d.n_vocab} x {d.n_embd} embedding"):
        assert quoted in eleven, f"11_eagle.py: {quoted!r}"
    performance = words(ROOT / "docs" / "performance.md")
    flops = 2 * (target.n_params - target.params["wpe"].size)  # a token: 2 per weight, position embeddings aside
    for quoted in (f"embedded target: {target.weight_bytes / 1e6:.0f} MB of weights and a "
                   f"{4 * t.n_vocab * t.n_embd / 1e6:.0f} MB row-major copy of the head",
                   f"today's is {t.n_layer} layers, {t.n_head} heads, {t.n_embd} wide ({target.n_params / 1e6:.1f}M "
                   "parameters)",
                   f"{flops / 2e6:.2f}M parameters outside its position embeddings ({flops / 1e6:.1f} MFLOP a token, "
                   f"{8 * flops / 1e6:.0f} MFLOP for 8 rows) and {target.weight_bytes / 1e6:.0f} MB of weights"):
        assert quoted in performance, f"docs/performance.md: {quoted!r}"


# ----------------------------------------------------------------------------- the notebooks (make notebooks)
NOTEBOOKS = ROOT / "tutorials" / "notebooks"
# An absolute path of the machine that ran the notebook (its venv, home, a temporary folder).
MACHINE_PATH = re.compile(r"(?<![\w.])/(home|root|tmp|work|usr|opt|var|mnt|srv|Users|private)/|site-packages")


def noise(outputs) -> list[str]:
    """What a saved notebook cell's outputs must not hold: anything on stderr (a warning), a path of the machine
    that ran it."""
    found = []
    for out in outputs:
        if out["output_type"] == "stream" and out["name"] == "stderr":
            found.append(f"stderr: {text(out['text'])[:300]}")
        shown = text(out.get("text", "")) + text(out.get("data", {}).get("text/plain", ""))
        if m := MACHINE_PATH.search(shown):
            found.append(f"a path of the machine that made it: {shown[max(0, m.start() - 80):m.end() + 80]}")
    return found


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


def test_the_notebook_check_finds_warnings_and_machine_paths():
    warning = {"output_type": "stream", "name": "stderr", "text": [
        "/work/main/.venv/lib/python3.11/site-packages/IPython/core/display.py:448: UserWarning: Consider using "
        "IPython.display.IFrame instead\n"]}
    printed = {"output_type": "stream", "name": "stdout", "text": "wrote /tmp/tmpab12/out/trace.html\n"}
    shown = {"output_type": "execute_result", "data": {"text/plain": ["PosixPath('/home/me/specdec_np/out')"]}}
    assert [len(noise([o])) for o in (warning, printed, shown)] == [2, 1, 1]
    fine = {"output_type": "stream", "name": "stdout",
            "text": "run: .venv/bin/python -m specdec_np trace; wrote out/x\n"}
    assert noise([fine]) == []


def test_the_notebook_comparison_finds_a_changed_line():
    """What test_notebook_holds_the_lessons_run compares: a notebook whose printed line differs from the run's is
    told apart (the negative control); what varies from run to run (timed and rounding lines, a chart's line, colour
    codes, trailing blanks), the machine's line, stderr and the way outputs split a line are not compared."""
    def stream(text, name="stdout"):
        return {"output_type": "stream", "name": name, "text": text}

    def notebook(accepted):
        return {"cells": [
            {"cell_type": "code", "outputs": [stream("machine: a CPU, BLAS kernel X\ntokens: 12  \n"),
                                              stream(["[timed] 9.9 ms a pass\n"])]},
            {"cell_type": "markdown", "source": "accepted 1 of 8"},
            {"cell_type": "code", "outputs": [stream("\x1b[1maccepted\x1b[0m "), stream(f"{accepted} of 8\n"),
                                              stream("a warning\n", "stderr"), stream("[rounding] 3e-07\n")]}]}

    run = "tokens: 12\n[timed] 3.1 ms a pass\nwrote out/tutorial_chart.png\naccepted 5 of 8\n[rounding] 1e-07\n"
    assert notebook_lines(notebook(5)) == deterministic(run.splitlines()) == ["tokens: 12", "accepted 5 of 8"]
    assert notebook_lines(notebook(6)) != deterministic(run.splitlines())


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
        if re.search(r"^(print|print_timed|print_rounding|show_trace)\(", src, flags=re.M):  # runs unconditionally
            assert cell["outputs"], f"a printing cell has no output: {src[:200]}"
        assert not noise(cell["outputs"]), f"{nb_path.name}: {noise(cell['outputs'])}"
    first = stdout_lines(code[0])
    assert first and first[0].startswith("machine: ") and "BLAS kernel" in first[0], first[:1]
    run = run_lesson(path)
    assert run.returncode == 0, f"{path.name} failed"
    assert notebook_lines(nb) == deterministic(run.stdout.splitlines()), (
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


def make_notebooks():
    sys.path.insert(0, str(ROOT / "tutorials"))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(ROOT / "tutorials"))
    return make_notebooks


def test_make_notebooks_refuses_on_a_busy_machine(capsys):
    """One line when the load check sees others, after the kernel is registered (the README names it)."""
    registered = []
    assert make_notebooks().main([], load_check=lambda: "other processes use 1.4 of its 2 cores",
                                 register=registered.append) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("make_notebooks: refused: other processes use 1.4 of its 2 cores")
    assert registered == ["specdec_np"]
    assert make_notebooks().main(["no_such_lesson.py"], load_check=lambda: "") == 1
    assert capsys.readouterr().out == "make_notebooks: no lesson file no_such_lesson.py\n"


def test_make_notebooks_without_the_extra_says_how_to_install_it(capsys):
    def no_ipykernel(name):
        raise ModuleNotFoundError("No module named 'ipykernel'", name="ipykernel")

    assert make_notebooks().main([], load_check=lambda: "", register=no_ipykernel) == 1
    assert capsys.readouterr().out.splitlines() == [make_notebooks().EXTRA]
    assert "`make notebooks` installs it" in make_notebooks().EXTRA


def test_make_notebooks_interrupted_is_one_line(capsys):
    """Ctrl-C (here while registering the kernel, with a second error chained as nbclient's cleanup does): 130."""
    def interrupted(name):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise AssertionError("kernel died")

    import signal
    handler = signal.getsignal(signal.SIGINT)
    try:
        assert make_notebooks().main([], load_check=lambda: "", register=interrupted) == 130
    finally:
        signal.signal(signal.SIGINT, handler)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith("make_notebooks: interrupted")
    with pytest.raises(ValueError):  # any other error is not hidden
        make_notebooks().main([], load_check=lambda: "", register=lambda name: int("x"))


def test_a_lesson_interrupted_is_one_line(tmp_path):
    """`make tutorials` runs each lesson through tutorials/lesson.py: Ctrl-C ends it in one line, exit 130."""
    lesson = tmp_path / "99_interrupted.py"
    lesson.write_text("print('started', flush=True)\nraise KeyboardInterrupt\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tutorials" / "lesson.py"), str(lesson)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stdout == "started\n"
    assert proc.stderr.strip().splitlines() == [f"{lesson}: interrupted"]


def test_lessons_write_pictures_where_they_can(tmp_path, monkeypatch, capsys):
    """Where out/ cannot be written, the lessons' files go to a temporary folder, said in one line."""
    sys.path.insert(0, str(ROOT / "tutorials"))
    try:
        import lesson
    finally:
        sys.path.remove(str(ROOT / "tutorials"))
    monkeypatch.chdir(tmp_path)
    assert lesson.out_dir() == Path("out") and capsys.readouterr().out == ""
    (tmp_path / "out").rmdir()
    (tmp_path / "out").write_text("a file where the folder would be")  # out/ cannot be made, even as root
    where = lesson.out_dir()
    assert where.is_dir() and where != Path("out") and os.access(where, os.W_OK)
    assert capsys.readouterr().out.startswith("(out/ cannot be written here: files go to ")


def imported(path: Path) -> set:
    """The modules a Python file imports (by its import statements)."""
    import ast

    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_lessons_import_the_core_and_the_lesson_helper_not_the_tools(tmp_path):
    """Lessons import the library's core and tutorials/lesson.py (which may call the tools), never specdec_np.tools."""
    for path in TUTORIALS:
        tools = sorted(name for name in imported(path) if name.split(".")[:2] == ["specdec_np", "tools"])
        assert not tools, f"{path.name} imports {', '.join(tools)}: use tutorials/lesson.py"
    assert any("lesson" in imported(path) for path in TUTORIALS)
    wrong = tmp_path / "11_wrong.py"  # the check itself can fail
    wrong.write_text("from specdec_np.tools import trace\nimport specdec_np.tools.machine\n")
    assert {"specdec_np.tools", "specdec_np.tools.trace", "specdec_np.tools.machine"} <= imported(wrong)


def test_lessons_refuse_python_dash_o_and_run_under_dash_i(tmp_path, monkeypatch, capsys):
    """The lessons check themselves with asserts, which -O removes: the runner (make tutorials), a lesson run
    directly (where it imports lesson.py) and make notebooks (PYTHONOPTIMIZE reaches its kernel) refuse in one
    line. Negative control: without -O the same lesson's failing assert fails it. Under -I (the lesson's folder
    off sys.path) the runner still finds lesson.py. The scripts' --help survives -OO (no docstrings)."""
    runner = str(ROOT / "tutorials" / "lesson.py")
    lesson = tmp_path / "99_checks.py"
    lesson.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tutorials')!r})\nimport lesson\n"
                      "print('ran', lesson.MARKS)\nassert False, 'the check ran'\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}

    def python(*args, **extra):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                              env=env | extra)

    for args, extra in ((["-O", runner], {}), ([runner], {"PYTHONOPTIMIZE": "1"}), (["-O"], {})):
        r = python(*args, str(lesson), **extra)
        assert r.returncode in (1, 2) and r.stdout == "", r
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and "refused: python -O (or PYTHONOPTIMIZE) removes the asserts" in err[0], err
    r = python(runner, str(lesson))  # the negative control: the assert runs and fails
    assert r.returncode == 1 and "AssertionError: the check ran" in r.stderr
    isolated = tmp_path / "99_isolated.py"
    isolated.write_text("from lesson import MARKS\nprint('ran', MARKS)\n")
    r = python("-I", str(isolated))
    assert r.returncode == 1 and "No module named 'lesson'" in r.stderr  # why the runner is needed under -I
    r = python("-I", runner, str(isolated))
    assert r.returncode == 0 and r.stdout.startswith("ran "), r.stderr
    for script, line in (("tutorials/make_notebooks.py", "Build tutorials/notebooks/NN_name.ipynb from the lessons"),
                         ("weights/measure_memory.py", "Peak resident memory of `generate`")):
        r = python("-OO", str(ROOT / script), "--help", PYTHONPATH=str(ROOT))
        assert r.returncode == 0 and line in " ".join(r.stdout.split()), r
    monkeypatch.setenv("PYTHONOPTIMIZE", "1")
    assert make_notebooks().main([], load_check=lambda: "", register=lambda name: None) == 1
    assert capsys.readouterr().out.startswith("make_notebooks: refused: python -O (or PYTHONOPTIMIZE)")


NOTEBOOKS_CTRL_C = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import make_notebooks
if sys.argv[2] == "unhandled":  # the negative control: Python's own Ctrl-C handler
    make_notebooks.on_ctrl_c = signal.default_int_handler

def kernel_died_first(name):  # the kernel dies of the Ctrl-C first; the client swallows this process's own
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        pass
    print("Traceback (most recent call last):\\nzmq.error.ZMQError: Socket operation on non-socket", file=sys.stderr)
    raise RuntimeError("Kernel died")

sys.exit(make_notebooks.main([], load_check=lambda: "", register=kernel_died_first))
"""


def test_make_notebooks_interrupted_when_the_kernel_dies_first_is_one_line():
    """Ctrl-C reaches the kernel and make_notebooks together: when the kernel dies first and the client reports it
    (a ZMQ traceback, an error that is not a KeyboardInterrupt), make_notebooks still ends in one line, exit 130.
    Negative control: with Python's own Ctrl-C handler the same run ends in that traceback."""
    def run(how):
        return subprocess.run([sys.executable, "-c", NOTEBOOKS_CTRL_C, str(ROOT / "tutorials"), how],
                              capture_output=True, text=True, timeout=60)

    r = run("handled")
    assert r.returncode == 130 and r.stderr.splitlines() == [make_notebooks().INTERRUPTED], r
    r = run("unhandled")
    assert r.returncode == 1 and "ZMQError" in r.stderr and "RuntimeError: Kernel died" in r.stderr
