"""How the fitted overheads move between repeated calibrations: least squares over every timed step, against
`costmodel.fit_overheads`, which leaves out the steps a busy host stopped (docs/performance.md).

    python weights/overhead_study.py [REPEATS]     # default 3; run with the BLAS variables as bench runs

Each repeat measures the embedded pair's cost curves, then both settings' timed steps (`calibration.timed_steps`, three
short prompts x 32 tokens) and fits the per-step, per-drafting-step and per-distribution overheads both ways, printing
them with the residuals' quantiles (ms).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import models  # noqa: E402
from specdec_np.tools import acceptance  # noqa: E402
from specdec_np.tools.calibration import ngram_query_ms, timed_steps  # noqa: E402
from specdec_np.tools.costcurve import apply_layout, loop_curves  # noqa: E402
from specdec_np.tools.costmodel import fit_overheads, nonnegative_fit, pads, step_terms  # noqa: E402

PROMPTS = ["def fib(n):\n    ", "import os\n\ndef walk(path):\n", "class Stack:\n    def __init__(self):\n"]


def main(repeats: int) -> None:
    target, draft, ngram, enc = models.load_embedded()
    prompts = [enc.encode(p) for p in PROMPTS]
    for rep in range(repeats):
        curves = loop_curves(target, draft)
        pad = pads(curves)
        t, d = apply_layout(pad, target, draft)
        query = ngram_query_ms(ngram, prompts[0])
        for setting, kw in acceptance.SETTINGS.items():
            steps, _ = timed_steps(t, d, ngram, prompts, kw, 32, lambda: None)
            trimmed = fit_overheads(steps, curves, query, pad["draft_pad"])
            features, y = step_terms(steps, curves, query, pad["draft_pad"])
            every = nonnegative_fit(features, y)
            r = y - features @ every
            print(f"repeat {rep} {setting} ({len(steps)} steps): step/draft_step/draft_dist ms, every step "
                  f"{every[0]:.3f}/{every[1]:.3f}/{every[2]:.3f}, fit_overheads {trimmed['step']:.3f}/"
                  f"{trimmed['draft_step']:.3f}/{trimmed['draft_dist']:.3f}; residuals p50 {np.median(r):.3f} "
                  f"p90 {np.quantile(r, 0.9):.3f} p99 {np.quantile(r, 0.99):.3f} max {r.max():.3f}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
