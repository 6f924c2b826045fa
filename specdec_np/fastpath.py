"""Speed tricks for `gpt2.py`, apart from the math they speed up: none changes what is computed.

At batch 1 a small model's step is mostly per-call overhead and weight streaming, and OpenBLAS
picks its kernel by shape, so a few call choices matter. The numbers in the comments:
AMD EPYC (Zen 4, lscpu family 25 model 17; KVM guest), 2 cores, 2 MB L2 per core, 32 MB L3;
NumPy 2.4 with OpenBLAS 0.3.31 at its default 2 threads; float32; the minimum over 30
interleaved timeit rounds (the machine was shared, and OpenBLAS's threads stall for milliseconds
per call while the other core is busy: the minimum leaves those stalls out), or the median of 40-60
calls where marked cold. Weights are warm (the same call repeated) unless marked cold (64 MB
streamed through the cache first, as when the other model's pass evicts them: inside the decoding
loop most passes are cold). Shapes: GPT-2 (n_embd 768) and the tiny target (320) and draft
(128) in weights/. Other CPUs and BLAS builds differ, so a trick that does not pay here says so
and stays.
"""

from __future__ import annotations

import numpy as np

# Blocks of up to this many tokens go through the LM head one row at a time (matrix-vector products).
HEAD_GEMV_ROWS = 3


def matmul_rows(x, w, gemv_rows: int = 1):  # [n, n_in] @ [n_in, n_out] -> [n, n_out]
    """x @ w, as the BLAS routine that is fastest for this many rows.

    One token: a matrix-vector product (gemv) over the row-major weights, which streams them once,
    front to back. Larger blocks: one matrix product (gemm), which first packs the weights into a
    scratch buffer. For a wide matrix such as the LM head (`gemv_rows=HEAD_GEMV_ROWS`), packing
    costs more than the arithmetic of a few rows, and one gemv per row is cheaper up to 3 rows (the
    weights are read from memory once, then from the cache); for the layers' matrices it is not.
    """
    # Cold, row-major x @ w against the same product from column-major weights (w.T @ x.T), one
    # row: the tiny target's c_fc (320x1280) 81 vs 140 us, its head (320x8193) 183 vs 357; GPT-2's
    # c_fc (768x3072) 231 vs 334. Four rows: 109 vs 144, 601 vs 822, 691 vs 716. A whole cold pass
    # of the tiny target: 1 row 2.59 vs 3.25 ms, 4 rows 3.81 vs 4.29, 16 rows 5.92 vs 5.68; of the
    # draft, 1 row 0.40 vs 0.47 ms. (Warm, column-major wins at 2-16 rows for GPT-2's larger
    # matrices, e.g. c_fc 4 rows 330 vs 532 us; inside the decoding loop passes are mostly cold.)
    # Gemv per row vs gemm, cold, 2 rows: the tiny target's head 261 vs 596 us, but its c_attn
    # (320x960) 125 vs 90 and c_fc 211 vs 106, the draft's c_attn (128x384) 44 vs 29; GPT-2's four
    # layer matrices 1.92 vs 1.94 ms together. Whole cold passes (median of 40-60 interleaved,
    # gemv per row for every matrix up to 3 rows vs for the head only): the tiny target, 3 rows
    # 5.21 vs 4.42 ms, 2 rows 4.23 vs 4.16; the draft, 2 rows 0.62 vs 0.55, 3 rows 0.62 vs 0.58.
    # Gemv per row for the head up to 6 rows instead of 3: within 3% at 4-6 rows for both models.
    if x.shape[0] <= gemv_rows:
        out = np.empty((x.shape[0], w.shape[1]), dtype=np.result_type(x, w))
        for row, res in zip(x, out):
            np.matmul(row, w, out=res)
        return out
    return x @ w


def head_weights(wte):  # [n_vocab, n_embd] -> [n_embd, n_vocab]
    """The tied LM head's weights wte.T as a row-major copy of their own, so that the head is one
    more `matmul_rows` (wte.T is a column-major view: see the measurements there). It costs one
    more copy of wte in memory, not in traffic: a pass reads the copy instead of wte."""
    return np.ascontiguousarray(wte.T)


def kth_largest(values, k: int, subset: int = 1024):  # [..., V] -> [..., 1]
    """The k-th largest value along the last axis, as np.partition finds it, but without
    partitioning the whole vocabulary: the k-th largest of the first `subset` entries is a lower
    bound of it, so only the entries at or above that bound (a few hundred) are partitioned."""
    # Top-k 50 of the tiny target's float64 logits (8193 wide) after a code prompt: one row
    # np.partition 63 us, this 15 us; four rows 219 vs 53 us. It runs on every sampled draft and
    # target pass: in a sampled staged run (cProfile, 8 calibration prompts) processing logits
    # took 0.45 s of 3.7 s with np.partition, 0.27 s with this.
    V = values.shape[-1]
    if V < 4 * subset or k > subset // 4:  # a bound from few entries would keep most of the row
        return np.partition(values, V - k, axis=-1)[..., V - k:V - k + 1]
    rows = values.reshape(-1, V)
    out = np.empty(rows.shape[0], dtype=values.dtype)
    for i, row in enumerate(rows):
        bound = np.partition(row[:subset], subset - k)[subset - k]
        kept = row[row >= bound]  # every value of the row's top k, and at least k values
        out[i] = np.partition(kept, kept.size - k)[kept.size - k]
    return out.reshape(values.shape[:-1] + (1,))


def softmax_(x):  # [..., L] -> [..., L], in place
    """Softmax over the last axis without temporaries (attention scores, once per layer)."""
    # In `attention`, 12 heads, 8 new tokens over 208 slots: 91.6 us in place vs 96.4 us with
    # temporaries; 1 token over 201 slots: 33.6 vs 37.1 us. About 4 us per layer.
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def padded(table, n: int) -> int:
    """The block size to compute n rows as, from a Plan's padding table: table[n - 1] when the table
    covers n, else n (no padding)."""
    return table[n - 1] if n <= len(table) else n


def pad_block(tokens, positions, mask, size: int):
    """Append dummy rows up to `size`: token 0 at the first position, seeing only itself, and
    invisible to every real row (their mask columns are False), so real rows compute exactly what
    they would alone. BLAS kernels work in panels of 4 and 8 columns, so a block of 5-7 tokens
    can cost more than one of 8 (the tools read which sizes to pad to off the measured cost
    curve; the core pads only when a Plan says so)."""
    # A whole pass of the tiny target (median of 20 repeated passes): 4 rows 3.75 ms, 5 rows 4.20,
    # 6 rows 4.56, 8 rows 4.25.
    n, width = mask.shape  # width = prefix + n
    extra = size - n
    padded = np.zeros((size, width + extra), dtype=bool)  # [size, prefix + size]
    padded[:n, :width] = mask
    padded[np.arange(n, size), width + np.arange(extra)] = True
    tokens = np.concatenate([tokens, np.zeros(extra, dtype=np.int64)])
    positions = np.concatenate([positions, np.full(extra, positions[0], dtype=np.int64)])
    return tokens, positions, padded, size
