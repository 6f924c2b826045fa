"""The BLAS library NumPy calls, as the tools report and set it (threadpoolctl): a forward pass's cost
depends on its kernel (OpenBLAS picks one per CPU; OPENBLAS_CORETYPE overrides it) and its threads (they
stall when another process holds a core): measurements name them, costs are keyed by them, and on a busy
machine the tools use one thread.
"""

from __future__ import annotations

import numpy as np  # noqa: F401  (loads NumPy's BLAS, so that threadpoolctl finds it)
from threadpoolctl import threadpool_info, threadpool_limits


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
