"""This machine: what it is (CPU, cache, cores, BLAS) and how busy other processes keep it.

Costs measured on a CPU hold for that CPU, so they are keyed by `machine()`. Timings taken while
other processes use the CPU are slow and noisy (and OpenBLAS's threads stall while another process
holds a core), so the tools measure the others' share of the cores from /proc/stat around what
they time (`cpu_times`, `others_since`), say so under timed figures (`timing_note`, `note`), keep
no costs measured while busy (`busy_warning`) and give BLAS one thread on a busy machine
(`settle_threads`). The lessons time things too and import their note from here, and print what
varies from run to run through `print_timed` (a clock's figures) and `print_rounding` (a float32
rounding error, which depends on the BLAS kernel): tests/docs/test_tutorials.py compares a lesson's
notebook with the suite's run of it line by line, skipping the lines they mark.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import numpy as np

from .blas import blas, use_threads
from .costcurve import last_level_cache

TIMED, ROUNDING = "[timed]", "[rounding]"  # the marks of `print_timed`'s and `print_rounding`'s lines
MARKS = (TIMED, ROUNDING)
BUSY_CORES = 0.25  # other processes using more CPU than this while costs are measured: not cached
MIN_WINDOW = 0.2  # seconds: a shorter window says nothing about the load


@functools.lru_cache(maxsize=1)
def cpu() -> dict:
    """CPU model, last-level cache and cores."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "llc": last_level_cache(),
            "cpus": os.cpu_count()}


def machine() -> dict:
    """What a cost measurement depends on besides the models: CPU model and cache, cores, and the
    BLAS library, kernel and threads in use now."""
    return cpu() | {"blas": blas(), "numpy": np.__version__}


def machine_name() -> str:
    """The machine kind in words: CPU model, last-level cache, cores, BLAS kernel."""
    m = machine()
    return f"{m['cpu']}, {m['llc'] or 'unknown'} last-level cache, {m['cpus']} cores, {m['blas']['kernel']} BLAS kernel"


def cpu_times() -> tuple | None:
    """(CPU seconds all processes have used, this process's, wall clock): a snapshot for
    `busy_warning`; None where the system's total is unknown (no /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    except (OSError, ValueError):
        return None
    own = os.times()
    # Not "steal" (a hypervisor's other guests): a VM that always loses some time to them would never
    # keep its costs, and only this system's processes come and go between runs.
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()


def others_since(start: tuple | None, end: tuple | None = None, min_window: float = MIN_WINDOW) -> float | None:
    """Cores' worth of CPU other processes used between two `cpu_times()` snapshots (`end`: now);
    None where either is unknown or the window is shorter than `min_window` seconds (/proc/stat
    counts in ticks of 10 ms, so a shorter window says nothing about the load)."""
    end = cpu_times() if end is None else end
    if start is None or end is None or end[2] - start[2] <= 0 or end[2] - start[2] < min_window:
        return None
    return ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2])


def busy_now(seconds: float = 0.1) -> str:
    """Which share of the cores other processes use, measured over `seconds`, in words when it is
    more than BUSY_CORES ("" when the machine is quiet or /proc/stat is unknown)."""
    start = cpu_times()
    if start is None:
        return ""
    time.sleep(seconds)
    others = others_since(start, min_window=0.0)
    busy = others is not None and others > BUSY_CORES
    return f"other processes use {others:.1f} of its {os.cpu_count()} cores" if busy else ""


_settled: str | None = None  # settle_threads' verdict: it looks once per process


def settle_threads() -> str:
    """On a busy machine, limit NumPy's BLAS to one thread for the rest of the process (OpenBLAS's
    threads stall while another process holds a core) and say why; "" on a quiet one. The
    machine is looked at once per process (a tenth of a second); later calls repeat the verdict."""
    global _settled
    if _settled is None:
        _settled = busy_now()
        if _settled:
            use_threads(1)
    return _settled


def busy_warning(start: tuple | None) -> str:
    """A warning when other processes used the CPU since `start` (`cpu_times()`): OpenBLAS's
    threads then stall and the timings are slow and noisy ("" when the machine was quiet). Without
    /proc/stat: when the load average exceeds the cores, or "" if that is unknown too."""
    cores = os.cpu_count() or 1
    end = cpu_times()
    if start is not None and end is not None:
        others = others_since(start, end)
        if others is None or others <= BUSY_CORES:  # quiet, or a window too short to tell
            return ""
        what = f"other processes used {others:.1f} of its {cores} cores"
    else:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            return ""
        if load <= cores:
            return ""
        what = f"load {load:.1f} on {cores} cores"
    return (f"note: this machine was busy while its costs were measured ({what}), so this run's plan may be off; "
            "they are not cached: the next run measures again")


def timing_note(start: tuple | None, contradicted: str = "", why: str = "") -> str:
    """The line to print after figures timed since `start` (a `cpu_times()` snapshot), "" on a
    quiet machine where every claim held: when other processes took CPU meanwhile, any figure may
    be off, so say that (naming what `contradicted`, if anything); else, if a figure contradicted a
    claim, say which and `why`. Lessons and the demo print it under what they timed."""
    others = others_since(start)
    if others is not None and others > BUSY_CORES:
        return (f"note: this machine was busy while timing the figures above (other processes used {others:.1f} "
                f"of its {os.cpu_count()} cores){': ' + contradicted if contradicted else ''}; rerun when it is idle")
    return f"note: {contradicted}: {why}" if contradicted else ""


def note(start: tuple | None, contradicted: str = "", why: str = "") -> None:
    """Print `timing_note`'s line under figures timed since `start`, or nothing on a quiet machine
    where every claim held: what lessons print after each timed section."""
    if line := timing_note(start, contradicted, why):
        print_timed(line)  # marked: tests/docs/test_tutorials.py compares a lesson's other lines with its notebook


def print_timed(*args, sep: str = " ", end: str = "\n") -> None:
    """print(), every line marked TIMED: a figure measured on this machine, now."""
    marked(TIMED, args, sep, end)


def print_rounding(*args, sep: str = " ", end: str = "\n") -> None:
    """print(), every line marked ROUNDING: a float32 rounding error of this BLAS."""
    marked(ROUNDING, args, sep, end)


def marked(mark: str, args, sep: str, end: str) -> None:
    print("\n".join(f"{mark} {line}" for line in sep.join(str(a) for a in args).split("\n")), end=end)
