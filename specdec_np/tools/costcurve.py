"""This machine's cost curve: milliseconds of one forward pass against the number of tokens in the block.

At batch 1 a decoder step reads every weight once for ~0.5 FLOP per byte of float32 weights, so it
is bound by memory bandwidth; a block of k tokens reads the same weights for k times the arithmetic.
How many tokens are "free" decides how big a verification tree pays off. Passes are timed
round-robin (one of each size per round, round 0 a warm-up), so that a burst of noise on a shared
machine lands on every size a little instead of on a few a lot (which would bend the curve).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from ..fastpath import Weight, matmul
from ..gpt2 import GPT2_SHAPES, GPT2, forward, new_cache, random_params


def median_ms(fn, repeats: int = 7, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def matvec_gbps(rows: int = 32768, cols: int = 4096, repeats: int = 9) -> float:
    """Weight-streaming rate of one float32 rows x cols matrix-vector product (GB/s)."""
    w = np.full((rows, cols), 0.5, dtype=np.float32)  # the values do not change the time
    x = np.full(rows, 0.5, dtype=np.float32)
    ms = median_ms(lambda: x @ w, repeats=repeats)
    return w.nbytes / (ms / 1000) / 1e9


def last_level_cache_bytes() -> int | None:
    """The size of the CPU's largest cache in bytes, as Linux reports it (None if unknown)."""
    kib = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()  # e.g. "32768K"
            kib.append(int(text.rstrip("KMG")) * {"K": 1, "M": 1024, "G": 1 << 20}.get(text[-1], 1))
        except (OSError, ValueError):
            pass
    return max(kib) * 1024 if kib else None


def last_level_cache() -> str:
    """The size of the CPU's largest cache in words, e.g. "32 MB" ("" if unknown)."""
    size = last_level_cache_bytes()
    if size is None:
        return ""
    return f"{size >> 20} MB" if size >= 1 << 20 else f"{size >> 10} KB"


def streaming_gbps(repeats: int = 5) -> tuple[float, float]:
    """(from memory, from the last-level cache): the rates of a matrix-vector product over a matrix
    twice the last-level cache (at least 256 MB), and over one half its size (16 MB if unknown): which
    one bounds a pass depends on whether the weights fit in that cache (on a VM, up to 480 MB)."""
    llc = last_level_cache_bytes()
    big_rows = max(1 << 14, 2 * (llc or 0) // (4 * 4096))
    small_rows = max(1, (llc or 32 << 20) // 2 // (4 * 2048))
    return matvec_gbps(big_rows, 4096, repeats), matvec_gbps(small_rows, 2048, repeats)


def primed(model: GPT2, prefix_len: int, max_block: int):
    """A KV cache holding a prefix of `prefix_len` tokens."""
    cache = new_cache(model, max_block=max_block)
    forward(model, np.arange(prefix_len) % model.config.n_vocab, cache)
    return cache


def timed_pass(model: GPT2, cache, k: int) -> float:
    """Seconds of one forward pass of k new tokens after the cache's prefix, which is kept as it was."""
    length = cache.length
    t = time.perf_counter()
    forward(model, np.arange(k) % model.config.n_vocab, cache)
    seconds = time.perf_counter() - t
    cache.truncate(length)
    return seconds


def block_cost_ms(model: GPT2, block_sizes, prefix_len: int = 128, repeats: int = 7) -> dict:
    """Median ms of one forward pass of k new tokens after a cached prefix, for each k (round-robin)."""
    cache = primed(model, prefix_len, max(block_sizes))
    times = {k: [] for k in block_sizes}
    for _ in range(repeats + 1):
        for k in block_sizes:
            times[k].append(timed_pass(model, cache, k))
    return {k: 1000 * float(np.median(ts[1:])) for k, ts in times.items()}


def gpt2_shapes_report(names=("gpt2", "gpt2-medium", "gpt2-large"), block_sizes=(1, 2, 4, 8, 16, 32),
                       prefix_len: int = 128, repeats: int = 5, out=print) -> dict:
    """ms per decode step / verification block for GPT-2 shapes with random weights, and GB/s."""
    ref, cached = streaming_gbps()
    out(f"reference: a float32 matrix-vector product streams {ref:.1f} GB/s from memory "
        f"({cached:.1f} GB/s from the last-level cache)")
    out(f"{'model':<12} {'params':>8} " + " ".join(f"{f'{k} tok ms':>10}" for k in block_sizes)
        + f" {'GB/s @1':>8} {'vs ref':>7}")
    report = {"reference_gbps": ref, "in_cache_gbps": cached, "models": {}}
    for name in names:
        model = random_params(GPT2_SHAPES[name], seed=0, dtype=np.float32)
        ms = block_cost_ms(model, block_sizes, prefix_len=prefix_len, repeats=repeats)
        gbps = model.weight_bytes / (ms[block_sizes[0]] / 1000) / 1e9
        out(f"{name:<12} {model.n_params / 1e6:>7.0f}M " + " ".join(f"{ms[k]:>10.2f}" for k in block_sizes)
            + f" {gbps:>8.1f} {gbps / ref:>6.0%}")
        report["models"][name] = {"ms": ms, "gbps": gbps, "fraction_of_reference": gbps / ref}
        del model
    return report


def fitting(sizes, n_ctx: int) -> tuple:
    """The sizes a context of n_ctx holds after a prefix of a quarter of it (at least the smallest)."""
    return tuple(k for k in sizes if k <= n_ctx * 3 // 4) or sizes[:1]


def laid_out(model: GPT2, slab_rows: int) -> GPT2:
    """`model` with its products reading column slabs for blocks of up to `slab_rows` rows
    (`fastpath.prepare`; 0: never): the same numbers, another speed."""
    return model if model.slab_rows == slab_rows else dataclasses.replace(model, slab_rows=slab_rows)


def apply_layout(layout: dict, target, draft):
    """(target, draft) with a measured layout's slab rows ({"target": rows, ...}: `laid_out`) and
    padding tables ({"target_pad": table, ...}: `costmodel.pads`); a model it does not name is left as it is."""
    def lay(model, name):
        if model is not None and name in layout:
            model = laid_out(model, layout[name])
        if model is not None and name + "_pad" in layout:
            model = model.with_padding(layout[name + "_pad"])
        return model
    return lay(target, "target"), lay(draft, "draft")


SLAB_SIZES = (2, 4, 8, 12, 16)  # the block sizes `choose_slab_rows` compares the layouts at


def choose_slab_rows(model: GPT2, sizes=SLAB_SIZES, prefix_len: int = 200, repeats: int = 9,
                     seconds: float = 3.0, tie: float = 1.05) -> int:
    """The largest block this machine's BLAS multiplies from column slabs at most `tie` times as slowly
    as with one x @ w, provided the slabs do at the smallest size (0: none; between two sizes where
    slabs win, they win too). Both layouts timed side by side, round-robin, medians of `repeats`
    (fewer where they would take more than about `seconds`); sizes the context holds (`fitting`)."""
    sizes = fitting(sizes, model.config.n_ctx)
    layouts = laid_out(model, 0), laid_out(model, max(sizes))
    caches = [primed(m, min(prefix_len, model.config.n_ctx - max(sizes)), max(sizes)) for m in layouts]
    one = timed_pass(layouts[1], caches[1], max(sizes))
    repeats = max(2, min(repeats, int(seconds / (2 * len(sizes) * one))))
    times = {(i, k): [] for i in range(2) for k in sizes}
    for _ in range(repeats + 1):
        for k in sizes:
            for i, m in enumerate(layouts):
                times[i, k].append(timed_pass(m, caches[i], k))
    wins = [k for k in sizes if np.median(times[1, k][1:]) <= tie * np.median(times[0, k][1:])]
    return max(wins) if sizes[0] in wins else 0


def matrix_report(models: dict, rows=(1, 2, 4, 8, 16), stream_mb: int = 96, out=print) -> dict:
    """µs per product of k rows by each distinct weight matrix of `models` ({name: GPT2}), with one
    x @ w and from column slabs (`fastpath.Weight`), read from memory as in a pass (copies totalling
    `stream_mb` MB cycled; medians over three cycles): {"name n_in x n_out": {layout: {k: us}}}."""
    report = {}
    out(f"{'matrix':<22} " + " ".join(f"{f'k={k} x@w':>9} {'slabs':>6}" for k in rows))
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
            times = {}
            for k in rows:
                x = rng.standard_normal((k, n_in), dtype=np.float32)
                for layout, ws in (("x @ w", plain), ("slabs", weights)):
                    ts = []
                    for i in range(3 * copies):
                        t = time.perf_counter()
                        matmul(x, ws[i % copies])
                        ts.append(time.perf_counter() - t)
                    times.setdefault(layout, {})[k] = 1e6 * float(np.median(ts[copies:]))
            key = f"{name} {n_in}x{n_out}"
            report[key] = times
            out(f"{key:<22} " + " ".join(f"{times['x @ w'][k]:>9.0f} {times['slabs'][k]:>6.0f}" for k in rows))
            del weights, plain
    return report


# Block sizes the decoding loop meets; others are interpolated, larger ones extrapolated (costmodel.interp).
LOOP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)


def loop_curves(target: GPT2, draft: GPT2 | None, sizes=LOOP_SIZES, prefix_len: int = 200, repeats: int = 5,
                progress=None) -> dict:
    """ms per forward pass of k tokens as the decoding loop meets them: "warm", right after a pass of
    the same model, and "cold", right after the other model's (a target pass after drafting, a step's
    first draft pass), which may have pushed this model's weights out of the cache. {"target":
    {"warm": {k: ms}, "cold": ...}, "draft": ...}: medians of `repeats` rounds; sizes as `fitting`."""
    models = {"target": target} if draft is None else {"target": target, "draft": draft}
    sizes = fitting(sizes, min(m.config.n_ctx for m in models.values()))
    prefix_len = min([prefix_len] + [m.config.n_ctx - max(sizes) for m in models.values()])
    caches = {name: primed(model, prefix_len, max(sizes)) for name, model in models.items()}
    states = ("warm", "cold") if draft is not None else ("warm",)
    times = {name: {state: {k: [] for k in sizes} for state in states} for name in models}
    for r in range(repeats + 1):
        for name, model in models.items():
            for k in sizes:
                for state in states:
                    before = name if state == "warm" else next(m for m in models if m != name)  # the pass just before
                    timed_pass(models[before], caches[before], 1)
                    times[name][state][k].append(timed_pass(model, caches[name], k))
        if progress:
            progress(r + 1, repeats + 1)
    return {name: {state: {k: 1000 * float(np.median(ts[1:])) for k, ts in per.items()}
                   for state, per in states.items()} for name, states in times.items()}
