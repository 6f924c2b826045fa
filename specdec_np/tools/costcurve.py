"""This machine's cost curve: milliseconds of one forward pass against the number of tokens in the block.

At batch 1 a decoder step reads every weight once for ~0.5 FLOP per byte of float32 weights (bound by memory
bandwidth); a block of k tokens reads the same weights for k times the arithmetic: how many tokens are "free" decides
how big a verification tree pays off. Passes are timed round-robin, so that noise lands on every size a little (every
other round in reverse order).
"""

from __future__ import annotations

import functools
import time
import timeit

import numpy as np
from threadpoolctl import threadpool_limits

from .. import eagle
from ..fastpath import ONE_ROW, laid_out
from ..gpt2 import GPT2, forward, new_cache
from .machine import blas, last_level_cache_bytes

SLAB_SIZES = (2, 4, 8, 12, 16)  # the block sizes `choose_slab_rows` compares the layouts at
GEMV_SIZES = (2, 3, 4, 6, 8)  # the block sizes `choose_gemv_rows` compares row by row products at
# Block sizes the decoding loop meets; others are interpolated, larger ones extrapolated (costmodel.interp).
LOOP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)

def median_ms(fn, repeats: int = 7, warmup: int = 2) -> float:
    """Median ms of `fn()` over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    return 1000 * float(np.median(timeit.repeat(fn, repeat=repeats, number=1)))


def streaming_gbps(repeats: int = 5) -> tuple[float, float]:
    """GB/s a float32 matrix-vector product streams its matrix from memory and from the last-level cache."""
    def matvec_gbps(rows: int, cols: int) -> float:
        w = np.full((rows, cols), 0.5, dtype=np.float32)  # the values do not change the time
        x = np.full(rows, 0.5, dtype=np.float32)
        return w.nbytes / (median_ms(lambda: x @ w, repeats=repeats) / 1000) / 1e9
    llc = last_level_cache_bytes()
    big_rows = max(1 << 14, 2 * (llc or 0) // (4 * 4096))
    small_rows = max(1, (llc or 32 << 20) // 2 // (4 * 2048))
    return matvec_gbps(big_rows, 4096), matvec_gbps(small_rows, 2048)


def read_gbps(nbytes: int, repeats: int = 7) -> float:
    """GB/s NumPy reads a float32 array of `nbytes` (the roofline of a one-token pass): the faster of its own sum
    (np.add.reduce, one core) and a BLAS matrix-vector product over it (BLAS's threads), timed round-robin."""
    a = np.ones(max(1 << 10, nbytes // 4 >> 10 << 10), dtype=np.float32)
    w, x = a.reshape(1 << 10, -1), np.ones(1 << 10, dtype=np.float32)  # [1024, n] @ [1024] -> [n]
    ms = round_robin({"sum": lambda: timeit.timeit(lambda: np.add.reduce(a), number=1),
                      "gemv": lambda: timeit.timeit(lambda: x @ w, number=1)}, repeats)
    return a.nbytes / (min(ms.values()) / 1000) / 1e9


def model_pass(model: GPT2, tokens, cache):  # [k] -> [k, V]
    """One pass of `model` over `tokens` after its cache: `gpt2.forward`, or an EAGLE head's own (zero features)."""
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
    length, t = cache.length, time.perf_counter()
    model_pass(model, np.arange(k) % model.config.n_vocab, cache)
    seconds = time.perf_counter() - t
    cache.truncate(length)
    return seconds


def round_robin(passes: dict, repeats: int, progress=None, summary=np.median) -> dict:
    """{key: `summary` (median, or min) of the ms of `passes[key]()` (seconds)}: a warm-up, then `repeats` rounds,
    every other one in reverse order: identical passes timed in one fixed order measured 2-7% slower first to last,
    so a fixed order would favour whichever case comes later."""
    times = {key: [] for key in passes}
    for r in range(repeats + 1):
        for key in passes if r % 2 == 0 else reversed(passes):
            times[key].append(passes[key]())
        if progress:
            progress(r + 1, repeats + 1)
    return {key: 1000 * float(summary(ts[1:])) for key, ts in times.items()}


def bends(ms: dict, slack: float = 0.03) -> list:
    """[(fewer, more)]: the neighbouring row counts of a cost curve {rows: ms} where more rows were measured cheaper
    (by more than `slack`). More rows are never less work: the machine bent such a curve, no price list."""
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


def apply_layout(layout: dict, target, *drafters):
    """(target, *drafters) with a measured layout's slab rows, one-row products, rows multiplied row by row and padding
    tables ({"target": rows, "target_one_row": ..., "target_gemv_rows": ..., "target_pad": ...}; a draft model reads
    "draft", ..., an EAGLE head "head", "head_one_row", ...; None stays None); with one BLAS thread, one row as
    measured with one ("target_one_row_one_thread"; one matrix-vector product where unmeasured)."""
    one_thread = blas()["threads"] == 1
    named = ((target, "target"), *((m, "head" if isinstance(m, eagle.Head) else "draft") for m in drafters))
    return tuple(None if model is None else laid_out(model, layout.get(name), layout.get(name + "_pad"),
                                                     layout.get(name + "_one_row_one_thread", "gemv") if one_thread
                                                     else layout.get(name + "_one_row"),
                                                     layout.get(name + "_gemv_rows"))
                 for model, name in named)


def race(layouts: list, sizes, prefix_len: int, repeats: int, seconds: float) -> dict:
    """{(i, k): ms of a pass of k tokens by layouts[i]}, all timed round-robin after a prefix, `repeats` rounds (at
    least 2, fewer past about `seconds`)."""
    caches = [primed(m, min(prefix_len, m.config.n_ctx - max(sizes)), max(sizes)) for m in layouts]
    one = timed_pass(layouts[0], caches[0], max(sizes))
    repeats = max(2, min(repeats, int(seconds / (len(layouts) * len(sizes) * one))))
    return round_robin({(i, k): functools.partial(timed_pass, m, caches[i], k) for k in sizes
                        for i, m in enumerate(layouts)}, repeats)


def choose_slab_rows(model: GPT2, sizes=SLAB_SIZES, prefix_len: int = 200, repeats: int = 9,
                     seconds: float = 3.0, tie: float = 1.05) -> int:
    """The largest block column slabs multiply at most `tie` times as slowly as one x @ w, 0 unless they do at the
    smallest size (`race`)."""
    sizes = fitting(sizes, model.config.n_ctx)
    ms = race([laid_out(model, 0), laid_out(model, max(sizes))], sizes, prefix_len, repeats, seconds)
    wins = [k for k in sizes if ms[1, k] <= tie * ms[0, k]]
    return max(wins) if sizes[0] in wins else 0


def choose_gemv_rows(model: GPT2, sizes=GEMV_SIZES, prefix_len: int = 200, repeats: int = 9,
                     seconds: float = 2.0) -> int:
    """The largest block up to which one matrix-vector product per row (`Layout.gemv_rows`) is faster, at every size,
    than the model's layout; 1 unless it is at the smallest (`race`)."""
    sizes = fitting(sizes, model.config.n_ctx)
    ms, best = race([model, laid_out(model, gemv_rows=max(sizes))], sizes, prefix_len, repeats, seconds), 1
    for k in sizes:  # from the smallest, while row by row stays faster
        if ms[1, k] >= ms[0, k]:
            break
        best = k
    return best


def choose_one_row(model: GPT2, prefix_len: int = 200, repeats: int = 15, seconds: float = 2.0) -> str:
    """How the layer matrices multiply one row (`Layout.one_row`): the way whose one-token pass is faster (`race`;
    OpenBLAS runs a slab's product on one thread)."""
    ms = race([laid_out(model, max(1, model.layout.slab_rows), one_row=how) for how in ONE_ROW], (1,), prefix_len,
              repeats, seconds)
    return min(ONE_ROW, key=lambda how: ms[ONE_ROW.index(how), 1])


def with_one_row(layout: dict, model: GPT2, name: str) -> dict:
    """`layout` with how `model` (its `name`) multiplies one row, `choose_one_row`'s, with the BLAS threads the costs
    are measured with (name_one_row) and with one (name_one_row_one_thread: a busy machine's run, as
    `machine.settle_threads` leaves it; a kernel's fastest way can differ), and slabs at least for one row where
    either way reads them."""
    ways = {name + "_one_row": choose_one_row(model)}
    if blas()["threads"] == 1:
        ways[name + "_one_row_one_thread"] = ways[name + "_one_row"]
    else:
        with threadpool_limits(1, user_api="blas"):
            ways[name + "_one_row_one_thread"] = choose_one_row(model)
    slabs = max(1, layout[name]) if set(ways.values()) != {"gemv"} else layout[name]
    return layout | ways | {name: slabs}


def loop_curves(target: GPT2, draft: GPT2 | None, sizes=LOOP_SIZES, prefix_len: int = 200, repeats: int = 9,
                progress=None) -> dict:
    """{"target": {"warm": {k: ms}, "cold": ...}, "draft": ...}: a pass of k tokens right after one of the same
    model (warm) or of the other (cold: its weights may be out of the cache); medians of `repeats` rounds (5 let a
    shared host's noise reorder neighbouring sizes, and the plans priced on them; more lengthen a first run)."""
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
