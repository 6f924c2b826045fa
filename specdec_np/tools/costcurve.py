"""This machine's cost curve: milliseconds of one forward pass against the number of tokens in the block.

At batch 1 a decoder step reads every weight once for ~0.5 FLOP per byte of float32 weights (bound by
memory bandwidth); a block of k tokens reads the same weights for k times the arithmetic: how many
tokens are "free" decides how big a verification tree pays off. Passes are timed round-robin, so that
a burst of noise on a shared machine lands on every size a little, not on a few a lot (bending the curve).
A draft's pass is `gpt2.forward`; an EAGLE head's is its own (`model_pass`).
"""

from __future__ import annotations

import contextlib
import functools
import time
import timeit
from pathlib import Path

import numpy as np

from .. import eagle
from ..fastpath import ONE_ROW, laid_out
from ..gpt2 import GPT2, forward, new_cache
from .blas import blas

SLAB_SIZES = (2, 4, 8, 12, 16)  # the block sizes `choose_slab_rows` compares the layouts at
# Block sizes the decoding loop meets; others are interpolated, larger ones extrapolated (costmodel.interp).
LOOP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)

def median_ms(fn, repeats: int = 7, warmup: int = 2) -> float:
    """Median ms of `fn()` over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    return 1000 * float(np.median(timeit.repeat(fn, repeat=repeats, number=1)))


def last_level_cache_bytes() -> int | None:
    """The size of the CPU's largest cache in bytes, as Linux reports it (None if unknown)."""
    kib = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            text = (index / "size").read_text().strip()  # e.g. "32768K"
            kib.append(int(text.rstrip("KMG")) * {"K": 1, "M": 1024, "G": 1 << 20}.get(text[-1], 1))
    return max(kib) * 1024 if kib else None


def last_level_cache() -> str:
    """The size of the CPU's largest cache in words, e.g. "32 MB" ("" if unknown)."""
    size = last_level_cache_bytes() or 0
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB" if size else ""


def streaming_gbps(repeats: int = 5) -> tuple[float, float]:
    """GB/s a float32 matrix-vector product streams its matrix (from memory, from the last-level cache): a matrix
    twice that cache (>= 256 MB) and half of it."""
    def matvec_gbps(rows: int, cols: int) -> float:
        w = np.full((rows, cols), 0.5, dtype=np.float32)  # the values do not change the time
        x = np.full(rows, 0.5, dtype=np.float32)
        return w.nbytes / (median_ms(lambda: x @ w, repeats=repeats) / 1000) / 1e9
    llc = last_level_cache_bytes()
    big_rows = max(1 << 14, 2 * (llc or 0) // (4 * 4096))
    small_rows = max(1, (llc or 32 << 20) // 2 // (4 * 2048))
    return matvec_gbps(big_rows, 4096), matvec_gbps(small_rows, 2048)


def read_gbps(nbytes: int, repeats: int = 7) -> float:
    """GB/s NumPy reads a float32 array of `nbytes` (the weights a pass reads: the roofline of a one-token pass), the
    faster of two readers timed round-robin: its own sum (np.add.reduce, one core) and a BLAS matrix-vector product
    over it (the threads BLAS has now), whichever streams faster with this NumPy and kernel."""
    a = np.ones(max(1 << 10, nbytes // 4 >> 10 << 10), dtype=np.float32)
    w, x = a.reshape(1 << 10, -1), np.ones(1 << 10, dtype=np.float32)  # [1024, n] @ [1024] -> [n]
    ms = round_robin({"sum": lambda: timeit.timeit(lambda: np.add.reduce(a), number=1),
                      "gemv": lambda: timeit.timeit(lambda: x @ w, number=1)}, repeats)
    return a.nbytes / (min(ms.values()) / 1000) / 1e9


def model_pass(model: GPT2, tokens, cache):  # [k] -> [k, V]
    """One pass of `model` over `tokens` after its cache: `gpt2.forward`, or for an EAGLE head (`eagle.Head`) its
    own pass, `eagle.head_pass` over (feature, token) pairs, its guessed features and the target's tied head on
    them (the values do not change the time: the features are zeros)."""
    if not isinstance(model, eagle.Head):
        return forward(model, tokens, cache)
    k, start = len(tokens), cache.length
    features = np.zeros((k, model.n_feature), dtype=model.dtype)  # [k, D]
    mask = np.tri(k, start + k, start, dtype=bool)  # [k, start + k]: each pair sees the cache and those before it
    h = eagle.head_pass(model, features, tokens, start + np.arange(k), cache, mask)  # [k, d]
    eagle.head_features(model, h)  # what the drafter feeds a node's children
    return eagle.head_logits(model, h)


def primed(model: GPT2, prefix_len: int, max_block: int):
    """A KV cache holding a prefix of `prefix_len` tokens."""
    cache = new_cache(model, max_block=max_block)
    model_pass(model, np.arange(prefix_len) % model.config.n_vocab, cache)
    return cache


def timed_pass(model: GPT2, cache, k: int) -> float:
    """Seconds of one forward pass of k new tokens after the cache's prefix, which is kept as it was."""
    length = cache.length
    t = time.perf_counter()
    model_pass(model, np.arange(k) % model.config.n_vocab, cache)
    seconds = time.perf_counter() - t
    cache.truncate(length)
    return seconds


def round_robin(passes: dict, repeats: int, progress=None, summary=np.median) -> dict:
    """{key: ms of `passes[key]()` (seconds) over `repeats` rounds, summed up by `summary` (the median; np.min where
    a busy machine should move it little)}, each called once a round: a warm-up, then `repeats`."""
    times = {key: [] for key in passes}
    for r in range(repeats + 1):
        for key, timed in passes.items():
            times[key].append(timed())
        if progress:
            progress(r + 1, repeats + 1)
    return {key: 1000 * float(summary(ts[1:])) for key, ts in times.items()}


def bends(ms: dict, slack: float = 0.03) -> list:
    """[(fewer, more)]: the neighbouring row counts of a cost curve {rows: ms} where the pass of more rows was measured
    cheaper than the one of fewer (by more than `slack`, timing noise). More rows are never less work: such a curve was
    bent by the machine (the BLAS's kernel for that row count, a 1-row product taking the matrix-vector path; its
    threads; a busy machine), and its ratios are no price list."""
    ks = sorted(ms)
    return [(a, b) for a, b in zip(ks, ks[1:]) if ms[b] < (1 - slack) * ms[a]]


def block_cost_ms(model: GPT2, block_sizes, prefix_len: int = 128, repeats: int = 7, summary=np.median) -> dict:
    """{k: ms of one forward pass of k new tokens after a cached prefix}, the sizes timed round-robin."""
    cache = primed(model, prefix_len, max(block_sizes))
    return round_robin({k: functools.partial(timed_pass, model, cache, k) for k in block_sizes}, repeats,
                       summary=summary)


def fitting(sizes, n_ctx: int) -> tuple:
    """The sizes a context of n_ctx holds after a prefix of a quarter of it (at least the smallest)."""
    return tuple(k for k in sizes if k <= n_ctx * 3 // 4) or sizes[:1]


def apply_layout(layout: dict, target, draft):
    """(target, draft) with a measured layout's slab rows ({"target": rows, ...}: `laid_out`), one-row products
    ({"target_one_row": "gemv", ...}: `choose_one_row`) and padding tables ({"target_pad": table, ...}:
    `costmodel.pads`); a model it does not name is left as it is. With one BLAS thread (a busy machine's run with a
    quiet one's costs) one row is one matrix-vector product: the faster on one thread with every kernel measured."""
    one_thread = blas()["threads"] == 1
    return tuple(None if model is None else laid_out(model, layout.get(name), layout.get(name + "_pad"),
                                                     "gemv" if one_thread else layout.get(name + "_one_row"))
                 for model, name in ((target, "target"), (draft, "draft")))


def choose_slab_rows(model: GPT2, sizes=SLAB_SIZES, prefix_len: int = 200, repeats: int = 9,
                     seconds: float = 3.0, tie: float = 1.05) -> int:
    """The largest block column slabs multiply at most `tie` times as slowly as one x @ w, 0 unless they do at the
    smallest size; both layouts timed round-robin, `repeats` rounds (fewer past about `seconds`)."""
    sizes = fitting(sizes, model.config.n_ctx)
    layouts = laid_out(model, 0), laid_out(model, max(sizes))
    caches = [primed(m, min(prefix_len, model.config.n_ctx - max(sizes)), max(sizes)) for m in layouts]
    one = timed_pass(layouts[1], caches[1], max(sizes))
    repeats = max(2, min(repeats, int(seconds / (2 * len(sizes) * one))))
    ms = round_robin({(i, k): functools.partial(timed_pass, m, caches[i], k) for k in sizes
                      for i, m in enumerate(layouts)}, repeats)
    wins = [k for k in sizes if ms[1, k] <= tie * ms[0, k]]
    return max(wins) if sizes[0] in wins else 0


def choose_one_row(model: GPT2, prefix_len: int = 200, repeats: int = 15, seconds: float = 2.0) -> str:
    """How the layer matrices multiply one row (`Layout.one_row`): the way whose one-token pass is faster (the
    median of `repeats` rounds, fewer past about `seconds`, timed round-robin; slabs at least for one row). With
    one BLAS thread one matrix-vector product per matrix is; with more, OpenBLAS runs it on all threads, a slab's
    product on one."""
    layouts = {how: laid_out(model, max(1, model.layout.slab_rows), one_row=how) for how in ONE_ROW}
    caches = {how: primed(m, min(prefix_len, model.config.n_ctx - 1), 1) for how, m in layouts.items()}
    one = timed_pass(layouts["gemv"], caches["gemv"], 1)
    repeats = max(3, min(repeats, int(seconds / (2 * one))))
    ms = round_robin({how: functools.partial(timed_pass, m, caches[how], 1) for how, m in layouts.items()}, repeats)
    return min(ONE_ROW, key=ms.get)


def loop_curves(target: GPT2, draft: GPT2 | None, sizes=LOOP_SIZES, prefix_len: int = 200, repeats: int = 5,
                progress=None) -> dict:
    """{"target": {"warm": {k: ms}, "cold": ...}, "draft": ...}: a pass of k tokens right after one of the same
    model (warm) or of the other (cold: its weights may be out of the cache); medians of `repeats` rounds."""
    models = {"target": target} if draft is None else {"target": target, "draft": draft}
    sizes = fitting(sizes, min(m.config.n_ctx for m in models.values()))
    prefix_len = min([prefix_len] + [m.config.n_ctx - max(sizes) for m in models.values()])
    caches = {name: primed(model, prefix_len, max(sizes)) for name, model in models.items()}
    states = ("warm", "cold") if draft is not None else ("warm",)

    def after(name, state, k):  # a pass of one token just before: the same model (warm) or the other (cold)
        before = name if state == "warm" else next(m for m in models if m != name)
        timed_pass(models[before], caches[before], 1)
        return timed_pass(models[name], caches[name], k)
    ms = round_robin({(name, state, k): functools.partial(after, name, state, k) for name in models for k in sizes
                      for state in states}, repeats, progress)
    return {name: {state: {k: ms[name, state, k] for k in sizes} for state in states} for name in models}
