"""This machine's cost curve: milliseconds of one forward pass against the number of tokens in the block.

At batch 1 a decoder step reads every weight once and does ~0.5 FLOP per byte of float32 weights
(2 FLOPs per 4-byte weight), so it is bound by memory bandwidth; a block of k tokens reads the
same weights once for k times the arithmetic. How many tokens are "free" decides how big a
verification tree pays off. The reference for the memory bound is one large float32
matrix-vector product, measured in the same run.
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
    twice the last-level cache (at least 256 MB), and over one half its size (16 MB if unknown).
    Which one bounds a pass depends on whether the model's weights fit in that cache."""
    # Both sizes follow the cache: on a VM with a 480 MB cache a 64 MB matrix streamed at about 2x
    # the memory's rate, and a fixed 512 MB one would nearly fit there.
    llc = last_level_cache_bytes()
    big_rows = max(1 << 14, 2 * (llc or 0) // (4 * 4096))
    small_rows = max(1, (llc or 32 << 20) // 2 // (4 * 2048))
    return matvec_gbps(big_rows, 4096, repeats), matvec_gbps(small_rows, 2048, repeats)


def block_cost_ms(model: GPT2, block_sizes, prefix_len: int = 128, repeats: int = 7) -> dict:
    """Median ms of one forward pass of k new tokens after a cached prefix, for each k.

    The sizes are timed round-robin (one pass of each per round, `repeats` rounds) rather than
    one size at a time: on a shared machine a burst of noise then lands on every size a little,
    instead of on a few sizes a lot (which bends the curve the cost model and padding rely on).
    """
    cache = new_cache(model, max_block=max(block_sizes))
    forward(model, np.arange(prefix_len) % model.config.n_vocab, cache)
    times = {k: [] for k in block_sizes}
    for r in range(repeats + 1):  # round 0 warms up
        for k in block_sizes:
            toks = np.arange(k) % model.config.n_vocab
            t = time.perf_counter()
            forward(model, toks, cache)
            dt = time.perf_counter() - t
            cache.truncate(prefix_len)
            if r:
                times[k].append(dt)
    return {k: 1000 * float(np.median(ts)) for k, ts in times.items()}


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


def laid_out(model: GPT2, slab_rows: int) -> GPT2:
    """`model` with its products reading column slabs for blocks of up to `slab_rows` rows
    (`fastpath.prepare`; 0: never): the same numbers, another speed."""
    return model if model.slab_rows == slab_rows else dataclasses.replace(model, slab_rows=slab_rows)


def apply_layout(layout: dict, target, draft):
    """(target, draft) with the slab rows of a measured `layout` ({"target": rows, "draft": rows}: see
    `laid_out`) and its padding tables ({"target_pad": table, "draft_pad": table}: `costmodel.pads`,
    set as the models' `GPT2.padding`); a model it does not name, or None, is left as it is."""
    def lay(model, name):
        if model is not None and name in layout:
            model = laid_out(model, layout[name])
        if model is not None and name + "_pad" in layout:
            model = model.with_padding(layout[name + "_pad"])
        return model
    return lay(target, "target"), lay(draft, "draft")


def choose_slab_rows(model: GPT2, sizes=(2, 4, 8, 12, 16), prefix_len: int = 200, repeats: int = 9,
                     seconds: float = 3.0, tie: float = 1.05) -> int:
    """The largest block this machine's BLAS multiplies from column slabs about as fast as with
    one x @ w, or faster: the largest size where the slabs' pass costs at most `tie` times the
    other's, provided they do at 2 rows (0: none). Between two sizes where slabs win, they win
    too (a pass of 10 rows on slabs took half of one x @ w where 8 and 12 did). Both layouts are
    timed side by side, round-robin, medians of `repeats` (fewer for a model so slow that they
    would take more than about `seconds`)."""
    plain, slabbed = laid_out(model, 0), laid_out(model, max(sizes))
    prefix_len = min(prefix_len, model.config.n_ctx - max(sizes))
    caches = [new_cache(m, max_block=max(sizes)) for m in (plain, slabbed)]
    for m, cache in zip((plain, slabbed), caches):
        forward(m, np.arange(prefix_len) % model.config.n_vocab, cache)
    t = time.perf_counter()
    forward(slabbed, np.arange(max(sizes)) % model.config.n_vocab, caches[1])
    caches[1].truncate(prefix_len)
    repeats = max(2, min(repeats, int(seconds / (2 * len(sizes) * (time.perf_counter() - t)))))
    times = {(i, k): [] for i in range(2) for k in sizes}
    for r in range(repeats + 1):  # round 0 warms up
        for k in sizes:
            for i, m in enumerate((plain, slabbed)):
                t = time.perf_counter()
                forward(m, np.arange(k) % model.config.n_vocab, caches[i])
                if r:
                    times[i, k].append(time.perf_counter() - t)
                caches[i].truncate(prefix_len)
    wins = [k for k in sizes if np.median(times[1, k]) <= tie * np.median(times[0, k])]
    return max(wins) if sizes[0] in wins else 0


def matrix_report(models: dict, rows=(1, 2, 4, 8, 16), stream_mb: int = 96, out=print) -> dict:
    """µs per product of k rows by each distinct weight matrix of `models` ({name: GPT2}), with
    one x @ w and from column slabs (`fastpath.Weight`), the weights cold: copies totalling
    `stream_mb` MB are cycled so that each product reads its matrix from memory, as a pass does.
    Medians over three cycles. {f"{name} {n_in}x{n_out}": {"x @ w": {k: us}, "slabs": {k: us}}}."""
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


# Block sizes the decoding loop meets (trees, copies, a draft pass with its catch-up and guesses);
# other sizes are interpolated, larger ones extrapolated (costmodel.interp).
LOOP_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32)


def loop_curves(target: GPT2, draft: GPT2 | None, sizes=LOOP_SIZES, prefix_len: int = 200, repeats: int = 5,
                progress=None) -> dict:
    """ms per forward pass of k tokens, as the decoding loop meets them: "warm", right after a pass
    of the same model (plain decoding's steps, a draft's later passes in a step), and "cold", right
    after a pass of the other model (a target pass after drafting, a step's first draft pass), which
    may have pushed this model's weights out of the cache. {"target": {"warm": {k: ms}, "cold": ...},
    "draft": ...}; medians of `repeats` rounds, sizes timed round-robin so noise spreads evenly."""
    models = {"target": target} if draft is None else {"target": target, "draft": draft}
    prefix_len = min([prefix_len] + [m.config.n_ctx - max(sizes) for m in models.values()])  # a small model's context
    caches = {}
    for name, model in models.items():
        caches[name] = new_cache(model, max_block=max(sizes))
        forward(model, np.arange(prefix_len) % model.config.n_vocab, caches[name])
    times = {name: {"warm": {k: [] for k in sizes}, "cold": {k: [] for k in sizes}} for name in models}
    rounds = repeats + 1  # round 0 warms up
    for r in range(rounds):
        for name, model in models.items():
            other = "draft" if name == "target" else "target"
            for k in sizes:
                for state in times[name]:
                    if state == "cold" and other not in models:
                        continue
                    before = models[name if state == "warm" else other]  # the pass just before
                    forward(before, [1], caches[name if state == "warm" else other])
                    caches[name if state == "warm" else other].truncate(prefix_len)
                    t = time.perf_counter()
                    forward(model, np.arange(k) % model.config.n_vocab, caches[name])
                    dt = time.perf_counter() - t
                    caches[name].truncate(prefix_len)
                    if r:
                        times[name][state][k].append(dt)
        if progress:
            progress(r + 1, rounds)
    return {name: {state: {k: 1000 * float(np.median(ts)) for k, ts in per.items() if ts}
                   for state, per in states.items() if any(per.values())}
            for name, states in times.items()}
