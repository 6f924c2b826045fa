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
# Then we check it the way the library is checked: it emits exactly the library's tokens, and its
# output distribution, enumerated exactly over every random branch, is the target's.
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
# * **Cut.** Both caches keep only the tokens committed before this step and the accepted guesses,
#   that is every committed token but the step's new one (the invariant above): `truncate` forgets
#   the rest (the draft's cache may already hold less).
# * **Emit** the accepted guesses and the target's token; stop once `n_new` tokens are out (a step
#   drafts its k guesses even when fewer are still wanted: keep the first `n_new`).
#
# Randomness goes through `rand` only, in this order each step: the k draws of the guesses, one
# coin per guess up to the first rejection, then one draw. In that order the loop emits the very
# tokens of the library's `generate(..., method="speculative")` with the same seed.
#
# ## Your turn
#
# Write it in `tutorials/exercises/write_the_loop.py` (the stub has the signature and the building
# blocks), then run `make exercises`. Exercise 4 checks your loop on a tiny random target and draft:
# at temperature 0 and with a seed it must emit `generate`'s tokens, and the distribution of its
# first tokens must be the target's, enumerated exactly. A wrong line names the first token that
# differs and a command that reruns that case alone. Come back when it says correct: the lesson's
# answer follows, then the same checks on the embedded models.
#
# ---
#
# ## An answer
#
# Lesson 3's rule, for one guess: x was drawn from q. Keep it with probability min(1, p(x)/q(x));
# otherwise the target's token comes from the residual, what p still owes once x was rejected.

# %%
def residual(p, q):  # [V], [V] -> [V] (unnormalised)
    return np.maximum(p - q, 0)


def check_guess(x, p, q, rand, correction):
    """(True, x) if guess x ~ q is kept, else (False, the target's token drawn from correction(p, q))."""
    if rand.coin(min(1.0, p[x] / q[x])):
        return True, x
    return False, rand.draw(correction(p, q))


# %% [markdown]
# The loop, step by step as specified. Two extra arguments serve the checks below: `correction`
# (what a rejection draws from, to break it on purpose) and `forward` (a stand-in that remembers).

# %%
def speculative_decode(target, draft, prompt, n_new, k, rand, settings=(0.0, None, None), correction=residual,
                       forward=forward):
    """n_new tokens after prompt: the draft guesses k per step, the target checks them in one pass.

    settings: (temperature, top_k, top_p) for `process`; correction: what a rejection draws from.
    """
    t_cache, d_cache = new_cache(target), new_cache(draft)
    seq = list(prompt)
    forward(target, seq[:-1], t_cache)  # prefill all but the last token: each step feeds from seq[-1]
    forward(draft, seq[:-1], d_cache)
    while len(seq) < len(prompt) + n_new:
        start = len(seq) - 1  # the target's cache holds seq[:start]
        # 1. Draft: k guesses, one draft pass each; q_i is what guess i was drawn from.
        guesses, qs, feed = [], [], seq[d_cache.length:]
        for _ in range(k):
            q = process(forward(draft, feed, d_cache)[-1], *settings)  # [V]
            x = rand.draw(q)
            guesses.append(x)
            qs.append(q)
            feed = [x]
        # 2. Verify: one target pass over the last token and the k guesses.
        p = process(forward(target, [seq[-1]] + guesses, t_cache), *settings)  # [k + 1, V]
        # 3. The rule, guess by guess; a rejection ends the step with the target's correction.
        accepted = []
        for i, x in enumerate(guesses):
            kept, token = check_guess(x, p[i], qs[i], rand, correction)
            if not kept:
                break
            accepted.append(x)
        else:
            token = rand.draw(p[k])  # every guess kept: a bonus token from the target's last row
        # 4. Both caches keep only the committed text and the accepted guesses.
        t_cache.truncate(start + 1 + len(accepted))
        d_cache.truncate(min(d_cache.length, start + 1 + len(accepted)))
        # 5. Emit.
        seq += accepted + [token]
    return seq[len(prompt):len(prompt) + n_new]


# %% [markdown]
# That is the whole algorithm: about 40 lines. A step costs k draft passes of one token and one
# target pass of k + 1 tokens, and emits between 1 and k + 1 tokens. The target's pass reads its
# weights once, as a one-token pass does, but computes k + 1 tokens' worth: how its cost compares
# with a one-token pass depends on the machine and its load (lesson 2 measures it on yours).
# Speculation pays off when a step costs less than the plain target passes that would have emitted
# the same tokens: lesson 8 predicts and measures that.
#
# ## Check 1: the same tokens as the library
#
# At temperature 0 `process` gives one-hot distributions, the coin is certain and the residual is
# the target's argmax: the loop must emit exactly plain greedy decoding. Sampled, it must emit the
# very tokens of `generate(..., method="speculative")` with the same seed, because it draws the
# same random numbers in the same order (k draft draws, then one coin per guess, then one draw).

# %%
from specdec_np.decode import generate  # only to compare with the library
from specdec_np.plan import Plan

prompt = encode(enc, "def binary_search(items, x):\n    lo, hi = 0, len(items)\n")
N, K = 40, 4
ours = speculative_decode(target, draft, prompt, N, K, Rand(0))
lib = generate(target, prompt, N, method="speculative", draft=draft, plan=Plan(chain=K), eos=None).tokens
ar = generate(target, prompt, N, method="ar", eos=None).tokens
print("greedy:", repr(decode(enc, ours)))
print(f"greedy: ours == library speculative: {ours == lib}, == plain decoding: {ours == ar}")
assert ours == lib == ar

sampled = dict(temperature=1.0, top_k=50)
ours = speculative_decode(target, draft, prompt, N, K, Rand(1), settings=(1.0, 50, None))
lib = generate(target, prompt, N, method="speculative", draft=draft, plan=Plan(chain=K), eos=None, seed=1,
               **sampled).tokens
print("sampled (temperature 1, top-k 50, seed 1):", repr(decode(enc, ours)))
print(f"sampled: ours == library speculative with the same seed: {ours == lib}")
assert ours == lib

# %% [markdown]
# ## Check 2: the output distribution, exactly
#
# Equal tokens for one seed say we copied the library, not that either is right. Lesson 3's
# enumerator answers that: `exact.outcomes(fn)` runs `fn(rand)` once per random branch with a
# scripted `rand` and adds up each branch's probability. With top-k 3 every distribution has 3
# tokens, so the branches are few: we enumerate the first 3 tokens our loop emits and compare them
# with the target's own sequence distribution (3 tokens sampled one by one). Each guess multiplies
# the branches by about 3 (and a step drafts its k guesses even when fewer tokens are still
# wanted, as the library does), so here k = 1: a few hundred branches, each a run of the loop
# that accepts or rejects, catches the draft's cache up after a bonus token, and cuts both caches.
# TV, the total variation distance, is half the sum of |difference| over all outcomes: the most
# any event's probability can differ between the two.

# %% [markdown]
# The enumerator replays the whole loop once per branch (a few hundred here), and branches share
# most of their passes. So for this check the loop runs with a `forward` that remembers: it keys
# each pass by the model and every token its cache has seen, and on a repeat writes the K/V the
# first time computed back into the cache (the loop's caches stay real) and returns the same logits.

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


def target_next(context, settings=SETTINGS):  # the target's distribution after a context (for the reference)
    return process(forward(target, list(context), new_cache(target))[-1], *settings)


def first_3(rand, correction=residual):  # our loop's first 3 tokens, k = 1 guess per step
    return tuple(speculative_decode(target, draft, short, 3, 1, rand, SETTINGS, correction,
                                    forward=remembered_forward))


reference = exact.sequence_distribution(target_next, tuple(short), 3)
ours = exact.outcomes(first_3)
tv = exact.total_variation(ours, reference)
assert tv < 1e-12
print(f"{len(reference)} possible 3-token continuations; TV(our loop, target) < 1e-12")

# %% [markdown]
# The negative control: the same loop with the residual replaced by p (a "natural" fix: after a
# rejection, just let the target sample). The enumeration catches it.

# %%
broken = exact.outcomes(lambda rand: first_3(rand, correction=lambda p, q: p))
tv_broken = exact.total_variation(broken, reference)
print(f"correction drawn from p instead of the residual: TV = {tv_broken:.3f}")
assert tv_broken > 0.01

# %% [markdown]
# ## Try this
#
# * Set `K = 1` in check 1: the greedy tokens do not change (greedy output never depends on k),
#   but each step now emits at most 2 tokens.
# * In `check_guess`, replace `min(1.0, p[x] / q[x])` by `1.0` (always keep the draft's guess) and
#   rerun check 2. What TV do you get, and whose distribution does the output follow now?
# * Change `SETTINGS` to top-k 2: the number of possible 3-token continuations drops to 8. Does the
#   TV stay below 1e-12?
#
# The suite runs the deterministic predictions above:

# %%
assert speculative_decode(target, draft, prompt, N, 1, Rand(0)) == ar  # K = 1, greedy
top2 = exact.sequence_distribution(lambda ctx: target_next(ctx, (1.0, 2, None)), tuple(short), 3)
assert len(top2) == 8
print("try-this predictions checked: K = 1 greedy tokens unchanged; top-k 2 gives", len(top2), "continuations")
