# %% [markdown]
# # Lesson 3: speculative sampling
#
# A small **draft** model guesses the next few tokens, one at a time (cheap). The big **target**
# model then scores all of them in **one** forward pass (lesson 2: about the cost of one token).
# A rule decides how many guesses to keep; the target always adds one token of its own.
#
# With greedy decoding the rule is obvious: keep guesses while they equal the target's argmax.
# With *sampling* it is subtle, because we want the output to be distributed **exactly** as if the
# target had sampled every token itself. The rule (Leviathan et al. 2023; Chen et al. 2023):
#
# * the draft samples x from its distribution q;
# * accept x with probability min(1, p(x) / q(x)), where p is the target's distribution;
# * if rejected, sample the replacement from the **residual** norm(max(p - q, 0)).
#
# We check the claim *exactly*, by enumerating every random branch, not by sampling.

# %%
import numpy as np

from specdec_np import build, verify
from specdec_np.decode import generate
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.tokenizer import decode, encode

NAMES = "ABCD"  # a 4-token vocabulary
p = np.array([0.45, 0.30, 0.15, 0.10])  # target
q = np.array([0.20, 0.50, 0.05, 0.25])  # draft: too fond of B and D, too shy of A and C

# %% [markdown]
# ## The rule, derived by hand
#
# Output y can come out two ways: the draft proposed y and it was accepted, with probability
# q(y) min(1, p(y)/q(y)) = min(p(y), q(y)); or some proposal was rejected (total probability
# 1 - sum min(p, q)) and y was drawn from the residual. The residual's mass is
# sum max(p - q, 0) = 1 - sum min(p, q), exactly the rejection probability, so the two parts add up to
# min(p, q) + max(p - q, 0) = p. Numerically:

# %%
accept_part = np.minimum(p, q)  # P(draft proposes y and it is accepted)
p_reject = 1 - accept_part.sum()
residual = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
total = accept_part + p_reject * residual
print("token   p     q   accepted  + rejected*residual  =  total")
for i, name in enumerate(NAMES):
    print(f"  {name}   {p[i]:.2f}  {q[i]:.2f}   {accept_part[i]:.3f}   +  {p_reject * residual[i]:.3f}"
          f"              =  {total[i]:.3f}")
print(f"acceptance rate sum(min(p, q)) = {accept_part.sum():.2f} = 1 - TV(p, q)")
assert np.allclose(total, p)

# %% [markdown]
# ## The same rule as code, checked by exact enumeration
#
# All randomness goes through two calls: `rand.draw(probs)` (a categorical draw) and
# `rand.coin(prob)`. `exact.outcomes(fn)` runs `fn` once per random branch with a scripted `rand`
# and adds up each branch's probability: the exact output distribution of the real code.
# Two classic mistakes are caught by the same check.

# %%
def speculative_step(rand):
    x = rand.draw(q)  # the draft's proposal
    if rand.coin(min(1.0, p[x] / q[x])):
        return x
    return rand.draw(np.maximum(p - q, 0))  # draw() normalises the residual


def always_accept(rand):  # "the draft is good enough": output ~ q
    return rand.draw(q)


def resample_from_p(rand):  # on rejection, draw from p instead of the residual
    x = rand.draw(q)
    return x if rand.coin(min(1.0, p[x] / q[x])) else rand.draw(p)


target = {i: p[i] for i in range(4)}
for fn in (speculative_step, always_accept, resample_from_p):
    dist = exact.outcomes(fn)
    tv = exact.total_variation(dist, target)
    print(f"{fn.__name__:<17} output " + " ".join(f"{NAMES[y]}={dist.get(y, 0):.3f}" for y in range(4))
          + f"   TV from p = {tv:.3g}")
    if fn is speculative_step:
        assert tv < 1e-12, "the rule must reproduce p exactly"
    else:
        assert tv > 0.01, f"{fn.__name__} should be caught"

# %% [markdown]
# ## The library's `verify_chain` gives the same distribution
#
# In the library the draft's guesses form a chain: a `Tree` whose node 0 (the root) is the last
# emitted token and whose node i+1 is the child of node i. `build.build_chain` asks a callback for
# the draft's distribution after each node (here a table that depends on the previous token) and,
# given a `rand`, samples the chain from it. `verify.verify_chain(tree, p_rows, rand)` returns the
# accepted path and the target's extra token: a correction after a rejection, or a *bonus* token
# drawn from p when every guess was accepted.

# %%
P = np.array([p, [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])  # P[last] = target
Q = np.array([q, [0.4, 0.3, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7], [0.6, 0.0, 0.2, 0.2]])  # Q[last] = draft
ROOT = 0  # the last emitted token, so the first guess is drawn from Q[0] = q


def draft_fn(tokens, parents, nodes):  # the build.py callback: draft distribution after each node
    return Q[tokens[nodes]]  # [len(nodes), V]


def library_step(rand, k):
    tree = build.build_chain(ROOT, draft_fn, k, rand=rand)  # k guesses sampled from the draft
    path, nxt = verify.verify_chain(tree, P[tree.tokens], rand)  # target rows: one per node, one pass
    return verify.emitted(tree, path, nxt)  # accepted guesses + the target's token


first = exact.outcomes(lambda rand: library_step(rand, k=1)[0])
tv = exact.total_variation(first, exact.outcomes(speculative_step))
print("verify_chain, first token:", " ".join(f"{NAMES[y]}={first[y]:.3f}" for y in range(4)), f"  TV from ours = {tv:.1e}")
assert tv < 1e-12

# %% [markdown]
# One step with k = 3 guesses emits 1 to 4 tokens. Lossless means the *sequence* is distributed
# as the target's own: we compare the first 3 tokens (continuing with the target where a step
# emitted fewer) against the target's exact sequence distribution, and compute the exact expected
# number of tokens one target pass yields.

# %%
def first_m(rand, k=3, m=3):
    out = library_step(rand, k)
    while len(out) < m:  # a short step: the target samples the rest itself
        out.append(rand.draw(P[out[-1]]))
    return tuple(out[:m])


spec = exact.outcomes(first_m)
ref = exact.sequence_distribution(lambda ctx: P[ctx[-1]], (ROOT,), 3)
tv = exact.total_variation(spec, ref)
per_pass = exact.outcomes(lambda rand: len(library_step(rand, k=3)))
expected = sum(n * pr for n, pr in per_pass.items())
print(f"{len(ref)} possible 3-token sequences, TV between speculative and target: {tv:.1e}")
print("tokens per target pass: " + ", ".join(f"{n}: {per_pass[n]:.3f}" for n in sorted(per_pass))
      + f"  (expected {expected:.2f})")
assert tv < 1e-12
assert abs(sum(per_pass.values()) - 1) < 1e-12 and set(per_pass) <= {1, 2, 3, 4}

# %% [markdown]
# ## On the embedded models
#
# `generate(..., method="speculative")` runs this loop with the embedded draft and target:
# sampled (top-k 50, temperature 1), a chain of 4 guesses per target pass. Every step is one target
# pass and emits between 1 and 5 tokens; how many depends on how well the draft predicts the
# target. The text is a sample from the target's distribution, not the same sample as plain
# decoding with the same seed (the random numbers are used differently).

# %%
target_model, draft_model, _, enc = load_embedded()
prompt = encode(enc, "def fibonacci(n):\n    ")
kw = dict(temperature=1.0, top_k=50, seed=0)
res = generate(target_model, prompt, 32, method="speculative", draft=draft_model, plan=Plan(chain=4), **kw)
ar = generate(target_model, prompt, 32, method="ar", **kw)
s = res.stats
print(repr(decode(enc, res.tokens)))
print(f"speculative: {len(res.tokens)} tokens in {s.target_passes} target passes "
      f"({s.tokens_per_pass:.2f} per pass), {s.draft_passes} draft passes; plain sampling: {ar.stats.target_passes} passes")
assert s.target_passes == len(s.accepted) and all(1 <= a <= 5 for a in s.accepted)
assert sum(s.accepted) >= len(res.tokens) and ar.stats.target_passes == len(ar.tokens)
