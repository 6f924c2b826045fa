"""Speed tricks for `gpt2.py`, apart from the math they speed up: none changes what is computed.

At batch 1 a small model's step is mostly per-call overhead and weight streaming, and OpenBLAS
picks its kernel by shape, so a few layout and call choices matter. The numbers in the comments:
AMD EPYC (Zen 4, lscpu family 25 model 17; KVM guest), 2 cores, 2 MB L2 per core, 32 MB L3;
NumPy 2.4 with OpenBLAS 0.3.31 at its default 2 threads; float32; the minimum over 30
interleaved timeit rounds (the machine was shared, and OpenBLAS's threads stall for milliseconds
per call while the other core is busy: the minimum leaves those stalls out). Weights are warm
(the same call repeated) unless marked cold (64 MB streamed through the cache first, as when the
other model's pass evicts them). Shapes: GPT-2 (n_embd 768) and the tiny target (320) and draft
(128) in weights/. Other CPUs and BLAS builds differ, so a trick that does not pay here says so
and stays.
"""

from __future__ import annotations

import numpy as np

# Blocks of up to this many tokens are multiplied one row at a time (matrix-vector products).
GEMV_ROWS = 3


def matmul_rows(x, w):  # [n, n_in] @ [n_in, n_out] -> [n, n_out]
    """x @ w, as the BLAS routine that is fastest for this many rows.

    One token: a matrix-vector product (gemv), which streams the weights once. A matrix product
    (gemm) first packs the whole weight matrix into a scratch buffer, which for a few rows costs
    more than the arithmetic: up to GEMV_ROWS rows, one gemv per row is cheaper (the weights are
    read from memory once, then from the cache). Larger blocks: w.T @ x.T, with w.T contiguous
    (`fast_layout`).
    """
    # Gemv per row vs gemm, GPT-2's c_fc (768x3072): 2 rows 135 vs 294 us, 3 rows 198 vs 360, 4 rows
    # 255 vs 299; cold, 2 rows 561 vs 692, 3 rows 649 vs 812. The tiny draft's tied head (8193x128,
    # `tied_head`'s copy included): 2 rows 69 vs 123 us. It does not pay for the tiny models' layers:
    # 320x1280, 2 rows 52 vs 49 us, 3 rows 77 vs 69; 128x512, 2 rows 9.5 vs 4.5 us (3: 13.6 vs 18.4).
    if x.shape[0] <= GEMV_ROWS:
        out = np.empty((x.shape[0], w.shape[1]), dtype=np.result_type(x, w))
        for row, res in zip(x, out):
            np.matmul(row, w, out=res)
        return out
    return (w.T @ x.T).T  # [n_out, n_in] @ [n_in, n] -> [n_out, n] -> [n, n_out]


def fast_layout(params: dict) -> dict:
    """The same parameters with every linear weight in column-major order, so that `w.T` is a
    contiguous [n_out, n_in] matrix for `matmul_rows`."""
    # `w.T @ x.T` from column-major w vs `x @ w` from row-major w, GPT-2's c_fc (768x3072): 4 rows
    # 426 vs 631 us, 8 rows 493 vs 676, 16 rows 626 vs 854. GPT-2's mlp c_proj (3072x768): 4 rows
    # 408 vs 403, 8 rows 480 vs 444, 16 rows 577 vs 737. It does not pay at the tiny models' widths
    # below 16 rows: 320x1280, 8 rows 74 vs 65 us; 128x512, 4 rows 15.4 vs 5.7 us, 8 rows 12.8 vs
    # 10.2 (16 rows: 88 vs 104, 15.4 vs 23.7). One row (gemv), 768x3072: 83 vs 71 us.
    def fix(tree):
        if isinstance(tree, list):
            return [fix(v) for v in tree]
        if "w" in tree:  # a linear layer {"w", "b"}
            return {"w": np.asfortranarray(tree["w"]), "b": tree["b"]}
        return {k: fix(v) if isinstance(v, (dict, list)) else v for k, v in tree.items()}
    return fix(params)


def tied_head(x, wte):  # [n, n_embd] -> [n, n_vocab]
    """The LM head x @ wte.T, as `matmul_rows` computes it (blocks: (wte @ x.T).T, no transposed
    operand). A block's result is column-major; it is copied back to row-major, since every
    consumer works along rows."""
    # `(wte @ x.T).T` plus the copy vs `x @ wte.T`: GPT-2 (50257x768), 4 rows 14.0 vs 15.7 ms, 8 rows
    # 15.5 vs 16.5; the tiny target (8193x320), 4 rows 750 vs 991 us, 8 rows 896 vs 1279; the tiny
    # draft (8193x128), 4 rows 150 vs 321 us, 8 rows 219 vs 347. The copy: a softmax over column-
    # major logits [8, 8193] takes 481 us, the copy and a row-major softmax 96 us ([8, 50257]:
    # 2849 vs 504 us).
    return np.ascontiguousarray(matmul_rows(x, wte.T))


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
    # `w.T @ x.T` per row count, GPT-2's c_fc (768x3072): 4 rows 321 us, 5 rows 474, 6 rows 682,
    # 7 rows 629, 8 rows 467; the tiny draft's (128x512): 5 rows 21.3 us, 7 rows 27.4, 8 rows 12.8.
    # The tiny target's (320x1280) is flat: 5 rows 74 us, 8 rows 73-77.
    n, width = mask.shape  # width = prefix + n
    extra = size - n
    padded = np.zeros((size, width + extra), dtype=bool)  # [size, prefix + size]
    padded[:n, :width] = mask
    padded[np.arange(n, size), width + np.arange(extra)] = True
    tokens = np.concatenate([tokens, np.zeros(extra, dtype=np.int64)])
    positions = np.concatenate([positions, np.full(extra, positions[0], dtype=np.int64)])
    return tokens, positions, padded, size
