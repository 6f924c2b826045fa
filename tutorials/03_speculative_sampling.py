# %% [markdown]
# # Lesson 3: speculative sampling
#
# You will derive the speculative sampling rule by hand on a 4-token example and check it exactly,
# by enumerating every random branch. You will see two classic mistakes caught by the same check,
# and try your own p and q. Then you will run the rule on the embedded models and count the tokens
# each target pass yields.
#
# A small **draft** model guesses the next few tokens, one at a time (cheap). The big **target**
# model then scores all of them in **one** forward pass instead of one pass per guess (lesson 2
# measures what a pass over several tokens costs on this machine against a pass over one).
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
# We check the claim *exactly*, by enumerating every random branch, not by sampling, and we
# measure how far apart two distributions are with the **total variation distance**
#
#     TV(p, q) = 1/2 sum_x |p(x) - q(x)| = 1 - sum_x min(p(x), q(x)),
#
# the largest difference in probability that p and q give to any one set of outcomes (0: the
# same distribution; 1: nothing in common). "Exact" below means TV < 1e-12: equal up to the
# rounding of float64 sums.

# %%
import numpy as np

from specdec_np import build, verify
from specdec_np.decode import generate
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.tokenizer import decode, encode
try:
    from lesson import check, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/03_speculative_sampling.py")

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
assert abs(accept_part.sum() - (1 - 0.5 * np.abs(p - q).sum())) < 1e-12  # the two forms of TV agree

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
    if fn is speculative_step:  # the rule you may edit (Try this): a wrong one is caught, said, and the lesson goes on
        try_this("speculative_step changed: it no longer reproduces p", tv > 1e-12)
        check(tv < 1e-12, "the rule must reproduce p exactly")
    else:
        assert tv > 0.01, f"{fn.__name__} should be caught"

# %% [markdown]
# ## Your own p and q
#
# The derivation never used these particular numbers. Edit the two distributions below (any
# non-negative numbers summing to 1; zeros are allowed: a token q never proposes is never tested)
# and rerun the cell: the enumeration re-checks the rule on them, and catches "always accept"
# whenever your q differs from your p.

# %%
def check_rule(p, q):
    """Exact output distribution of one speculative step on (p, q), and of the two mistakes."""
    assert abs(p.sum() - 1) < 1e-9 and abs(q.sum() - 1) < 1e-9 and (p >= 0).all() and (q >= 0).all()
    target = {i: p[i] for i in range(len(p)) if p[i] > 0}

    def step(rand):  # the same rule as speculative_step, on these p and q
        x = rand.draw(q)
        return x if rand.coin(min(1.0, p[x] / q[x])) else rand.draw(np.maximum(p - q, 0))

    tv = exact.total_variation(exact.outcomes(step), target)
    wrong = exact.total_variation(exact.outcomes(lambda rand: rand.draw(q)), target)  # always accept
    print(f"p = {p}, q = {q}: acceptance {np.minimum(p, q).sum():.3f}, TV(rule, p) = {tv:.1e}, "
          f"TV(always accept, p) = {wrong:.3f}")
    assert tv < 1e-12, "the rule must reproduce p exactly"
    assert wrong > 0.01 or np.abs(p - q).sum() < 0.02, "accepting everything is wrong unless q is p"


my_p = np.array([0.10, 0.60, 0.30, 0.00])  # edit me
my_q = np.array([0.50, 0.10, 0.10, 0.30])  # edit me
try_this("my_q = my_p: the draft is the target, so every guess is kept", np.array_equal(my_p, my_q))
check_rule(my_p, my_q)

# %% [markdown]
# ## Why a whole chain of guesses keeps the target's distribution
#
# One token is settled. A step with k guesses x_1..x_k (x_i drawn from the draft after x_1..x_(i-1))
# accepts a prefix and then emits one token of the target's: a correction from the residual after
# a rejection, or a bonus drawn from p after k acceptances. Why is the *sequence* distributed as the
# target's own? By induction on k, for a step followed by the target sampling on its own:
#
# * k = 0: the step is one draw from p(. | context): the target's own.
# * k > 0: the first emitted token y_1 is x_1 accepted or the correction after x_1 was rejected,
#   so by the one-token argument above P(y_1 = y) = p(y | context). Given y_1 = y, there are two
#   cases. x_1 was accepted: the rest of the step is a step with k - 1 guesses after context + y
#   (x_2.. were drawn from the draft after y, and the coin that accepted x_1 did not look at them),
#   so by induction what follows is the target's continuation of context + y. x_1 was rejected: the
#   step ends, and the target continues from context + y itself.
#
# In both cases, given y_1 = y, the rest is distributed as the target's continuation of
# context + y, so the sequence has probability p(y_1 | context) p(y_2 .. | context, y_1): the
# target's, by the chain rule of probability. The next section checks this exactly on 3 tokens.

# %% [markdown]
# ## The library's `verify_chain` gives the same distribution
#
# In the library the draft's guesses form a chain: a `Tree` whose node 0 (the root) is the last
# emitted token and whose node i+1 is the child of node i.
#
# `build.build_chain` asks a callback for
# the draft's distribution after each node (here a table that depends on the previous token) and,
# given a `rand`, samples the chain from it. `verify.verify_chain(tree, p_rows, rand)` returns the
# accepted path and the target's extra token: a correction after a rejection, or a *bonus* token
# drawn from p when every guess was accepted (a `Verdict`, which unpacks as that pair and also
# holds the tests the rule made, for the trace).

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
check(tv < 1e-12, "verify_chain's first token is not distributed as speculative_step's")

# %% [markdown]
# One step with k = 3 guesses emits 1 to 4 tokens. Lossless means the *sequence* is distributed
# as the target's own: we compare the first 3 tokens (continuing with the target where a step
# emitted fewer) against the target's exact sequence distribution, and compute the exact expected
# number of tokens one target pass yields.

# %%
K = 3  # guesses per step
try_this(f"{K} guess(es) per step", K != 3)


def first_m(rand, k=K, m=3):
    out = library_step(rand, k)
    while len(out) < m:  # a short step: the target samples the rest itself
        out.append(rand.draw(P[out[-1]]))
    return tuple(out[:m])


spec = exact.outcomes(first_m)
ref = exact.sequence_distribution(lambda ctx: P[ctx[-1]], (ROOT,), 3)
tv = exact.total_variation(spec, ref)
per_pass = exact.outcomes(lambda rand: len(library_step(rand, k=K)))
expected = sum(n * pr for n, pr in per_pass.items())
print(f"{len(ref)} possible 3-token sequences, TV between speculative and target: {tv:.1e}")
print("tokens per target pass: " + ", ".join(f"{n}: {per_pass[n]:.3f}" for n in sorted(per_pass))
      + f"  (expected {expected:.2f})")
assert tv < 1e-12
assert abs(sum(per_pass.values()) - 1) < 1e-12 and set(per_pass) <= {1, 2, 3, 4}

# %% [markdown]
# What "exact" covers here: every random branch of one step on these two 4x4 tables, k = 3, the
# first 3 tokens. One pair of tables proves nothing in general; the induction above does, and the
# test suite checks the same enumeration on many random tables: `tests/core/lossless/test_verify_exact.py` (every
# rule, 3 to 5 tokens, tables with zeros, ties and near-ties, drafts equal to, disjoint from or close
# to the target, drawn by hypothesis), `tests/core/lossless/test_verify_block_traversal.py` (block and traversal
# verification), each next to negative controls the same check must reject.

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

# %% [markdown]
# ## Try this
#
# * In the editable cell, set `my_q = my_p.copy()`: the acceptance becomes 1 and "always accept"
#   is exact too (TV 0): when the draft is the target, every guess is kept.
# * In `speculative_step`, draw the replacement from `np.maximum(q - p, 0)` (the residual the
#   wrong way round): the enumeration catches it (TV well above 0).
# * Ask `library_step` for one guess (`K = 1`): a pass then yields 1 token with probability 0.35
#   (a rejection) and 2 with 0.65, the acceptance rate sum(min(p, q)) derived at the top.
#
# The three predictions, checked:

# %%
def check_draft_is_target(p, q):
    """The first prediction for the draft q (to hold, q = p): acceptance 1, and "always accept" exact."""
    check_rule(p, q)
    always = exact.total_variation(exact.outcomes(lambda rand: rand.draw(q)), {i: p[i] for i in np.flatnonzero(p)})
    assert abs(np.minimum(p, q).sum() - 1) < 1e-12 and always < 1e-12, (np.minimum(p, q).sum(), always)


def check_caught(step):
    """The second: the enumeration finds `step` (to hold: a broken rule) far from the target."""
    tv = exact.total_variation(exact.outcomes(step), target)
    assert tv > 0.01, f"TV {tv:.1e}: not caught"
    return tv


def check_one_guess(step):
    """The third: `step` (to hold: a library step of one guess) yields 1 token with probability 0.35, 2 with 0.65."""
    one_guess = exact.outcomes(lambda rand: len(step(rand)))
    assert abs(one_guess.get(1, 0) - 0.35) < 1e-12 and abs(one_guess.get(2, 0) - 0.65) < 1e-12, one_guess
    return one_guess


def wrong_way_round(rand):
    x = rand.draw(q)
    return x if rand.coin(min(1.0, p[x] / q[x])) else rand.draw(np.maximum(q - p, 0))


check_draft_is_target(my_p, my_p.copy())
print(f"the residual the wrong way round: TV {check_caught(wrong_way_round):.3f} from the target")
one_guess = check_one_guess(lambda rand: library_step(rand, k=1))
print(f"k = 1: {one_guess[1]:.2f} of passes yield 1 token, {one_guess[2]:.2f} yield 2")
