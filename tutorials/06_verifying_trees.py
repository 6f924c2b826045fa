# %% [markdown]
# # Lesson 6: verifying a tree without changing the output distribution
#
# Lesson 3's rule checks one guess per position. A tree offers several siblings for the same
# position, and the rule must pick among them so that the emitted tokens are still distributed
# exactly as the target's own samples. The right rule depends on **how the siblings were chosen**:
#
# | rule (`verify.py`) | children were | at each node |
# |---|---|---|
# | `verify_greedy` | anything (temperature 0) | follow the child equal to argmax p |
# | `verify_point_mass` | deterministic (the draft's top-k) | try children in order: accept c with prob. p(c) / (1 - p(children already tried)); if none, draw from p without the children |
# | `verify_recursive` | drawn from q *with* replacement | test each with min(1, p/q); on rejection p := norm(max(p - q, 0)) |
# | `verify_recursive_wor` | drawn from q *without* replacement | as above, and also remove the rejected token from q and renormalise |
#
# Every rule returns the accepted root-to-node path and one more token from the target.
# We check each one exactly on a tiny table (as in lesson 3), then compare them on the real models.

# %%
import numpy as np

from specdec_np import build, verify
from specdec_np.decode import generate
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.sampling import process
from specdec_np.tokenizer import encode
from specdec_np.tree import children

P = np.array([[0.45, 0.30, 0.15, 0.10],  # P[last token] = target's next-token distribution
              [0.10, 0.20, 0.30, 0.40],
              [0.70, 0.10, 0.10, 0.10],
              [0.25, 0.25, 0.25, 0.25]])
Q = np.array([[0.20, 0.50, 0.05, 0.25],  # Q[last token] = draft's
              [0.40, 0.30, 0.20, 0.10],
              [0.10, 0.10, 0.10, 0.70],
              [0.60, 0.00, 0.20, 0.20]])
ROOT, M = 0, 3  # the last emitted token; we compare the first M emitted tokens


def draft_fn(tokens, parents, nodes):  # the builder's callback: the draft's distribution after each node
    return Q[tokens[nodes]]


def first_m(rand, target, widths, sampled, rule):
    """One speculative step on a tree of the given shape, continued by the target up to M tokens."""
    if sampled is None:
        tree = build.build_fixed(ROOT, draft_fn, widths)  # the draft's top-widths[d] tokens
    else:  # widths[d] children drawn from q, with or without replacement
        tree = build.build_fixed(ROOT, draft_fn, widths, rand=rand, replacement=(sampled == "with"))
    path, nxt = rule(tree, target[tree.tokens], rand)  # target rows: one per node, one pass
    out = verify.emitted(tree, path, nxt)
    while len(out) < M:
        out.append(rand.draw(target[out[-1]]))
    return tuple(out[:M])


def tv_from_target(target, widths, sampled, rule):
    spec = exact.outcomes(lambda rand: first_m(rand, target, widths, sampled, rule))
    ref = exact.sequence_distribution(lambda ctx: target[ctx[-1]], (ROOT,), M)  # the target alone
    return exact.total_variation(spec, ref)


# %% [markdown]
# ## Each rule, paired with the trees it assumes, is exact
#
# Trees with two children at depth 1 and one below each (`widths=[2, 1]`). For greedy the target
# is temperature 0: its processed distribution is one-hot on the argmax, and the output must be
# the target's greedy continuation with probability 1.

# %%
P_greedy = process(np.log(P), temperature=0)  # one-hot rows
cases = [("greedy", P_greedy, None, verify.verify_greedy),
         ("point_mass", P, None, verify.verify_point_mass),
         ("recursive", P, "with", verify.verify_recursive),
         ("recursive_wor", P, "without", verify.verify_recursive_wor)]
for name, target, sampled, rule in cases:
    tv = tv_from_target(target, [2, 1], sampled, rule)
    kind = {None: "deterministic", "with": "sampled with replacement", "without": "sampled without replacement"}[sampled]
    print(f"{name:<14} on {kind:<28} children: TV from the target = {tv:.1e}")
    assert tv < 1e-12, f"{name} is not lossless"

# %% [markdown]
# For deterministic children, point-mass verification is the same as "draw x from p, and descend
# if x is one of the children", so the chance of accepting *some* child is the target's total
# probability of the children. Checked exactly at the root:

# %%
tree = build.build_fixed(ROOT, draft_fn, [2, 1])
kids = children(tree, 0)
p_accept = exact.outcomes(lambda rand: len(verify.verify_point_mass(tree, P[tree.tokens], rand)[0]) > 1)[True]
print(f"root children {tree.tokens[kids].tolist()}: P(accept one) = {p_accept:.3f}, sum of p over them = {P[ROOT][tree.tokens[kids]].sum():.3f}")
assert abs(p_accept - P[ROOT][tree.tokens[kids]].sum()) < 1e-12

# %% [markdown]
# ## The pairing matters
#
# The recursive rules divide by the distribution each sibling was *actually* drawn from. Swap the
# two (siblings drawn without replacement but verified as if with, or vice versa) and the
# output drifts from the target. Three siblings make the error plain. The library refuses such
# pairings up front (`verify.check_pairing`).

# %%
for name, sampled, rule in [("recursive on without-replacement", "without", verify.verify_recursive),
                            ("recursive_wor on with-replacement", "with", verify.verify_recursive_wor)]:
    tv = tv_from_target(P, [3], sampled, rule)
    print(f"{name:<34}: TV from the target = {tv:.3f}")
    assert tv > 0.01, f"{name} should be caught"
try:
    verify.check_pairing("without_replacement", "recursive")
    raise AssertionError("check_pairing should refuse this")
except ValueError as e:
    print("check_pairing:", e)

# %% [markdown]
# ## Why sample without replacement: a duplicate sibling is a wasted node
#
# Three children of the root drawn from q = (0.20, 0.50, 0.05, 0.25): with replacement the likely
# token 1 is often drawn twice, and its copy can add nothing (once token 1 is rejected, the
# residual gives it probability 0). Without replacement the three siblings are always distinct.
# Exactly, over every random branch of drafting and verification:

# %%
def root_outcome(rand, sampled, rule, widths):
    tree = build.build_fixed(ROOT, draft_fn, widths, rand=rand, replacement=(sampled == "with"))
    path, _ = rule(tree, P[tree.tokens], rand)
    kids = tree.tokens[children(tree, 0)]
    return len(path) - 1, len(kids) - len(set(kids.tolist()))  # drafted tokens accepted, duplicate siblings


expected = {}
for sampled, rule in (("with", verify.verify_recursive), ("without", verify.verify_recursive_wor)):
    dist = exact.outcomes(lambda rand: root_outcome(rand, sampled, rule, [3]))
    expected[sampled] = sum(pr * acc for (acc, _), pr in dist.items())
    dup = sum(pr for (_, d), pr in dist.items() if d)
    print(f"3 siblings drawn {sampled + ' replacement:':<21} P(a duplicate) = {dup:.3f}, "
          f"expected drafted tokens accepted = {expected[sampled]:.3f}")
assert expected["without"] > expected["with"] + 0.1

# %% [markdown]
# ## Acceptance on the embedded models (top-k 50, temperature 1)
#
# The same tree shape (2, 2, 1, 1 children per depth: 14 drafted tokens) built three ways, plus the
# best-first tree of 14 nodes and a chain of 4 guesses for reference. What we compare is
# **tokens per target pass**: how much each target pass yields. Seeds are fixed, so the numbers
# are reproducible on one machine, but a short run is a small sample: differences of a few
# tenths are noise. Which shape wins depends on how well the draft matches the target; sampling
# with replacement can draw the same token twice and waste a node, which sampling without
# replacement avoids. At temperature 1 the target's probability of any one top token is small,
# so the point-mass rule accepts little, while drawn children are accepted as often as p and q
# overlap. The last column counts the nodes each run spent on a token its sibling already had
# (only drawing with replacement can); a short run can tie anyway, because a wasted node costs
# tokens per pass only at the steps where the duplicated token is rejected: the exact comparison
# above is the reliable one. `make bench` samples its top-k trees without replacement for that reason;
# `Plan()`'s default stays the deterministic tree (pass `Plan(sampled="without")` to draw).

# %%
target_model, draft_model, _, enc = load_embedded()
prompt = encode(enc, "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n")
W = [2, 2, 1, 1]
configs = {
    "chain of 4 (chain rule)": ("speculative", Plan(chain=4)),
    "best-first 14 (point_mass)": ("tree", Plan(budget=14, depth=4)),
    "top-k tree (point_mass)": ("tree", Plan(shape="fixed", widths=W)),
    "sampled with (recursive)": ("tree", Plan(widths=W, sampled="with")),
    "sampled w/o (recursive_wor)": ("tree", Plan(widths=W, sampled="without")),
}
n_new = 24


def duplicates(stats):
    """Drafted nodes that repeat an earlier sibling's token, over every step: wasted nodes."""
    n = 0
    for t, _ in stats.trees:
        for i in range(len(t)):
            kids = t.tokens[children(t, i)]
            n += len(kids) - len(set(kids.tolist()))
    return n


print(f"{'tree (rule)':<28} {'target passes':>13} {'tokens/pass':>11} {'draft passes':>12} {'wasted nodes':>12}")
for name, (method, plan) in configs.items():
    r = generate(target_model, prompt, n_new, method, draft_model, plan=plan, temperature=1.0, top_k=50, seed=0,
                 keep_trees=True)
    s = r.stats
    print(f"{name:<28} {s.target_passes:>13} {s.tokens_per_pass:>11.2f} {s.draft_passes:>12} {duplicates(s):>12}")
    assert s.target_passes == len(s.accepted) and sum(s.accepted) == len(r.tokens)
    assert max(s.accepted) <= 5  # at most depth 4 drafted tokens + 1 from the target
    if "recursive_wor" in name or "point_mass" in name or "chain" in name:
        assert duplicates(s) == 0  # distinct siblings by construction

# %% [markdown]
# ## Every check, step by step
#
# The rules note each test they make (`verify.Check`): the acceptance probability min(1, p/q),
# the uniform draw u it was compared with, the token the target drew at the end. With
# `keep_trees=True` the decoding loop keeps them per step, and `tools/trace.py` shows them as one
# self-contained HTML page, next to each step's tree. Here the sampled-without-replacement run
# again, kept and written out (keeping the record changes nothing: the same seed gives the same tokens).

# %%
from pathlib import Path

from specdec_np.tools import trace
from specdec_np.tools.lesson import show_page

method, plan = configs["sampled w/o (recursive_wor)"]
kw = dict(plan=plan, temperature=1.0, top_k=50, seed=0)
r = generate(target_model, prompt, n_new, method, draft_model, keep_trees=True, **kw)
assert r.tokens == generate(target_model, prompt, n_new, method, draft_model, **kw).tokens
# A check where the draw matters: p < q (here p/q < 0.5), so the node is accepted only with probability p/q.
c = next(c for s in r.stats.steps for c in s.checks if c.test == "ratio" and c.u is not None and c.value < 0.5)
print(f"a check: node {c.node}, P(accept) = min(1, p/q) = min(1, {c.p:.3f}/{c.q:.3f}) = {c.value:.3f}, "
      f"u = {c.u:.3f}: {'accepted' if c.accepted else 'rejected'}")
assert c.accepted == (c.u < c.value) and abs(c.value - min(1.0, c.p / c.q)) < 1e-12
Path("out").mkdir(exist_ok=True)
trace.write("out/tutorial_06_trace.html", r, enc, prompt, method, "widths 2,2,1,1 drawn without replacement; "
            "temperature 1, top-k 50, seed 0")
show_page("out/tutorial_06_trace.html")  # inline in a notebook
