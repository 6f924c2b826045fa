# %% [markdown]
# # Lesson 2: the KV cache, and what a pass over several tokens costs
#
# You will time a forward pass over 1 to 8 new tokens on this machine and see what it costs against
# a pass over one. You will look inside the KV cache and decode greedily with and without it,
# checking that both give the same logits. Then you will time one step both ways, to see why the
# cache makes a step cost one token.
#
# Generating text is a loop: run the model, pick the next token, append it, repeat. Three facts
# about that loop motivate everything in the later lessons:
#
# 1. **Each step re-reads every weight.** With one new token, every linear layer is a
#    vector-matrix product: 2 floating-point operations per weight, and each float32 weight is
#    4 bytes fetched from memory (or from a cache, if the weights fit in it). That is 0.5 FLOP per
#    byte, far below what a CPU core can compute per byte it loads: the step is limited by how
#    fast the weights arrive rather than by arithmetic.
# 2. **So a pass over k new tokens should cost much less than k passes.** The weights are fetched
#    once per pass whatever k is; k rows reuse each one. This is the premise of speculative
#    decoding: checking k guesses in one pass costs less than k steps. We measure how much less
#    on this machine first.
# 3. **The KV cache makes a step cost one token, not the whole sequence.** A token's keys and
#    values never change once computed (causal attention: the past never sees the future), so
#    they are stored and each step only computes the new token's.

# %%
import numpy as np

from specdec_np.gpt2 import KVCache, forward, new_cache
from specdec_np.models import load_model
from specdec_np.tokenizer import decode, encode, get_encoding
try:
    from lesson import check, print_timed, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/02_kv_cache.py")

model = load_model("tiny-target")
cfg = model.config
enc = get_encoding(cfg.n_vocab)
prompt = encode(enc, "import numpy as np\n\n\ndef mean(xs):\n    \"\"\"Average of a list.\"\"\"\n")

# %% [markdown]
# ## The premise, measured
#
# `pass_ms` (from `tutorials/lesson.py`, the lessons' timing helper) times one forward pass of k new
# tokens after the prompt, already in the KV cache (the next section shows what that holds).
# Figures are medians after a warm-up, the sizes timed in turns so that a burst of noise lands on
# all of them a little. Each cost is shown as a ratio to one token's, next to k, what k separate
# passes would cost.
#
# The table times every pass three times, with the same numbers computed three ways. **"one x @ w"**:
# each of the model's matrix products is one NumPy product of the k rows by the whole weight matrix
# `[n_in, n_out]`. **"slabs"**: the weight matrix is also kept cut into column slabs of 64 columns
# (`[n_out / 64, n_in, 64]`, `fastpath.Weight`), and the k rows are multiplied by every slab in one
# batched call, the outputs put side by side. **"row by row"**: each of the k rows is multiplied by
# the whole matrix on its own, one matrix-vector product per row (`Layout.gemv_rows`).
#
# The BLAS library (OpenBLAS under NumPy) copies the weights into a scratch layout before a matrix
# product of several rows; for a few rows that copy can cost more than the arithmetic. The small
# slab products skip it on some CPUs' kernels; a matrix-vector product never makes it, and the rows
# after the first find the matrix in the cache. So which column is faster depends on the machine:
# lesson 10 looks inside, and the tools use whichever wins on each machine.

# %%
from lesson import blas_name, last_level_cache, memory_gbps, one_blas_thread_if_busy, pass_ms, say_if_busy  # noqa: E402
from lesson import bends, row_by_row, start_timing, verdict, with_slabs  # noqa: E402

one_blas_thread_if_busy()
KS = [1, 2, 4, 8]
start = start_timing()
laid = {"one x @ w": with_slabs(model, 0), "slabs": with_slabs(model, 16), "row by row": row_by_row(model, 16)}
runs = {name: {} for name in laid}  # each size's 9 timings (ms), for the verdict's range
layouts = {name: pass_ms(m, KS, prefix_len=len(prompt), repeats=9, runs=runs[name]) for name, m in laid.items()}
from_memory, from_cache = memory_gbps()  # GB/s: one large matrix-vector product, out of memory and out of the cache
print_timed(f"BLAS: {blas_name()}; last-level cache: {last_level_cache() or 'unknown'}")
print(f"{'new tokens k':>12} " + " ".join(f"{name + ': ms':>16} {'vs one':>7}" for name in layouts)
      + f" {'k passes':>9}")
for k in KS:
    print_timed(f"{k:>12} " + " ".join(f"{c[k]:>16.2f} {c[k] / c[1]:>6.2f}x" for c in layouts.values()) + f" {k:>8}x")
for name, c in layouts.items():  # what a 1-token pass costs here, measured (the ratios above divide by it)
    print_timed(f"{name}: a 1-token pass costs {c[1]:.2f} ms here, a 2-token one {c[2]:.2f} ms ({c[2] / c[1]:.2f}x)")
    if line := bends(c):
        print_timed(f"{name}: {line}")
fastest = {k: min(c[k] for c in layouts.values()) for k in KS}  # ms, whichever layout was faster at k
best = min(layouts, key=lambda name: layouts[name][8])  # the faster layout at 8
r8 = [a / b for a, b in zip(runs[best][8], runs[best][1])]  # round by round: the sizes were timed in turns
print_timed(f"a pass over 8 new tokens ({best}) against a pass over one: "
            + verdict(r8, 8, "no less than 8 passes", "less per token than 8 passes", "x"))
step_ms = fastest[1]
W = model.weight_bytes
rate = W / step_ms / 1e6  # GB/s
print_timed(f"a one-token pass reads {W / 1e6:.1f} MB of weights in {step_ms:.2f} ms: {rate:.1f} GB/s, "
      f"{'faster' if rate > from_memory else 'slower'} than one large product streams from memory "
      f"({from_memory:.1f} GB/s; {from_cache:.1f} GB/s out of the cache)")
say_if_busy(start)

# %% [markdown]
# The last line is a measure, not a bound. Where a pass streams its weights faster than memory
# can deliver them, part of them stayed in the cache between passes (weights of the size printed
# above sit whole in some servers' caches of hundreds of MB); where it is slower, the pass also
# did work that is not streaming weights (LayerNorms, attention over the cache, Python), and its
# many small products do not reach the rate of one large one. Either way the ratios above are what speculative
# decoding has to work with on this machine: lesson 8 turns them into a tree size.

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


def decode_both_ways(feed_cache):
    """Greedy decoding from the prompt, each step's token fed to the cache `feed_cache(cache)` returns and the whole
    sequence recomputed; their logits must agree at every step (the loop stops at the first that differs). The
    sequence and the cache."""
    cache = new_cache(model)
    next_logits = forward(model, prompt, cache)[-1]  # prefill
    seq = list(prompt)
    for step in range(1, n_new + 1):
        tok = int(np.argmax(next_logits))
        seq.append(tok)
        cached = forward(model, [tok], feed_cache(cache))[-1]  # one new token: [1, n_vocab] -> [n_vocab]
        full = forward(model, seq, KVCache(cfg, capacity=len(seq)))[-1]  # the whole sequence again
        if not check(np.allclose(cached, full, atol=1e-4, rtol=1e-4), f"step {step}: cached and recomputed logits differ"):
            break
        next_logits = cached
    return seq, cache


def feed(cache):  # the cache each step feeds its token to
    return cache  # the cache of the steps before


probe = new_cache(model)
try_this("a new cache each step", feed(probe) is not probe)
seq, cache = decode_both_ways(feed)
print("completion:", repr(decode(enc, seq[len(prompt):])))

# The cache now holds exactly the K/V a fresh prefill of the whole sequence would compute.
fresh = new_cache(model)
forward(model, seq, fresh)
L = cache.length
if check(L == len(seq) == fresh.length and np.allclose(cache.k[:, :, :L], fresh.k[:, :, :L], atol=1e-5)
         and np.allclose(cache.v[:, :, :L], fresh.v[:, :, :L], atol=1e-5),
         f"the cache holds {L} tokens' K/V, not the {len(seq)} of the sequence"):
    print("OK: the cached and the recomputed logits agree at every step, and so do the stored K/V")

# %% [markdown]
# Now the cost of one step, both ways, at the first step's length and at the last one's. Each
# figure is a median of 9 passes after a warm-up, and the four are timed in turns, so a burst of
# noise lands on all of them a little rather than on one a lot. (Timing the loop above step by
# step would give single passes, each one a sample of the noise.)

# %%
from lesson import median_ms, timing_rounds  # noqa: E402


def cached_step(n):  # one token after a cache of n - 1 tokens
    c = new_cache(model)
    forward(model, seq[:n - 1], c)
    return lambda: (forward(model, [seq[n - 1]], c), c.truncate(n - 1))


def full_step(n):  # the whole sequence of n tokens, no cache
    return lambda: forward(model, seq[:n], KVCache(cfg, capacity=n))


first, last = len(prompt) + 1, len(seq)
fns = {("cache", first): cached_step(first), ("cache", last): cached_step(last),
       ("full", first): full_step(first), ("full", last): full_step(last)}
start = start_timing()
times = {key: [] for key in fns}
for _ in range(1 + timing_rounds(8)):  # a warm-up round, then 8
    for key, fn in fns.items():
        times[key].append(median_ms(fn, repeats=1, warmup=0))
ms = {key: float(np.median(t[1:])) for key, t in times.items()}  # round 1 was the warm-up
print(f"{'':<18} {f'{first} tokens':>10} {f'{last} tokens':>10}")
print_timed(f"{'with the cache:':<18} {ms['cache', first]:>7.2f} ms {ms['cache', last]:>7.2f} ms   (one token per pass)")
print_timed(f"{'without the cache:':<18} {ms['full', first]:>7.2f} ms {ms['full', last]:>7.2f} ms   (the whole sequence)")
print_timed(f"at {last} tokens a step without the cache cost {ms['full', last] / ms['cache', last]:.1f}x a cached one")
say_if_busy(start)

# %% [markdown]
# Recomputing the sequence is a pass over all of its tokens: its work grows with the sequence.
# The cached step stays a one-token pass, plus attention over a cache that grows by one row per
# token.
#
# ## What this means for speculative decoding
#
# With the cache each token costs one pass that mostly waits for the weights, and a pass over a
# few tokens costs the ratio measured at the top, not k passes. Speculative decoding exploits
# exactly that: guess a few tokens cheaply, then check them all in one pass of the big model.
# Lesson 8 measures the whole curve on this machine and reads off how many tokens a pass should
# carry.

# %% [markdown]
# ## Try this
#
# * Take one core away (`python3 -c 'while True: pass' &`, then `kill %1` afterwards) and rerun:
#   look at the note under each table and at how the ratios to one token move.
# * Add 3, 5 and 16 to `KS`: where does a pass stop costing about the same per extra token?
# * Forget the cache in the decoding loop: feed each step's token to a new cache (in `feed`,
#   `return new_cache(model)`). The model then sees only the new token, the logits no longer match
#   the recomputed ones at the first step, and the check stops the loop there. Checked:

# %%
def check_forgetful(feed_cache):
    """The third prediction, for the cache each step feeds (to hold: a new one): the loop's check stops it at the
    first step; the check's message."""
    try:
        seq, _ = decode_both_ways(feed_cache)  # under the edit, the check says so and the loop stops
    except AssertionError as stopped:
        return str(stopped)
    assert len(seq) == len(prompt) + 1, f"the loop ran {len(seq) - len(prompt)} steps: its logits agreed"
    return "step 1: cached and recomputed logits differ"


print(f"a new cache each step: the loop stops with {check_forgetful(lambda cache: new_cache(model))!r}")
