"""What the lessons use besides the library's core: timing a forward pass, saying when the machine was busy,
printing a measured figure so that a reader (and tests/docs/test_tutorials.py) can tell it from an exact
one, a folder to write pictures in, and the lines a lesson's run and its notebook must both print (compared by
tests/docs/test_tutorials.py and weights/adopt_pair.py). Not part of the package: it calls the tools
(specdec_np/tools/), so that timing has one home.

Run a lesson through it to stop it cleanly on Ctrl-C (`make tutorials` does):

    .venv/bin/python tutorials/lesson.py tutorials/02_kv_cache.py

It puts the lesson's folder on sys.path itself, so it also runs a lesson under `python -I` (isolated mode, which
leaves the script's folder off sys.path: a lesson run directly then cannot import this file). The lessons check
themselves with `assert`, which `python -O` removes: under -O (or PYTHONOPTIMIZE) it refuses, in one line, and a
lesson run directly stops where it imports this file.

The tests run the lessons with LESSON_QUICK_TIMING=1 (`timing_rounds`): every timed figure is measured once
instead of a median of several rounds; the code run and every line printed but the timed ones are the same.
"""

from __future__ import annotations

import html
import os
import re
import runpy
import sys
import tempfile
from pathlib import Path

OPTIMIZED = ("python -O (or PYTHONOPTIMIZE) removes the asserts that check each lesson, so it would pass without "
             "checking anything: run it without -O (e.g. env -u PYTHONOPTIMIZE make tutorials)")
if sys.flags.optimize and __name__ != "__main__":  # imported by a lesson run directly under -O
    sys.exit(f"{os.path.basename(sys.argv[0]) or 'lesson'}: refused: {OPTIMIZED}")


# ------------------------------------------------------------------ printing
TIMED, ROUNDING = "[timed]", "[rounding]"
MARKS = (TIMED, ROUNDING)  # the lines `deterministic` skips when a run is compared with its notebook


def print_timed(*args, sep: str = " ", end: str = "\n", mark: str = TIMED) -> None:
    """print(), each line marked "[timed]" (a figure measured by a clock on this machine, now) or `mark`."""
    print("\n".join(f"{mark} {line}" for line in sep.join(str(a) for a in args).split("\n")), end=end)


def print_rounding(*args, sep: str = " ", end: str = "\n") -> None:
    """print(), each line marked "[rounding]": a float32 rounding error, which varies with the BLAS."""
    print_timed(*args, sep=sep, end=end, mark=ROUNDING)


# ------------------------------------------------------------------ "Try this": an edit's effect shown, not a crash
EDITS: list[str] = []  # the "Try this" edits in effect in this run, as the lesson noticed them


def try_this(edit: str, applied) -> bool:
    """Whether the "Try this" edit `edit` is `applied` (the lesson compares a value with the one it ships), said
    once when it is. While an edit is in effect, `check` reports a failed check instead of stopping the lesson."""
    if applied and edit not in EDITS:
        EDITS.append(edit)
        print(f"Try this: {edit}")
    elif not applied and edit in EDITS:  # a notebook's cell run again with the edit undone
        EDITS.remove(edit)
    return bool(applied)


def check(ok, what: str) -> bool:
    """A lesson's check: silent when `ok`; otherwise an AssertionError saying `what`, or, while a "Try this" edit
    is in effect, one line saying which check the edit broke, and the lesson goes on to show the edit's effect.
    Whether it held."""
    if ok:
        return True
    if not EDITS:
        raise AssertionError(what)
    print(f"check failed under your edit ({'; '.join(EDITS)}): {what}")
    return False


# ------------------------------------------------------------------ a run's lines against its notebook's
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # a colour code
CHART = "wrote out/tutorial_"  # a chart's line, printed only where matplotlib (an optional extra) is installed


def deterministic(lines) -> list[str]:
    """The lines a lesson prints that depend on neither a clock nor the BLAS's rounding (print_timed and
    print_rounding mark the others) nor an optional extra (the charts' lines), without colour codes or trailing
    blanks: what any run of the lesson prints alike, and so what its notebook must hold."""
    return [ANSI.sub("", line).rstrip() for line in lines if not line.startswith(MARKS) and not line.startswith(CHART)]


def text(value) -> str:
    """A notebook's text field (a cell's source, an output's text): a string, or a list of lines."""
    return "".join(value) if isinstance(value, list) else value


def stdout_lines(cell: dict) -> list[str]:
    """The lines a notebook's code cell printed on standard output, its stream outputs joined first (a line may
    arrive in pieces)."""
    return "".join(text(o["text"]) for o in cell.get("outputs", [])
                   if o["output_type"] == "stream" and o["name"] == "stdout").splitlines()


def notebook_lines(nb: dict) -> list[str]:
    """The deterministic lines a lesson's notebook (its .ipynb JSON, parsed) printed, cell after cell, without the
    machine's line that tutorials/make_notebooks.py puts first: what `deterministic` keeps of the run that made it."""
    printed = [line for cell in nb["cells"] if cell["cell_type"] == "code" for line in stdout_lines(cell)]
    return deterministic(printed[1:])


# ------------------------------------------------------------------ timing
QUICK = os.environ.get("LESSON_QUICK_TIMING") == "1"  # set by the tests: the same run, each figure timed once


def timing_rounds(n: int) -> int:
    """n rounds of timing; 1 when the tests run the lesson (LESSON_QUICK_TIMING=1): they read its lines, not its
    times, and a timed figure comes out of the same code after one round as after n."""
    return 1 if QUICK else n


def one_blas_thread_if_busy() -> str:
    """On a busy machine, one BLAS thread from now on (its threads stall while another process holds a core);
    why, or "" when the machine is quiet."""
    from specdec_np.tools.machine import settle_threads

    return settle_threads()


def start_timing():
    """The CPU counters now: hand them to `say_if_busy` after the timed cells."""
    from specdec_np.tools.machine import cpu_times

    return cpu_times()


def was_busy(start) -> str:
    """How busy other processes kept the machine since `start_timing()`, in words ("" if quiet)."""
    from specdec_np.tools.machine import busy_since

    return busy_since(start)


def say_if_busy(start, contradicted: str = "", why: str = "") -> None:
    """A marked line under timed figures when others used the cores since `start` (or, on a quiet machine, when
    the figures `contradicted` what the lesson says, and `why`); nothing otherwise."""
    from specdec_np.tools.machine import timing_note

    if line := timing_note(start, contradicted, why):
        print_timed(line)


def pass_ms(model, ks, prefix_len: int, repeats: int = 7, runs: dict | None = None) -> dict:
    """{k: median ms of one forward pass of k new tokens after a cached prefix of `prefix_len` tokens}, the
    sizes timed in turns so that a burst of noise lands on all of them a little; each size's `repeats` timings
    (ms) put in `runs` when given (for `verdict`). `repeats` goes through `timing_rounds`."""
    import numpy as np

    from specdec_np.tools.costcurve import block_cost_ms

    kept = []

    def median(seconds):  # block_cost_ms's summary, called once per size in the order of `ks`
        kept.append([1000 * t for t in seconds])
        return np.median(seconds)

    ms = block_cost_ms(model, ks, prefix_len=prefix_len, repeats=timing_rounds(repeats), summary=median)
    if runs is not None:
        runs.update(zip(ms, kept))
    return ms


def median_ms(fn, repeats: int = 7, warmup: int = 2) -> float:
    """Median ms of `fn()` over `repeats` calls (through `timing_rounds`) after `warmup` calls."""
    from specdec_np.tools.costcurve import median_ms as median

    return median(fn, repeats=timing_rounds(repeats), warmup=warmup)


def with_slabs(model, rows: int):
    """`model` multiplying blocks of up to `rows` rows slab by slab (0: one x @ w each): same numbers, other speed."""
    from specdec_np.tools.costcurve import laid_out

    return laid_out(model, rows)


def row_by_row(model, rows: int):
    """`model` multiplying blocks of up to `rows` rows one matrix-vector product per row, larger ones by one x @ w."""
    from specdec_np.tools.costcurve import laid_out

    return laid_out(model, 0, gemv_rows=rows)


def fastest_layout(model):
    """`model` laid out as this machine's BLAS multiplies it fastest (the layouts timed as the tools do; lesson 10)."""
    from specdec_np.tools.costcurve import choose_gemv_rows, choose_slab_rows, laid_out

    model = with_slabs(model, choose_slab_rows(model, repeats=1) if QUICK else choose_slab_rows(model))
    return laid_out(model, gemv_rows=choose_gemv_rows(model, repeats=2) if QUICK else choose_gemv_rows(model))


def demo_prompt() -> str:
    """The prompt `make demo` decodes (specdec_np/tools/demo.py): a docstring and a doctest, which stage 2 guesses
    well."""
    from specdec_np.tools.demo import PROMPT

    return PROMPT


def blas_name() -> str:
    """The BLAS library, its kernel and threads, in words."""
    from specdec_np.tools.machine import blas_name as name

    return name()


def last_level_cache() -> str:
    """The CPU's largest cache in words, e.g. "32 MB" ("" if unknown)."""
    from specdec_np.tools.machine import last_level_cache as llc

    return llc()


def memory_gbps() -> tuple[float, float]:
    """(GB/s) one large matrix-vector product streams its matrix: out of memory, and out of the last-level cache."""
    from specdec_np.tools.costcurve import streaming_gbps

    return streaming_gbps(repeats=1) if QUICK else streaming_gbps()


# ------------------------------------------------------------------ verdicts on timed figures
def verdict(samples, threshold: float, above: str, below: str, unit: str = "") -> str:
    """A verdict on repeated measurements `samples` of one figure against `threshold`: their median and range, then
    `above` when the whole range lies above the threshold, `below` when it lies below, and "within noise" when it
    straddles it (another repeat could fall on either side: no verdict)."""
    lo, mid, hi = min(samples), float(sorted(samples)[len(samples) // 2]), max(samples)
    said = (above if lo > threshold else below if hi < threshold else
            f"within noise: the range straddles {threshold:g}{unit}")
    return f"{mid:.2f}{unit} (range {lo:.2f} to {hi:.2f} over {len(samples)} runs): {said}"


def bends(costs: dict, slack: float = 0.03) -> str:
    """"" when the cost curve {rows: ms} of a pass does not fall as the rows grow (a dip of under `slack`, a few
    percent, is timing noise); otherwise one line naming where a pass of more rows was measured cheaper than one of
    fewer, and the likely causes. Such a curve is not a price list: a lesson says so on the spot rather than price
    a pass from it."""
    from specdec_np.tools.costcurve import bends as bent  # the neighbouring sizes where more rows cost less

    down = bent(costs, slack)
    if not down:
        return ""
    where = "; ".join(f"{b} rows {costs[b]:.2f} ms < {a} rows {costs[a]:.2f} ms" for a, b in down)
    one = " (a 1-row product goes to a matrix-vector routine: another path)" if down[0][0] == 1 else ""
    return (f"not monotone here: {where}. Likely causes: the BLAS's kernel for that row count{one}, its threads "
            "waiting for each other, or a busy machine; read the ratios at these sizes as this run measured them, "
            "not as a cost model")


# ------------------------------------------------------------------ files
def out_dir() -> Path:
    """out/ under the working directory where it can be written, else a temporary folder (said in one line)."""
    out = Path("out")
    try:
        out.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            return out
    except OSError:
        tmp = Path(tempfile.gettempdir()) / "specdec_np_tutorials"
        tmp.mkdir(exist_ok=True)
        print(f"(out/ cannot be written here: files go to {tmp})")
        return tmp


def show_trace(run, enc, prompt, method: str, about: str, name: str) -> Path:
    """Write the trace page of `run` (decoded with keep_trees=True) as <out_dir>/name; in a notebook, show it."""
    from specdec_np.tools import trace

    path = out_dir() / name
    trace.write(path, run, enc, prompt, method, about)
    print(f"wrote {path}: open it in a browser")
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # optional: only a notebook has it
        return path
    if type(get_ipython()).__name__ == "ZMQInteractiveShell":  # a notebook: the page embedded, saved with it
        page = html.escape(path.read_text(encoding="utf-8"), quote=True)
        # Raw HTML, not IPython's HTML(): that one warns about an <iframe> (on stderr, with IPython's path).
        display({"text/html": f'<iframe srcdoc="{page}" style="width: 100%; height: 720px; border: 0"></iframe>'},
                raw=True)
    return path


# ------------------------------------------------------------------ running a lesson
def main(argv=None) -> int:
    """Run one lesson file as `python LESSON` would; Ctrl-C ends it with one line and exit status 130."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not argv[0].endswith(".py") or not os.path.isfile(argv[0]):
        print("usage: python tutorials/lesson.py tutorials/NN_name.py")
        return 2
    if sys.flags.optimize:
        print(f"{argv[0]}: refused: {OPTIMIZED}", file=sys.stderr)
        return 2
    sys.argv = argv[:]
    sys.path[:0] = [str(Path(argv[0]).resolve().parent), str(Path(__file__).resolve().parent)]  # also under -I
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except KeyboardInterrupt:
        print(f"\n{argv[0]}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
