"""This machine: what it is (CPU, cache, cores, BLAS kernel and threads; costs are keyed by `machine()`) and how busy
other processes keep it, from /proc/stat: timings taken while they use the CPU are slow and noisy (OpenBLAS's threads
stall while another process holds a core; on a busy machine the tools use one). Checked once per process before
measuring (`load`), and around what is timed (`busy_since`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import resource
import time
from pathlib import Path

import numpy as np  # loads NumPy's BLAS, so that threadpoolctl finds it
from threadpoolctl import threadpool_info, threadpool_limits

from .. import checkpoint

BUSY_CORES = 0.25  # others using this much: timings are noisy (nothing measured is kept), BLAS gets one thread
MIN_WINDOW = 0.2  # seconds: /proc/stat counts in ticks of 10 ms, so a shorter window says nothing


def blas() -> dict:
    """{"library", "version", "kernel", "threads"} of the BLAS NumPy uses ("unknown" where unknown)."""
    info = next((i for i in threadpool_info() if i.get("user_api") == "blas"), {})
    return {"library": info.get("internal_api", "unknown"), "version": info.get("version") or "unknown",
            "kernel": info.get("architecture") or "unknown", "threads": info.get("num_threads", 0)}


def blas_name() -> str:
    """The BLAS in words, e.g. "openblas 0.3.31, SkylakeX kernel, 2 threads"."""
    b = blas()
    return f"{b['library']} {b['version']}, {b['kernel']} kernel, {b['threads']} thread{'s' * (b['threads'] != 1)}"


def use_threads(n: int) -> None:
    """Limit NumPy's BLAS to `n` threads for the rest of the process."""
    threadpool_limits(limits=n, user_api="blas")


def last_level_cache_bytes() -> int | None:
    """The size of the CPU's largest cache in bytes, as Linux reports it (None if unknown)."""
    kib = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            text = (index / "size").read_text().strip()  # e.g. "32768K"
            kib.append(int(text.rstrip("KMG")) * {"K": 1, "M": 1024, "G": 1 << 20}.get(text[-1], 1))
    return max(kib) * 1024 if kib else None


def last_level_cache() -> str:
    """The size of the CPU's largest cache in words, e.g. "32 MB" ("" if unknown)."""
    size = last_level_cache_bytes() or 0
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB" if size else ""


@functools.cache
def own_threads() -> int:
    """The BLAS threads the process started with (`settle_threads` may lower them): costs are measured with these."""
    return blas()["threads"]


def machine() -> dict:
    """What a cost measurement depends on besides the models: CPU, cache, cores, BLAS (with its starting threads)."""
    info = {}  # the first processor's "model name", "cpu family" and "model" lines
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = info.get("model name", "")
    if cpu and "cpu family" in info and "model" in info:  # a virtual machine's "AMD EPYC" names Zen 2 to Zen 5 alike
        cpu += f" (family {info['cpu family']}, model {info['model']})"
    return {"cpu": cpu or platform.processor() or platform.machine(), "llc": last_level_cache(),
            "cpus": os.cpu_count(), "blas": blas() | {"threads": own_threads()}, "numpy": np.__version__}


def machine_name() -> str:
    """The machine kind in words: CPU model, last-level cache, cores, BLAS kernel."""
    m = machine()
    return f"{m['cpu']}, {m['llc'] or 'unknown'} last-level cache, {m['cpus']} cores, {m['blas']['kernel']} BLAS kernel"


def cpu_times() -> tuple | None:
    """(CPU seconds all processes used, this process's, wall clock); None without /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(x) for x in f.readline().split()[1:8]]  # user nice system idle iowait irq softirq
    except (OSError, ValueError):
        return None
    own, busy = os.times(), sum(ticks) - ticks[3] - ticks[4]  # not idle, iowait nor steal (a VM always loses some)
    return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()


def others_since(start: tuple | None, end: tuple | None = None, min_window: float = MIN_WINDOW) -> float | None:
    """Cores' worth of CPU others used between two `cpu_times()` (`end`: now); None if unknown or < `min_window` s."""
    end = cpu_times() if end is None else end
    if start is None or end is None or end[2] - start[2] <= 0 or end[2] - start[2] < min_window:
        return None
    return ((end[0] - start[0]) - (end[1] - start[1])) / (end[2] - start[2])


def others_now(seconds: float = 0.1) -> float | None:
    """Cores' worth of CPU other processes use, measured over `seconds` (None without /proc/stat)."""
    start = cpu_times()
    if start is not None:
        time.sleep(seconds)
    return others_since(start, min_window=0.0)


load = functools.lru_cache(maxsize=1)(others_now)  # the load check, made once per process before measuring


def busy(seconds: float | None = None) -> str:
    """Other processes' share of the cores in words if BUSY_CORES or more (""): the load check's, or over `seconds`."""
    others = load() if seconds is None else others_now(seconds)
    return f"other processes use {others:.1f} of its {os.cpu_count()} cores" if (others or 0) >= BUSY_CORES else ""


def settle_threads() -> str:
    """On a busy machine (`busy`), one BLAS thread for the rest of the process, and why ("" if quiet or already so)."""
    own_threads()  # noted before it changes
    if not (why := busy()) or blas()["threads"] == 1:
        return ""
    use_threads(1)
    return why


def busy_since(start: tuple | None) -> str:
    """How busy others kept the machine since `start` in words ("" if quiet; without /proc/stat, the load average)."""
    cores = os.cpu_count() or 1
    if start is not None and (end := cpu_times()) is not None:
        others = others_since(start, end) or 0.0
        return f"other processes used {others:.1f} of its {cores} cores" if others > BUSY_CORES else ""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ""
    return f"load {load:.1f} on {cores} cores" if load > cores else ""


def timing_note(start: tuple | None, contradicted: str = "", why: str = "") -> str:
    """The line under figures timed since `start`: the machine was busy, else `contradicted`: `why` ("" if quiet)."""
    if busy := busy_since(start):
        return (f"note: this machine was busy while timing the figures above ({busy})"
                f"{': ' + contradicted if contradicted else ''}; rerun when it is idle")
    return f"note: {contradicted}: {why}" if contradicted else ""


def load_model(path, dtype=np.float32):
    """A model by name or directory, refused before it is allocated if it needs more memory than is free here."""
    return checkpoint.load(path, dtype, check=check_memory)


def check_memory(file, config, itemsize: int) -> None:
    """`checkpoint.load`'s check before allocating: a CheckpointError if the parameters need more than is available."""
    need = itemsize * config.n_params
    if need > (have := available_memory()):
        raise checkpoint.CheckpointError(f"{file}: the model (n_embd={config.n_embd}, n_layer={config.n_layer}) "
                                         f"needs {need / 1e9:.1f} GB for its parameters, more than the "
                                         f"{have / 1e9:.1f} GB of memory available")


def available_memory() -> float:
    """Bytes of memory this process may allocate as far as Linux says: MemAvailable or `ulimit -v` (inf if unknown)."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit = math.inf if limit == resource.RLIM_INFINITY else limit
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            return min(limit, next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")))
    except (OSError, StopIteration, ValueError):
        return limit
