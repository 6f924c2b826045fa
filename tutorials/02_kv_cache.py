# %% [markdown]
# # Lesson 2: the KV cache, and why decoding is memory-bound
#
# Generating text is a loop: run the model, pick the next token, append it, repeat. Two facts
# about that loop motivate everything in the later lessons:
#
# 1. **Each step re-reads every weight.** With one new token, every linear layer is a
#    vector-matrix product: 2 floating-point operations per weight, and each float32 weight is
#    4 bytes fetched from memory. That is 0.5 FLOP per byte, far below what a CPU can compute per
#    byte it can load, so the step waits on memory: time per token >= weight bytes / bandwidth.
# 2. **The KV cache makes a step cost one token, not the whole sequence.** A token's keys and
#    values never change once computed (causal attention: the past never sees the future), so
#    they are stored and each step only computes the new token's.

# %%
import numpy as np

from specdec_np.gpt2 import KVCache, forward, new_cache
from specdec_np.models import load_model
from specdec_np.tools.costcurve import block_cost_ms, last_level_cache, last_level_cache_bytes, streaming_gbps
from specdec_np.tokenizer import decode, encode, get_encoding
from specdec_np.tools.lesson import print_timed  # marks the lines measured on this machine

model = load_model("tiny-target")
cfg = model.config
enc = get_encoding(cfg.n_vocab)
prompt = encode(enc, "import numpy as np\n\n\ndef mean(xs):\n    \"\"\"Average of a list.\"\"\"\n")

# %% [markdown]
# ## The memory-bound floor
#
# A vector-matrix product over one large float32 matrix measures the rate at which this machine
# can feed weights to the arithmetic. The rate depends on where the weights come from: a matrix
# larger than every cache streams from memory, a smaller one can stay in the last-level cache and
# stream several times faster (`streaming_gbps` measures both). So which floor holds for a model
# depends on whether its weights fit in that cache: the tiny target's 41 MB stream from memory
# through a 32 MB cache (an AMD EPYC VM) but stay in a 480 MB one (an Intel Xeon VM). Weight
# bytes divided by the rate give a floor on the time of one decoding step. Where the weights
# exceed the cache only partly, the best case is that a cache's worth of them stays there and
# the rest streams from memory, so the floor counts each share at its own rate.
#
# The claims below are checked against what this run measures: the cache streams at least as
# fast as memory, and the measured step is above the floor (a forward pass also does work that is
# not a weight product: LayerNorms, attention over the cache, Python; and its many small products
# do not reach the rate of one large one). Timings are medians after warm-ups, so a burst of
# noise moves them little; if a figure still contradicts a claim, the lesson says so in one line
# and why, using the tools' measure of how much CPU other processes took meanwhile.

# %%
from specdec_np.tools.costcurve import median_ms  # noqa: E402
from specdec_np.tools.machine import cpu_times, note, settle_threads  # noqa: E402

if busy := settle_threads():  # OpenBLAS's threads stall while another process holds a core
    print_timed(f"note: {busy}: timing with one BLAS thread")

start = cpu_times()
from_memory, from_cache = streaming_gbps()  # GB/s: a matrix twice the last-level cache, and one half its size
llc = last_level_cache_bytes()
step_ms = block_cost_ms(model, [1], prefix_len=len(prompt), repeats=15)[1]  # median of 15 after a warm-up
W = model.weight_bytes
cached_share = W if llc is None else min(W, llc)  # unknown cache size: the most optimistic floor
floor_ms = (cached_share / from_cache + (W - cached_share) / from_memory) / 1e6
fits = "" if llc is None else " (the weights fit)" if W <= llc else " (the weights do not fit)"
print(f"weights read per token:     {W / 1e6:6.1f} MB ({model.n_params / 1e6:.1f}M float32)")
print(f"last-level cache:           {last_level_cache() or 'unknown'}{fits}")
print_timed(f"streamed from memory:       {from_memory:6.1f} GB/s")
print_timed(f"streamed from the cache:    {from_cache:6.1f} GB/s ({from_cache / from_memory:.1f}x memory's rate)")
print_timed(f"floor: {cached_share / 1e6:.1f} MB from the cache, {(W - cached_share) / 1e6:.1f} MB from memory "
      f"=> {floor_ms:.2f} ms per token")
print_timed(f"measured one-token step:    {step_ms:6.2f} ms ({step_ms / floor_ms:.1f}x the floor)")
if from_cache < from_memory:
    note(start, f"the cache streamed slower than memory ({from_cache:.1f} < {from_memory:.1f} GB/s)",
         "the cache size Linux reports may be shared or wrong on this VM")
else:
    note(start, "" if step_ms >= floor_ms else f"the step ({step_ms:.2f} ms) beat the floor ({floor_ms:.2f} ms)",
         "the streaming rates were measured low: rerun to measure them again")

# %% [markdown]
# ## What the cache stores
#
# For every layer and head, one key and one value vector per token: `k, v` are
# `[n_layer, n_head, capacity, head_dim]`, preallocated, with `length` slots filled. A forward pass
# writes the new tokens' K/V at slots `length, length+1, ...` and advances `length`.

# %%
cache = new_cache(model)
logits = forward(model, prompt, cache)  # prefill: the whole prompt in one pass, [n, n_vocab]
per_token = 2 * cfg.n_layer * cfg.n_embd * cache.k.itemsize  # keys + values of one token
print(f"cache.k: {cache.k.shape} (n_layer, n_head, capacity, head_dim), length {cache.length}")
print(f"one token's K and V: {per_token} bytes; the prompt's: {per_token * cache.length / 1e3:.0f} kB")
assert cache.length == len(prompt)

# %% [markdown]
# ## Decoding with and without the cache
#
# Greedy decoding, twice. *With* the cache each step feeds one token. *Without* it, each step
# recomputes the whole sequence from scratch and keeps only the last row of logits. Both are
# driven by the same tokens, so their logits must agree at every step.

# %%
n_new = 24
seq = list(prompt)
next_logits = logits[-1]
for _ in range(n_new):
    tok = int(np.argmax(next_logits))
    seq.append(tok)
    cached = forward(model, [tok], cache)[-1]  # one new token: [1, n_vocab] -> [n_vocab]
    full = forward(model, seq, KVCache(cfg, capacity=len(seq)))[-1]  # the whole sequence again
    assert np.allclose(cached, full, atol=1e-4, rtol=1e-4), "cached and recomputed logits differ"
    next_logits = cached
print("completion:", repr(decode(enc, seq[len(prompt):])))

# The cache now holds exactly the K/V a fresh prefill of the whole sequence would compute.
fresh = new_cache(model)
forward(model, seq, fresh)
L = cache.length
assert L == len(seq) == fresh.length
assert np.allclose(cache.k[:, :, :L], fresh.k[:, :, :L], atol=1e-5)
assert np.allclose(cache.v[:, :, :L], fresh.v[:, :, :L], atol=1e-5)
print("OK: the cached and the recomputed logits agree at every step, and so do the stored K/V")

# %% [markdown]
# Now the cost of one step, both ways, at the first step's length and at the last one's. Each
# figure is a median of 9 passes after a warm-up, and the four are timed in turns, so a burst of
# noise lands on all of them a little rather than on one a lot. (Timing the loop above step by
# step would give single passes, each one a sample of the noise.)

# %%
def cached_step(n):  # one token after a cache of n - 1 tokens
    c = new_cache(model)
    forward(model, seq[:n - 1], c)
    return lambda: (forward(model, [seq[n - 1]], c), c.truncate(n - 1))


def full_step(n):  # the whole sequence of n tokens, no cache
    return lambda: forward(model, seq[:n], KVCache(cfg, capacity=n))


first, last = len(prompt) + 1, len(seq)
fns = {("cache", first): cached_step(first), ("cache", last): cached_step(last),
       ("full", first): full_step(first), ("full", last): full_step(last)}
start = cpu_times()
times = {key: [] for key in fns}
for _ in range(9):
    for key, fn in fns.items():
        times[key].append(median_ms(fn, repeats=1, warmup=0))
for fn in fns.values():
    fn()  # (after the loop, so that the first round above is not the only cold one)
ms = {key: float(np.median(t[1:])) for key, t in times.items()}  # round 1 was the warm-up
print(f"{'':<18} {f'{first} tokens':>10} {f'{last} tokens':>10}")
print_timed(f"{'with the cache:':<18} {ms['cache', first]:>7.2f} ms {ms['cache', last]:>7.2f} ms   (one token per pass)")
print_timed(f"{'without the cache:':<18} {ms['full', first]:>7.2f} ms {ms['full', last]:>7.2f} ms   (the whole sequence)")
print_timed(f"without the cache a step costs {ms['full', last] / ms['cache', last]:.1f}x a cached one at {last} tokens; "
      f"the cached step is the one-token step measured above ({step_ms:.2f} ms), give or take the longer cache")
if ms["full", last] <= ms["full", first]:
    note(start, f"recomputing {last} tokens was not slower than {first}",
         "at these lengths a pass is dominated by reading the weights, not by the tokens")
else:
    note(start, "" if ms["cache", last] < ms["full", first] else "a cached step was not cheaper than a full recompute",
         "unexpected: please report it")

# %% [markdown]
# ## What this means for speculative decoding
#
# Without the cache, cost grows with the sequence. With it, each token costs one pass that
# mostly waits for the weights. Feeding *several* tokens into that one pass (rows of a
# matrix-matrix product instead of a vector) reuses each fetched weight several times, so it
# costs much less than several passes. Speculative decoding exploits exactly that: guess a few
# tokens cheaply, then check them all in one pass of the big model. Lesson 8 measures how many
# tokens fit in a pass on this machine before it stops being nearly free.
