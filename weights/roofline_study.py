"""How steady the roofline's share is (docs/performance.md, "The roofline"): plain decoding's one-token pass against
NumPy's read rate of as many bytes, measured again and again.

    python weights/roofline_study.py [--trials 8]

Each trial times the embedded target's one-token pass (this machine's layout, after a 200-token prefix) and the
read-rate probe (`costcurve.read_gbps`, as the costs measure it) two ways: one after the other (the pass alone for
15 rounds, then the probe), and interleaved (pass, probe's sum, probe's product, in the same 15 rounds, each timed
just after an untimed run of itself, its steady state); each prints the pass's ms, the probe's GB/s and the share
(the pass's rate over the probe's).
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np import models  # noqa: E402
from specdec_np.tools.acceptance import calibration_prompts  # noqa: E402
from specdec_np.tools.calibration import calibration  # noqa: E402
from specdec_np.tools.costcurve import apply_layout, primed, read_gbps, round_robin, timed_pass  # noqa: E402
from specdec_np.tools.costmodel import machine_layout  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=8)
    trials = ap.parse_args().trials
    target, draft, ngram, enc = models.load_embedded()
    costs, _ = calibration(target, draft, ngram, calibration_prompts(enc))
    target, _ = apply_layout(machine_layout(costs), target, None)
    cache, nbytes = primed(target, 200, 1), target.weight_bytes
    a = np.ones(nbytes // 4 >> 10 << 10, dtype=np.float32)
    w, x = a.reshape(1 << 10, -1), np.ones(1 << 10, dtype=np.float32)  # read_gbps's probes
    steady = {"pass": lambda: timed_pass(target, cache, 1),
              "sum": lambda: timeit.timeit(lambda: np.add.reduce(a), number=1),
              "gemv": lambda: timeit.timeit(lambda: x @ w, number=1)}
    steady = {key: lambda fn=fn: (fn(), fn())[1] for key, fn in steady.items()}
    print(f"{machine_name()}; the target's {nbytes / 1e6:.1f} MB; ms, GB/s, share of the probe")
    for _ in range(trials):
        alone = round_robin({"pass": lambda: timed_pass(target, cache, 1)}, 15)["pass"], read_gbps(nbytes)
        ms = round_robin(steady, 15)
        both = ms["pass"], a.nbytes / (min(ms["sum"], ms["gemv"]) / 1000) / 1e9
        print(" | ".join(f"{how}: pass {p:.2f} ms, probe {g:.1f} GB/s, share {nbytes / p / 1e6 / g:.0%}"
                         for how, (p, g) in (("one after the other", alone), ("interleaved", both))))


if __name__ == "__main__":
    main()
