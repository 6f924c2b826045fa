"""What a prompt's prefill costs against what the cost model prices it at (docs/performance.md, "Prefills"):

    python weights/prefill_price.py [--sizes 64 150 300] [--rounds 6]

The embedded target laid out as this machine's cached costs say, one forward pass over N new tokens into an empty
cache, warm (after one of its own) and cold (after a draft pass over the same tokens), medians of --rounds in turns;
beside them the cost model's price (`costmodel.pass_ms`, past the curve's largest size) and the cold curve's own
slope continued (`costmodel.interp` on it), which bench's predicted column used before.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np.gpt2 import forward, new_cache  # noqa: E402
from specdec_np.models import load_embedded  # noqa: E402
from specdec_np.tools.acceptance import calibration_prompts  # noqa: E402
from specdec_np.tools.calibration import calibration  # noqa: E402
from specdec_np.tools.costcurve import apply_layout  # noqa: E402
from specdec_np.tools.costmodel import interp, machine_layout, pass_ms  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 150, 300], help="prefill lengths")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, each state in turn (default: %(default)s)")
    a = ap.parse_args()
    target, draft, ngram, enc = load_embedded()
    costs, _ = calibration(target, draft, ngram, calibration_prompts(enc))
    target, draft = apply_layout(machine_layout(costs), target, draft)
    curves, rng = costs["curves"], np.random.default_rng(0)
    print(f"{machine_name()}; the cost curve's largest size: {max(int(k) for k in curves['target']['warm'])}")
    for n in a.sizes:
        tokens, ms = rng.integers(0, target.config.n_vocab, n), {"warm": [], "cold": []}
        for _ in range(a.rounds):
            for state in ms:
                before = draft if state == "cold" else target
                forward(before, tokens, new_cache(before, n + 1))
                t0 = time.perf_counter()
                forward(target, tokens, new_cache(target, n + 1))
                ms[state].append((time.perf_counter() - t0) * 1e3)
        run = {state: float(np.median(v)) for state, v in ms.items()}
        print(f"{n} tokens: ran warm {run['warm']:.1f} ms, cold {run['cold']:.1f}; priced warm "
              f"{pass_ms(curves, 'target', 'warm', n):.1f}, cold {pass_ms(curves, 'target', 'cold', n):.1f} "
              f"(cold's slope continued: {interp(curves['target']['cold'], n):.1f})")


if __name__ == "__main__":
    main()
