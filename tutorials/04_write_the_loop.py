# %% [markdown]
# # Lesson 4: write the loop yourself
#
# Lesson 3 proved the rule on a 4-token table. The library's real loop is spread over
# `decode.py`, `methods.py` and `drafting.py`, because it also handles trees, stage 2, padding and
# statistics. Strip all that away and speculative decoding is one short function. You write it,
# in `tutorials/exercises/write_the_loop.py`, with four pieces only: `gpt2.forward` (a pass over new
# tokens after a KV cache), a `KVCache` (made by `gpt2.new_cache`; `truncate` forgets the tail),
# `sampling.process` (logits -> the distribution we sample from) and `sampling.Rand` (the only
# source of randomness: `draw` and `coin`). Nothing from `decode`, `methods`, `drafting` or `verify`.
#
# This lesson specifies the loop and the two checks it must pass, the way the library is checked:
# it emits exactly the library's tokens, and its output distribution, enumerated exactly over every
# random branch, is the target's. It holds no answer: that is lesson 4b
# (`tutorials/04b_the_loop_answer.py`), for once yours passes.
#
# One step of the loop, for k = 3 guesses:
#
#     committed: ... the cat            (both caches hold every committed token but the last, "cat")
#     1. draft   "cat" -> g1 -> g2 -> g3     k draft passes, one token each, g_i ~ q_i
#     2. target  ["cat", g1, g2, g3]         ONE pass: p_0 .. p_3, the target's distribution after each
#     3. rule    g1: coin min(1, p_0(g1)/q_1(g1)) ... first rejection at g_i: draw from norm(max(p - q, 0))
#                                             all accepted: a bonus token drawn from p_3
#     4. cache   cut both caches back to the committed text + the accepted guesses
#     5. emit    accepted guesses + the target's token (1 to k + 1 tokens per target pass)

# %%
import numpy as np

from specdec_np.gpt2 import forward, new_cache
from specdec_np.models import load_embedded
from specdec_np.sampling import Rand, process
from specdec_np.tokenizer import decode, encode
try:
    import lesson  # tutorials/lesson.py (it refuses python -O); its folder holds exercises/
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): "
                     "run python tutorials/lesson.py tutorials/04_write_the_loop.py")

target, draft, _, enc = load_embedded(dtype=np.float64)  # float64: token-exact comparisons below


# %% [markdown]
# ## The loop, specified
#
# `speculative_decode(target, draft, prompt, n_new, k, rand, settings=(0.0, None, None))` returns
# the `n_new` tokens after `prompt`; `settings` are `process`'s (temperature, top_k, top_p).
#
# * **Start.** Feed both models the prompt but its last token: each step starts from the last
#   committed token. Invariant: at the start of a step the target's cache holds every committed
#   token but the last. The draft's cache may lag further (it never sees the last guess of a fully
#   accepted chain): its first pass of a step feeds whatever it has not seen yet.
# * **Draft.** k draft passes, one new token each after the first: guess i is drawn from
#   q_i = `process(logits of the pass's last token, *settings)`.
# * **Verify.** One target pass over the last committed token and the k guesses: its k + 1 rows,
#   processed, are p_0 .. p_k, the target's distribution after each.
# * **Accept.** Lesson 3's rule, guess by guess: keep guess x_i with probability
#   min(1, p_{i-1}(x_i) / q_i(x_i)). At the first rejection the step's last token comes from the
#   residual max(p_{i-1} - q_i, 0) (`rand.draw` normalises it); if all k are kept, a bonus token
#   comes from p_k.
# * **Cut.** Both caches keep only the text committed before the step (its last token too, the one
#   this step fed first) and the accepted guesses: `truncate` forgets the rest (the draft's cache may
#   already hold less). The target's token that ends the step is not in either cache yet: the next
#   step feeds it first, which keeps the invariant.
# * **Emit** the accepted guesses and the target's token; stop once `n_new` tokens are out (a step
#   drafts its k guesses even when fewer are still wanted: keep the first `n_new`).
#
# Randomness goes through `rand` only, in this order each step: the k draws of the guesses, one
# coin per guess up to the first rejection, then one draw. In that order the loop emits the very
# tokens of the library's `generate(..., method="speculative")` with the same seed.

# %% [markdown]
# ## Your turn
#
# Write it in `tutorials/exercises/write_the_loop.py` (the stub has the signature and the building
# blocks), then run `make exercises`. Exercise 4 checks your loop on a tiny random target and draft:
# at temperature 0 and with a seed it must emit `generate`'s tokens, and the distribution of its
# first tokens must be the target's, enumerated exactly. A wrong line names the first token that
# differs and a command that reruns that case alone.
#
# Once it says correct, run this lesson again: its last cell runs the two checks below on your loop,
# on the embedded models. Then compare with an answer, lesson 4b (`tutorials/04b_the_loop_answer.py`,
# its notebook beside this one), which runs the same two checks and breaks the rule on purpose.

# %% [markdown]
# ## Check 1: the same tokens as the library
#
# At temperature 0 `process` gives one-hot distributions, the coin is certain and the residual is
# the target's argmax: the loop must emit exactly plain greedy decoding. Sampled, it must emit the
# very tokens of `generate(..., method="speculative")` with the same seed, because it draws the
# same random numbers in the same order (k draft draws, then one coin per guess, then one draw).
# `loop` is your `speculative_decode`: the check calls it with the specification's arguments.

# %%
from specdec_np.decode import generate  # only to compare with the library
from specdec_np.plan import Plan

prompt = encode(enc, "def binary_search(items, x):\n    lo, hi = 0, len(items)\n")
N, K = 40, 4
ar = generate(target, prompt, N, method="ar", eos=None).tokens  # plain greedy decoding


def check_same_tokens(loop, k=K):
    """`loop` emits plain greedy decoding's tokens at temperature 0, and the library's speculative tokens for a
    seed when sampling (temperature 1, top-k 50, seed 1); the sampled text."""
    ours = loop(target, draft, prompt, N, k, Rand(0))
    assert ours == ar, f"greedy: token {next(i for i, (a, b) in enumerate(zip(ours, ar)) if a != b)} differs"
    ours = loop(target, draft, prompt, N, k, Rand(1), (1.0, 50, None))
    lib = generate(target, prompt, N, method="speculative", draft=draft, plan=Plan(chain=k), eos=None, seed=1,
                   temperature=1.0, top_k=50).tokens
    assert ours == lib, f"sampled, seed 1: token {next(i for i, (a, b) in enumerate(zip(ours, lib)) if a != b)} differs"
    return ours


# %% [markdown]
# ## Check 2: the output distribution, exactly
#
# Equal tokens for one seed say we copied the library, not that either is right. Lesson 3's
# enumerator answers that: `exact.outcomes(fn)` runs `fn(rand)` once per random branch with a
# scripted `rand` and adds up each branch's probability. With top-k 3 every distribution has 3
# tokens, so the branches are few: we enumerate the first 3 tokens the loop emits and compare them
# with the target's own sequence distribution (3 tokens sampled one by one). Each guess multiplies
# the branches by about 3 (and a step drafts its k guesses even when fewer tokens are still
# wanted, as the library does), so here k = 1: a few hundred branches, each a run of the loop
# that accepts or rejects, catches the draft's cache up after a bonus token, and cuts both caches.
# TV, the total variation distance, is half the sum of |difference| over all outcomes: the most
# any event's probability can differ between the two.
#
# The enumerator replays the whole loop once per branch, and branches share most of their passes.
# So for this check the loop runs with a `forward` that remembers: it keys each pass by the model
# and every token its cache has seen, and on a repeat writes the K/V the first time computed back
# into the cache (the loop's caches stay real) and returns the same logits.

# %%
from specdec_np.proofs import exact

memory = {}


def remembered_forward(model, tokens, cache):
    """gpt2.forward, computed once per (model, tokens the cache has seen, new tokens)."""
    seen = getattr(cache, "seen", [])[:cache.length] + list(tokens)
    key = (id(model), tuple(seen), len(tokens))
    start = cache.length
    if key not in memory:
        logits = forward(model, tokens, cache)
        memory[key] = logits, cache.k[:, :, start:cache.length].copy(), cache.v[:, :, start:cache.length].copy()
    else:
        logits, k, v = memory[key]
        cache.k[:, :, start:start + len(tokens)], cache.v[:, :, start:start + len(tokens)] = k, v
        cache.length += len(tokens)
    cache.seen = seen
    return logits


SETTINGS = (1.0, 3, None)  # temperature 1, top-k 3
short = encode(enc, "def f(x):")


def next_dist(model, settings=SETTINGS):
    """The model's distribution after a context, as a function of the context (for the references)."""
    return lambda context: process(forward(model, list(context), new_cache(model))[-1], *settings)


def loop_distribution(loop, settings=SETTINGS):
    """The exact distribution of the first 3 tokens `loop` emits after `short`, k = 1 guess per step."""
    return exact.outcomes(lambda rand: tuple(loop(target, draft, short, 3, 1, rand, settings)))


def check_lossless(loop, settings=SETTINGS):
    """`loop`'s first 3 tokens are distributed exactly as the target's (TV < 1e-12); the TV and the number of
    possible continuations."""
    reference = exact.sequence_distribution(next_dist(target, settings), tuple(short), 3)
    tv = exact.total_variation(loop_distribution(loop, settings), reference)
    assert tv < 1e-12, f"TV(your loop, target) = {tv:.3g}"
    return tv, len(reference)


# %% [markdown]
# ## Your loop
#
# The cell below loads `speculative_decode` from `tutorials/exercises/write_the_loop.py` and runs
# both checks on it, with the remembering `forward` put in place of the one it imported (the same
# logits, so nothing else changes). While the file is still the stub, it says so and stops there.

# %%
import importlib.util
from pathlib import Path

EXERCISE = Path(lesson.__file__).resolve().parent / "exercises" / "write_the_loop.py"


def your_loop():
    """Your speculative_decode, with remembered_forward in place of forward; None while it is the stub."""
    spec = importlib.util.spec_from_file_location("write_the_loop", EXERCISE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.speculative_decode(target, draft, prompt, 1, 1, Rand(0))
    except NotImplementedError:
        return None
    module.forward = remembered_forward  # the name your file imported from specdec_np.gpt2
    return module.speculative_decode


yours = your_loop()
if yours is None:
    print("tutorials/exercises/write_the_loop.py is still the stub: write it, run `make exercises`, then rerun "
          "this lesson; lesson 4b holds an answer")
else:
    sampled = check_same_tokens(yours)
    print("check 1: your loop emits plain greedy decoding's tokens, and the library's for seed 1:",
          repr(decode(enc, sampled)))
    tv, n = check_lossless(yours)
    print(f"check 2: over all {n} possible 3-token continuations, TV(your loop, target) = {tv:.1e} < 1e-12")
