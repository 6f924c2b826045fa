"""Speed tricks for `gpt2.py`, apart from the math they speed up: none changes a number beyond float rounding.

At batch 1 a step is bound by reading the weights, so a block of a few tokens should cost about what one costs:
the premise of speculative decoding. A plain `x @ w` does not deliver it on a CPU: for a few rows OpenBLAS packs
all of `w` into a scratch buffer on every call. `Weight` adds a second layout of each matrix, column slabs, whose
product by a few rows is one small matrix product per slab (no packing where the BLAS has a small-matrix kernel).
Where a BLAS packs `w` even so (OpenBLAS's AVX2 kernels), a block of a few rows is cheaper as one matrix-vector
product per row (`Layout.gemv_rows`): the first reads `w` from memory, the others from the cache. Where its
small-matrix kernel beats its matrix-vector one (OpenBLAS's AVX-512 kernels), one row is cheaper read as two
(`Layout.one_row` "pair").
A model is given its `Layout` (the tools' choice for a machine; the measurements are in docs/performance.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .values import integral

SLAB = 64  # columns per slab: small enough that a slab's product needs no packing, wide enough for the kernel
SLAB_ROWS = 16  # by default blocks of up to SLAB_ROWS rows are multiplied slab by slab; larger ones by one x @ w
SLAB_MIN = 1 << 16  # smaller matrices have no slabs: packing them costs less than reassembling slab outputs
SLAB_COPY_MAX = 256 << 20  # bytes of weights up to which a model's slabs are a copy of its matrices (`Weight`)
ONE_ROW = ("gemv", "slabs", "pair")  # how the layer matrices multiply one row (`Layout.one_row`, `by_one_row`)


@dataclass(frozen=True)
class Layout:
    """How a model's passes are computed (only the speed): the largest block its products read from column slabs
    (`prepare`; 0: none), `padding`, the sizes to compute blocks of 1, 2, ... rows as (padding[k - 1] >= k; () =
    unpadded; `gpt2.pad`), how its layer matrices multiply one row (`one_row`: one matrix-vector product over
    w, one BLAS call that OpenBLAS runs on all its threads for a large matrix; slab by slab, one thread each; or
    "pair": slab by slab as two rows, the row and a copy, whose small-matrix product can cost less than one row's),
    and, where one row is a matrix-vector product, the largest block multiplied row by row so (`gemv_rows`)."""

    slab_rows: int = SLAB_ROWS
    padding: tuple = ()
    one_row: str = "gemv"
    gemv_rows: int = 1

    def check(self, n_ctx: int) -> "Layout":
        """The layout, padding as a tuple of ints, or a ValueError unless each size fits a context of n_ctx."""
        pad = self.padding
        if not (isinstance(pad, (list, tuple)) and all(integral(n) and k <= n <= n_ctx for k, n in enumerate(pad, 1))):
            raise ValueError(f"padding: padding[k - 1] must be an integer from k to n_ctx={n_ctx} "
                             f"(a block is padded, never cut, and fits the context), got {pad!r}")
        if self.one_row not in ONE_ROW:
            raise ValueError(f"one_row: one of {', '.join(ONE_ROW)}, got {self.one_row!r}")
        if not integral(self.gemv_rows) or self.gemv_rows < 1:
            raise ValueError(f"gemv_rows: an integer >= 1 (the largest block multiplied row by row), "
                             f"got {self.gemv_rows!r}")
        return Layout(self.slab_rows, tuple(int(n) for n in pad), self.one_row, int(self.gemv_rows))

    def rows(self, n: int) -> int:
        """The rows to compute a block of n tokens as: padding[n - 1] where the table covers n, else n."""
        return self.padding[n - 1] if n <= len(self.padding) else n


def laid_out(model, slab_rows: int | None = None, padding=None, one_row: str | None = None,
             gemv_rows: int | None = None):
    """`model` (a gpt2.GPT2) with other slab rows, padding table, one-row product or rows multiplied row by row
    (None: unchanged): the same numbers, another speed; the same slab rows share the prepared products."""
    old = model.layout
    layout = Layout(old.slab_rows if slab_rows is None else slab_rows, old.padding if padding is None else padding,
                    old.one_row if one_row is None else one_row, old.gemv_rows if gemv_rows is None else gemv_rows)
    if layout == old:
        return model
    laid = dataclasses.replace(model, layout=layout)
    if layout.slab_rows == old.slab_rows and "prepared" in model.__dict__:  # the same slabs
        laid.__dict__["prepared"] = by_one_row(model.__dict__["prepared"], layout)
    return laid


def by_one_row(prepared: dict, layout: Layout) -> dict:
    """`prepared` (`prepare`'s) with its layer matrices multiplying one row as `layout.one_row` says, and blocks of
    up to `layout.gemv_rows` rows row by row where that is a matrix-vector product. The tied head's one row is one
    over w either way (wte.T, 8193 or 50257 columns: slab by slab it is slower), and so is a matrix's without slabs."""
    rows, pair = (layout.gemv_rows if layout.one_row == "gemv" else 0), layout.one_row == "pair"

    def by(w, rows, pair=False):  # `w` multiplying blocks of up to `rows` rows row by row, one row as two or not
        return dataclasses.replace(w, gemv_rows=rows if w.slabs is not None else max(1, rows), pair=pair)
    return {**linear_layers(lambda layer: {**layer, "w": by(layer["w"], rows, pair)}, prepared),
            "head": by(prepared["head"], max(1, rows))}


def linear_layers(fn, tree):
    """`tree` (a model's parameters, or `prepare`'s) with every linear layer, a dict {"w", "b"}, as fn(layer)."""
    if isinstance(tree, list):
        return [linear_layers(fn, v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    return fn(tree) if tree.keys() == {"w", "b"} else {k: linear_layers(fn, v) for k, v in tree.items()}


@dataclass(frozen=True, eq=False)
class Weight:
    """A weight matrix in the two layouts its products read.

    w:     [n_in, n_out], the parameter, for blocks of more than `slab_rows` rows, and row by row (one
           matrix-vector product each) for blocks of up to `gemv_rows` rows.
    slabs: [ceil(n_out / SLAB), n_in, SLAB], the same numbers in column slabs, for the blocks in between: a copy
           in a small model (the last slab zero-padded); in a large one, whose copy
           would not fit beside it in a laptop's memory, a strided view of `w` where n_out is a multiple of SLAB.
           None for a matrix of at most SLAB_MIN numbers or when slab_rows is 0.
    """

    w: np.ndarray
    slabs: np.ndarray | None
    slab_rows: int = SLAB_ROWS  # blocks of up to this many rows read the slabs
    gemv_rows: int = 1  # blocks of up to this many rows are multiplied row by row (0: one row too by slabs)
    pair: bool = False  # one row read from the slabs as two (itself and a copy): the kernel's two-row product

    @classmethod
    def of(cls, w, slab_rows: int = SLAB_ROWS, gemv_rows: int = 1, slab_min: int | None = None,
           copy: bool = True) -> "Weight":
        """[n_in, n_out] -> Weight (no slabs for at most `slab_min` numbers, default SLAB_MIN); `copy`:
        slabs (and a row-major w) as copies, else views of `w` where they can be."""
        n_in, n_out = w.shape
        w = np.ascontiguousarray(w) if copy else w
        if w.size <= (SLAB_MIN if slab_min is None else slab_min) or slab_rows < 1:
            return cls(w, None, 0, gemv_rows)
        full = n_out // SLAB  # slabs with no padding
        if not copy and full * SLAB == n_out and w.strides[1] == w.itemsize:
            return cls(w, w.reshape(n_in, full, SLAB).transpose(1, 0, 2), slab_rows, gemv_rows)  # [n_slabs, n_in, SLAB]
        slabs = np.zeros((-(-n_out // SLAB), n_in, SLAB), dtype=w.dtype)  # [n_slabs, n_in, SLAB]
        slabs[:full] = w[:, :full * SLAB].reshape(n_in, full, SLAB).transpose(1, 0, 2)
        slabs[full:, :, :n_out - full * SLAB] = w[:, full * SLAB:]  # the last slab, zero-padded
        return cls(w, slabs, slab_rows, gemv_rows)

    __array_ufunc__ = None  # `x @ weight` for an array x: NumPy defers to __rmatmul__

    def __rmatmul__(self, x):  # [n, n_in] @ [n_in, n_out] -> [n, n_out]
        """x @ w, read from the layout that is cheapest for n rows."""
        n = x.shape[0]
        if n <= self.gemv_rows:  # matrix-vector products, [n_in] @ [n_in, n_out] -> [n_out] each
            out = np.empty((n, self.w.shape[1]), dtype=np.result_type(x, self.w))  # [n, n_out]
            for row, y in zip(x, out):
                np.matmul(row, self.w, out=y)
            return out
        if n <= self.slab_rows:
            if n == 1 and self.pair:  # row 0 of [x; x] @ w: a small-matrix kernel that can outrun its one-row path
                return unslab(np.matmul(np.concatenate([x, x]), self.slabs), self.w.shape[1])[:1]
            return unslab(np.matmul(x, self.slabs), self.w.shape[1])  # one small product per slab
        return x @ self.w


def unslab(y, n_out: int):  # [n_slabs, n, SLAB] -> [n, n_out], row-major
    """Slab products side by side, the last slab's padding columns dropped, in one copy."""
    n_slabs, n, _ = y.shape
    full = n_out // SLAB  # slabs with no padding
    if full == n_slabs:
        return y.transpose(1, 0, 2).reshape(n, n_out)
    out = np.empty((n, n_out), dtype=y.dtype)
    np.reshape(out[:, :full * SLAB], (n, full, SLAB), copy=False)[...] = y[:full].transpose(1, 0, 2)
    out[:, full * SLAB:] = y[full, :, :n_out - full * SLAB]  # the padded last slab
    return out


def prepare(params: dict, slab_rows: int, weight_bytes: int, head) -> dict:
    """The parameters as `gpt2.forward` reads them: the same tree, every linear layer's "w" a `Weight` whose
    slabs serve blocks of up to `slab_rows` rows (0: none), plus "head", the LM head's matrix `head` [n_embd, n_out]
    (GPT-2's tied wte.T) as a `Weight` of its own; the slabs are copies up to SLAB_COPY_MAX `weight_bytes`."""
    copy = weight_bytes <= SLAB_COPY_MAX
    prepared = linear_layers(lambda layer: {**layer, "w": Weight.of(layer["w"], slab_rows, copy=copy)}, params)
    return prepared | {"head": Weight.of(head, slab_rows, copy=copy)}


def kth_largest(x, k: int):  # [V] -> a value of x
    """np.partition(x, V - k)[V - k] (x without NaN, 1 <= k <= V), partitioning far fewer values: the k-th largest of
    4k block maxima is a lower bound (k values reach it), so the k-th largest lies among the values that reach it
    (about k of them): 2-3x faster than a partition of the embedded target's 8,193 logits (docs/performance.md)."""
    V, width = x.size, x.size // (4 * k)
    if width < 8:
        return np.partition(x, V - k)[V - k]
    maxima = x[:width * (V // width)].reshape(-1, width).max(axis=1)  # [V // width]
    low = np.partition(maxima, maxima.size - k)[maxima.size - k]
    reach = x[x >= low]  # [>= k]
    return np.partition(reach, reach.size - k)[reach.size - k]


def softmax_(x):  # [..., L] -> [..., L], in place
    """Softmax over the last axis without temporaries (attention scores, once per layer)."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x
