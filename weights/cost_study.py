"""Two studies of what a pass costs on this CPU, beside `make bench ARGS=--curves` (the embedded pair's curves):

    python weights/cost_study.py --matrices      # µs per product of 1-16 rows by each weight matrix of the
                                                 # embedded pair and GPT-2: one x @ w against column slabs
    python weights/cost_study.py --gpt2-shapes   # passes of GPT-2 small, medium and large shapes (random weights)

The first is why the tools lay out weights in column slabs on some machines (docs/performance.md); the second
how far a real GPT-2's pass is from streaming its weights at this machine's memory speed (docs/results.md).
Each matrix is read from memory (copies cycled past the last-level cache); GPT-2's passes follow a 128-token
prefix, the sizes timed round-robin, medians of 5 rounds. The BLAS uses the threads it starts with.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np.fastpath import Weight  # noqa: E402
from specdec_np.gpt2 import GPT2_SHAPES, random_params  # noqa: E402
from specdec_np.models import load_embedded  # noqa: E402
from specdec_np.tools.machine import blas_name  # noqa: E402
from specdec_np.tools.costcurve import block_cost_ms, median_ms, streaming_gbps  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402


def gpt2_shapes_report(names=("gpt2", "gpt2-medium", "gpt2-large"), block_sizes=(1, 2, 4, 8, 16, 32)) -> None:
    """Print ms per decode step / verification block for GPT-2 shapes with random weights, and GB/s."""
    ref, cached = streaming_gbps()
    print(f"reference: a float32 matrix-vector product streams {ref:.1f} GB/s from memory "
          f"({cached:.1f} GB/s from the last-level cache)")
    print(f"{'model':<12} {'params':>8} " + " ".join(f"{f'{k} tok ms':>10}" for k in block_sizes)
          + f" {'GB/s @1':>8} {'vs ref':>7}")
    for name in names:
        model = random_params(GPT2_SHAPES[name], seed=0, dtype=np.float32)
        ms = block_cost_ms(model, block_sizes, repeats=5)
        gbps = model.weight_bytes / (ms[block_sizes[0]] / 1000) / 1e9
        print(f"{name:<12} {model.n_params / 1e6:>7.0f}M " + " ".join(f"{ms[k]:>10.2f}" for k in block_sizes)
              + f" {gbps:>8.1f} {gbps / ref:>6.0%}")
        del model


def matrix_report(models: dict, rows=(1, 2, 4, 8, 16), stream_mb: int = 96) -> None:
    """Print µs per product of k rows by each distinct weight matrix of `models` ({name: GPT2}), one x @ w and from
    column slabs (`fastpath.Weight`), read from memory (`stream_mb` MB of copies cycled)."""
    print(f"{'matrix':<22} " + " ".join(f"{f'k={k} x@w':>9} {'slabs':>6}" for k in rows))
    for name, model in models.items():
        block = model.params["blocks"][0]
        shapes = {block["attn"]["c_attn"]["w"].shape, block["attn"]["c_proj"]["w"].shape,
                  block["mlp"]["c_fc"]["w"].shape, block["mlp"]["c_proj"]["w"].shape, model.params["wte"].T.shape}
        rng = np.random.default_rng(0)
        for n_in, n_out in sorted(shapes):
            copies = max(2, stream_mb * 2**20 // (4 * n_in * n_out))
            weights = [Weight.of(rng.standard_normal((n_in, n_out), dtype=np.float32), slab_min=0)
                       for _ in range(copies)]
            plain = [Weight(w.w, None, 0) for w in weights]
            times = {"x @ w": {}, "slabs": {}}
            for k in rows:
                x = rng.standard_normal((k, n_in), dtype=np.float32)
                for layout, ws in (("x @ w", plain), ("slabs", weights)):
                    cycle = itertools.cycle(ws)  # each product reads a copy the others pushed out of the cache
                    times[layout][k] = 1000 * median_ms(lambda: x @ next(cycle), 2 * copies, warmup=copies)
            key = f"{name} {n_in}x{n_out}"
            print(f"{key:<22} " + " ".join(f"{times['x @ w'][k]:>9.0f} {times['slabs'][k]:>6.0f}" for k in rows))
            del weights, plain


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matrices", action="store_true", help="each weight matrix's µs per product of k rows")
    ap.add_argument("--gpt2-shapes", action="store_true", help="the passes of GPT-2's shapes (random weights)")
    a = ap.parse_args(argv)
    if not (a.matrices or a.gpt2_shapes):
        ap.error("choose --matrices, --gpt2-shapes or both")
    print(f"machine: {machine_name()}; BLAS: {blas_name()}")
    if a.matrices:
        target, draft, _, _ = load_embedded()
        print("\nµs per product by k rows, one x @ w against column slabs (weights from memory):")
        matrix_report({"target": target, "draft": draft, "gpt2": random_params(GPT2_SHAPES["gpt2"], seed=0)})
    if a.gpt2_shapes:
        gpt2_shapes_report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
