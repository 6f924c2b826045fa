"""bench with or without blocks multiplied row by row (`Layout.gemv_rows`), from an empty cost cache, so that each run
measures its own layout, curves and plans (docs/results.md, "The BLAS kernel and the cost of a block"):

    python weights/layout_ab.py without [bench options]   # the tools never choose row by row (gemv_rows 1)
    python weights/layout_ab.py with [bench options]      # the tools' own choice
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import specdec_np.tools.calibration as calibration  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("with", "without"):
        raise SystemExit(__doc__)
    if sys.argv[1] == "without":
        calibration.choose_gemv_rows = lambda model: 1
    with tempfile.TemporaryDirectory(prefix="layout-ab-") as cache:
        os.environ["XDG_CACHE_HOME"] = cache  # an empty cost cache, deleted afterwards
        sys.argv = ["specdec_np", "bench", *sys.argv[2:]]
        runpy.run_module("specdec_np", run_name="__main__")
