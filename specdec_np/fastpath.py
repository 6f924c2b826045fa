"""Speed tricks for `gpt2.py`, apart from the math they speed up: none changes what is computed.

At batch 1 a small model's step is mostly per-call overhead and weight streaming, and OpenBLAS
picks its kernel by shape, so a few layout and call choices matter. Each is justified by a
measurement (2-core AMD EPYC VM, 32 MB L3, OpenBLAS 0.3.31, float32, the embedded pair) that
`make bench ARGS=--curves` or the numbers' own one-liners reproduce; on another CPU some matter
less, none makes anything slower that was measured.
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
    (`fast_layout`); OpenBLAS is 20-40% faster this way round than x @ w for 4-16 rows.
    """
    if x.shape[0] <= GEMV_ROWS:
        out = np.empty((x.shape[0], w.shape[1]), dtype=np.result_type(x, w))
        for row, res in zip(x, out):
            np.matmul(row, w, out=res)
        return out
    return (w.T @ x.T).T  # [n_out, n_in] @ [n_in, n] -> [n_out, n] -> [n, n_out]


def fast_layout(params: dict) -> dict:
    """The same parameters with every linear weight in column-major order, so that `w.T` is a
    contiguous [n_out, n_in] matrix for `matmul_rows`."""
    def fix(tree):
        if isinstance(tree, list):
            return [fix(v) for v in tree]
        if "w" in tree:  # a linear layer {"w", "b"}
            return {"w": np.asfortranarray(tree["w"]), "b": tree["b"]}
        return {k: fix(v) if isinstance(v, (dict, list)) else v for k, v in tree.items()}
    return fix(params)


def tied_head(x, wte):  # [n, n_embd] -> [n, n_vocab]
    """The LM head x @ wte.T, as `matmul_rows` computes it (blocks: (wte @ x.T).T; OpenBLAS is
    ~1.5x slower at x @ wte.T, a transposed operand). A block's result is column-major; it is
    copied back to row-major, since every consumer works along rows (a softmax over a
    column-major [n, V] costs 5-10x more than the copy)."""
    return np.ascontiguousarray(matmul_rows(x, wte.T))


def softmax_(x):  # [..., L] -> [..., L], in place
    """Softmax over the last axis without temporaries (attention scores, once per layer)."""
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
    they would alone. BLAS kernels work in panels of 4 and 8 columns: on the AMD EPYC a block of
    5-7 tokens costs more than one of 8 (the tools read which sizes to pad to off the measured
    cost curve; the core pads only when a Plan says so)."""
    n, width = mask.shape  # width = prefix + n
    extra = size - n
    padded = np.zeros((size, width + extra), dtype=bool)  # [size, prefix + size]
    padded[:n, :width] = mask
    padded[np.arange(n, size), width + np.arange(extra)] = True
    tokens = np.concatenate([tokens, np.zeros(extra, dtype=np.int64)])
    positions = np.concatenate([positions, np.full(extra, positions[0], dtype=np.int64)])
    return tokens, positions, padded, size
