"""What one row, and a few, cost the embedded target, each way (docs/performance.md, "One token", "A few rows"):

    python weights/one_row_study.py [--rounds 100]

1. Products of one row by the target's matrices (its 32 layer matrices in turn, then the head, as a pass reads
   them: streamed from memory where the last-level cache is smaller than 70 MB): one matrix-vector product over
   w, over a copy of w.T, slab by slab, np.einsum; and 2 rows by slabs, by one x @ w and row by row.
2. Whole passes after a 200-token prefix: 1 token with each `Layout.one_row` and padded to 2 rows (`Layout.padding`);
   2, 3, 4, 6 and 8 tokens by one x @ w per matrix, row by row (`Layout.gemv_rows`) and slab by slab.
3. How fast NumPy reads a float32 array of the target's weight bytes: np.add.reduce, a matrix-vector product.
Each with 1 and 2 BLAS threads, all ways interleaved round by round; medians of the wall time and of the main
thread's CPU time (`time.thread_time`: a process descheduled by others does not accrue it), and the range.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_np.fastpath import ONE_ROW, laid_out, unslab  # noqa: E402
from specdec_np.gpt2 import forward  # noqa: E402
from specdec_np.models import load_model  # noqa: E402
from specdec_np.tools.costcurve import primed  # noqa: E402
from specdec_np.tools.machine import machine_name  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(wall ms, main thread's CPU ms) of one call of fn."""
    c0, t0 = time.thread_time(), time.perf_counter()
    fn()
    return 1000 * (time.perf_counter() - t0), 1000 * (time.thread_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=100)
    rounds = ap.parse_args().rounds
    target = load_model("tiny-target")
    p = target.prepared
    layers = [b[m][n]["w"] for b in p["blocks"] for m, n in (("attn", "c_attn"), ("attn", "c_proj"),
                                                              ("mlp", "c_fc"), ("mlp", "c_proj"))]
    rng = np.random.default_rng(0)
    xs = {id(w): rng.standard_normal((2, w.w.shape[0])).astype(np.float32) for w in layers + [p["head"]]}
    wt = {id(w): np.ascontiguousarray(w.w.T) for w in layers} | {id(p["head"]): target.params["wte"]}
    ways = {"gemv over w": lambda w, x: x[0] @ w.w, "gemv over a w.T copy": lambda w, x: wt[id(w)] @ x[0],
            "slab by slab": lambda w, x: unslab(np.matmul(x[:1], w.slabs), w.w.shape[1]),
            "np.einsum": lambda w, x: np.einsum("i,ij->j", x[0], w.w),
            "2 rows: slabs": lambda w, x: unslab(np.matmul(x, w.slabs), w.w.shape[1]),
            "2 rows: x @ w": lambda w, x: x @ w.w, "2 rows: row by row": lambda w, x: [r @ w.w for r in x]}
    cases = {(group, way): (lambda ws=ws, f=f: [f(w, xs[id(w)]) for w in ws])
             for group, ws in (("layer matrices", layers), ("head", [p["head"]])) for way, f in ways.items()}
    models = {how: laid_out(target, one_row=how) for how in ONE_ROW} | {
        "x @ w": laid_out(target, 0), "row by row": laid_out(target, 0, gemv_rows=8),
        "padded to 2": laid_out(target, one_row="slabs", padding=(2,))}
    caches = {how: primed(m, 200, 8) for how, m in models.items()}

    def pass_of(how, k):
        cache, length = caches[how], caches[how].length
        return lambda: (forward(models[how], np.arange(k) + 5, cache), cache.truncate(length))
    cases |= {("pass", f"1 token, {how}"): pass_of(how, 1) for how in models}
    cases |= {("pass", f"{k} tokens, {how}"): pass_of(how, k) for k in (2, 3, 4, 6, 8)
              for how in ("x @ w", "row by row", "slabs")}
    a = np.ones(target.weight_bytes // 4 >> 10 << 10, dtype=np.float32)
    ones = np.ones(1 << 10, dtype=np.float32)
    cases |= {("read", "np.add.reduce"): lambda: np.add.reduce(a),
              ("read", "gemv"): lambda: ones @ a.reshape(1 << 10, -1)}
    times = {}
    for r in range(rounds + 2):  # the first two rounds warm up
        for threads in (1, 2):
            with threadpool_limits(threads, user_api="blas"):
                for key, fn in cases.items():
                    times.setdefault((threads, *key), []).append(timed(fn))
    print(f"{machine_name()}; {rounds} rounds; ms (read: GB/s of the fastest round's wall time)")
    for (threads, group, way), v in times.items():
        v = np.array(v[2:])
        wall, cpu = v[:, 0], v[:, 1]
        rate = f"  {a.nbytes / wall.min() / 1e6:.1f} GB/s" if group == "read" else ""
        print(f"{threads} thread{'s' * (threads > 1)} | {group:14s} | {way:22s} | wall median {np.median(wall):7.2f} "
              f"(p10-p90 {np.percentile(wall, 10):.2f}-{np.percentile(wall, 90):.2f}) | "
              f"CPU median {np.median(cpu):6.2f} (min {cpu.min():.2f}){rate}")


if __name__ == "__main__":
    main()
