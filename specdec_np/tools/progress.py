"""The tools' one progress indicator on stderr: `show = Progress(label); show(done, total)` redraws one line on a
terminal (a bar, the counts, the time left); elsewhere (a log, CI) it writes a line when it starts and one at the end.
"""

from __future__ import annotations

import sys
import time


class Progress:
    """progress(done, total, note="") for one task; `unit` formats a count; `tty`: whether stderr is a terminal."""

    def __init__(self, label: str, unit=str, tty: bool | None = None):
        self.label, self.unit = label, unit
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.t0, self.drawn, self.done, self.started, self.ended = time.monotonic(), 0.0, 0, False, False

    def __call__(self, done, total=None, note: str = "") -> None:
        now, self.done = time.monotonic(), done
        if self.tty and (now - self.drawn > 0.1 or done == total):
            self.drawn = now
            counts = f"{self.unit(done)}/{self.unit(total)}" if total else self.unit(done)
            frac = done / total if total else 0.0
            left = f" {(now - self.t0) / frac * (1 - frac):4.0f} s left" if 0 < frac < 1 else ""
            sys.stderr.write(f"\r{self.label} [{'#' * int(30 * frac):<30}] {counts}{left} {note}".rstrip() + "   ")
        elif not self.tty and not self.started:
            sys.stderr.write(f"{self.label} ...\n")
        self.started = True
        sys.stderr.flush()
        if total and done >= total:
            self.end()

    def end(self) -> None:
        """The closing line: what was done, and in how long (once)."""
        if not self.ended:
            self.ended = True
            sys.stderr.write(("\r" if self.tty else "") + f"{self.label}: done, {self.unit(self.done)} in "
                             f"{time.monotonic() - self.t0:.1f} s" + " " * 30 * self.tty + "\n")
            sys.stderr.flush()
