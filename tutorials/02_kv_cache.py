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
import time

import numpy as np

from specdec_np.gpt2 import KVCache, forward, new_cache
from specdec_np.models import load_model
from specdec_np.tools.costcurve import block_cost_ms, last_level_cache, last_level_cache_bytes, streaming_gbps
from specdec_np.tokenizer import decode, encode, get_encoding

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
# bytes divided by the rate give a floor on the time of one decoding step. The measured step is
# above it: a forward pass also does work that is not a weight product (LayerNorms, attention
# over the cache, Python), and its many small products do not reach the rate of one large one.

# %%
from_memory, from_cache = streaming_gbps()  # GB/s: a matrix twice the last-level cache, and one half its size
llc = last_level_cache_bytes()
step_ms = block_cost_ms(model, [1], prefix_len=len(prompt), repeats=9)[1]
fits = "" if llc is None else " (the weights fit)" if model.weight_bytes <= llc else " (the weights do not fit)"
print(f"weights read per token:     {model.weight_bytes / 1e6:6.1f} MB ({model.n_params / 1e6:.1f}M float32)")
print(f"last-level cache:           {last_level_cache() or 'unknown'}{fits}")
for where, gbps in (("from memory", from_memory), ("from the cache", from_cache)):
    floor_ms = model.weight_bytes / (gbps * 1e9) * 1e3
    print(f"{'streamed ' + where + ':':<27} {gbps:6.1f} GB/s => floor {floor_ms:.2f} ms per token")
print(f"measured one-token step:    {step_ms:6.2f} ms")

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
t_cached = t_full = 0.0
ms_full = []
for _ in range(n_new):
    tok = int(np.argmax(next_logits))
    seq.append(tok)

    t0 = time.perf_counter()
    cached = forward(model, [tok], cache)[-1]  # one new token: [1, n_vocab] -> [n_vocab]
    t1 = time.perf_counter()
    full = forward(model, seq, KVCache(cfg, capacity=len(seq)))[-1]  # the whole sequence again
    t2 = time.perf_counter()
    t_cached += t1 - t0
    t_full += t2 - t1
    ms_full.append(1e3 * (t2 - t1))

    assert np.allclose(cached, full, atol=1e-4, rtol=1e-4), "cached and recomputed logits differ"
    next_logits = cached

print("completion:", repr(decode(enc, seq[len(prompt):])))
print(f"with the cache:    {1e3 * t_cached / n_new:6.2f} ms per token (one token per pass)")
print(f"without the cache: {1e3 * t_full / n_new:6.2f} ms per token "
      f"(first step {ms_full[0]:.1f} ms over {len(prompt) + 1} tokens, last {ms_full[-1]:.1f} ms over {len(seq)})")

# The cache now holds exactly the K/V a fresh prefill of the whole sequence would compute.
fresh = new_cache(model)
forward(model, seq, fresh)
L = cache.length
assert L == len(seq) == fresh.length
assert np.allclose(cache.k[:, :, :L], fresh.k[:, :, :L], atol=1e-5)
assert np.allclose(cache.v[:, :, :L], fresh.v[:, :, :L], atol=1e-5)
print("OK: the cached and the recomputed logits agree at every step, and so do the stored K/V")

# %% [markdown]
# ## What this means for speculative decoding
#
# Without the cache, cost grows with the sequence. With it, each token costs one pass that
# mostly waits for the weights. Feeding *several* tokens into that one pass (rows of a
# matrix-matrix product instead of a vector) reuses each fetched weight several times, so it
# costs much less than several passes. Speculative decoding exploits exactly that: guess a few
# tokens cheaply, then check them all in one pass of the big model. Lesson 7 measures how many
# tokens fit in a pass on this machine before it stops being nearly free.
