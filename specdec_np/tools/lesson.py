"""Helpers the lessons (tutorials/) print through, so a notebook of a lesson can be checked.

`print_timed` marks every line whose figures come from a clock (or from a choice made on measured
figures), `print_rounding` every line that shows a float32 rounding error (it depends on the BLAS
kernel and its threads): those differ from run to run or machine to machine, while every other
line a lesson prints is deterministic. tests/docs/test_tutorials.py compares a lesson's notebook with the suite's own
run of the lesson line by line, skipping the marked ones. `show_page` shows an HTML page (the
trace) inline when the lesson runs in a Jupyter kernel, and prints where it is otherwise.
"""

from __future__ import annotations

import html
from pathlib import Path

TIMED = "[timed]"  # the prefix of every line printed by `print_timed`
ROUNDING = "[rounding]"  # the prefix of every line printed by `print_rounding`
MARKS = (TIMED, ROUNDING)


def marked(mark: str, args, sep: str, end: str) -> None:
    text = sep.join(str(a) for a in args)
    print("\n".join(f"{mark} {line}" for line in text.split("\n")), end=end)


def print_timed(*args, sep: str = " ", end: str = "\n") -> None:
    """print(), with every line marked as TIMED: a figure measured on this machine, now."""
    marked(TIMED, args, sep, end)


def print_rounding(*args, sep: str = " ", end: str = "\n") -> None:
    """print(), with every line marked as ROUNDING: a float32 rounding error of this BLAS."""
    marked(ROUNDING, args, sep, end)


def in_notebook() -> bool:
    """Whether this runs in an IPython kernel (a notebook), where HTML can be shown inline."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show_page(path, height: int = 720) -> None:
    """Print where the page at `path` is; in a notebook also show it inline (embedded, so the saved
    notebook shows it without the file)."""
    print(f"wrote {path}: open it in a browser")
    if in_notebook():
        from IPython.display import HTML, display

        page = html.escape(Path(path).read_text(encoding="utf-8"), quote=True)
        display(HTML(f'<iframe srcdoc="{page}" style="width: 100%; height: {height}px; border: 0"></iframe>'))
