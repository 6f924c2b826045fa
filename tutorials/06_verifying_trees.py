# %% [markdown]
# # Lesson 6: verifying a tree without changing the output distribution
#
# You will verify a tree of two siblings by hand under sampling and see why recursive rejection
# stays exact. You will check every rule exactly on small trees, and see what goes wrong when a rule
# is paired with the wrong way of drawing. Then you will compare drawing siblings with and without
# replacement on the embedded models.
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
try:
    from lesson import check, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/06_verifying_trees.py")

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
# ## Recursive rejection, by hand
#
# Lesson 3's p and q (the rows after token A), and two siblings at the root drawn from q without
# replacement: B first, then D. The tables have the columns of the trace page's residual table:
# the target's p, the distribution q the sibling was drawn from, the ratio min(1, p/q) a sibling
# with that token is tested with, and the residual norm(max(p - q, 0)) the rule goes on with after
# a rejection.

# %%
from specdec_np.tree import Tree  # noqa: E402

NAMES = "ABCD"
A, B, C, D = range(4)


def residual_table(title, p, q):
    """One stage of recursive rejection: p, q, the ratio each token is tested with, the residual."""
    ratio = np.array([verify.accept_ratio(p[x], q[x]) for x in range(len(p))])
    res = verify.residual(p, q)
    print(f"{title}\n  token     p      q   min(1, p/q)   residual")
    for x in range(len(p)):
        print(f"    {NAMES[x]}   {p[x]:.3f}  {q[x]:.3f}      {ratio[x]:.3f}       {res[x]:.3f}")
    return ratio, res


p, q = P[A], Q[A]
ratio1, p1 = residual_table("sibling 1 is B, drawn from q:", p, q)
q1 = verify.without(q, B)  # sibling 2 was drawn from q without B
ratio2, p2 = residual_table("B rejected; sibling 2 is D, drawn from q' = q without B (renormalised), "
                            "tested against p':", p1, q1)
print("D rejected too: the correction token is drawn from p'' = "
      + ", ".join(f"{NAMES[x]} {p2[x]:.3f}" for x in range(4)))
assert abs(ratio1[B] - 0.6) < 1e-12 and ratio2[D] == 0.0 and ratio2[A] == 1.0  # the numbers the text uses
assert np.allclose(p1, [0.25 / 0.35, 0, 0.10 / 0.35, 0]) and np.allclose(q1, [0.4, 0, 0.1, 0.5])

# %% [markdown]
# Read it row by row. B is tested with min(1, 0.30/0.50) = 0.6: the draft proposes B more often than
# the target wants it, so B is accepted 6 times in 10, which pays p(B) = q(B) x 0.6 = 0.30 in full.
# After a rejection the rule owes p' = norm(max(p - q, 0)): nothing to B and D (the draft already
# over-supplied them), the rest to A and C in proportion to what they still lack (0.25 : 0.10).
#
# Why exactly p', whichever sibling was rejected: over the draw of the first sibling, y comes out
# accepted with probability min(p(y), q(y)) (lesson 3), so the rejections, of total probability 1 -
# sum min(p, q), must supply the rest, p - min(p, q) = max(p - q, 0): normalised, that is p'.
#
# The second sibling faces the same problem with p' as the target and q' as the draft: the one-token
# rule is lossless for *any* pair (target, distribution the token was really drawn from). That is
# why the rule must use q' = q without B here: D was drawn from q', not from q. D's ratio is
# p'(D)/q'(D) = 0: the residual owes D nothing, so D is rejected for certain (as A would have been
# accepted for certain: p'(A) = 0.714 > q'(A) = 0.4).
#
# After the last sibling, the correction is drawn from the last residual p''. By induction over the
# siblings, the token the root emits is distributed as p; once a child is accepted, the same
# argument runs at the child, with the target's p there (lesson 3's induction for chains).
#
# The library's `verify_recursive_wor` on this very tree (B and D under the root): the first
# emitted token is B with probability 0.6, D never, and otherwise A or C in p'' 's proportions.

# %%
hand = Tree(tokens=[A, B, D], parents=[-1, 0, 0], q=[1.0, q[B], q1[D]], kind="without_replacement",
            draft_dists=[q, np.zeros(4), np.zeros(4)])
try_this("D first, B second", hand.tokens[1] == D)
first = exact.outcomes(lambda rand: verify.emitted(hand, *verify.verify_recursive_wor(hand, P[hand.tokens], rand))[0])
by_hand = {B: ratio1[B], A: (1 - ratio1[B]) * p2[A], C: (1 - ratio1[B]) * p2[C]}
print("verify_recursive_wor, first token:", ", ".join(f"{NAMES[x]} {first.get(x, 0):.4f}" for x in range(4)),
      "  by hand:", ", ".join(f"{NAMES[x]} {by_hand.get(x, 0):.4f}" for x in range(4)))
check(exact.total_variation(first, by_hand) < 1e-12, "the library's first token is not the hand-worked (B first)")

# %% [markdown]
# ## Each rule, paired with the trees it assumes, is exact
#
# Trees with two children at depth 1 and one below each (`WIDTHS`: [2, 1]). For greedy the target
# is temperature 0: its processed distribution is one-hot on the argmax, and the output must be
# the target's greedy continuation with probability 1.

# %%
WIDTHS = [2, 1]
try_this(f"trees of widths {WIDTHS}", WIDTHS != [2, 1])
P_greedy = process(np.log(P), temperature=0)  # one-hot rows
cases = [("greedy", P_greedy, None, verify.verify_greedy),
         ("point_mass", P, None, verify.verify_point_mass),
         ("recursive", P, "with", verify.verify_recursive),
         ("recursive_wor", P, "without", verify.verify_recursive_wor)]
for name, target, sampled, rule in cases:
    tv = tv_from_target(target, WIDTHS, sampled, rule)
    kind = {None: "deterministic", "with": "sampled with replacement", "without": "sampled without replacement"}[sampled]
    print(f"{name:<14} on {kind:<28} children {WIDTHS}: TV from the target = {tv:.1e}")
    assert tv < 1e-12, f"{name} is not lossless"

# %% [markdown]
# For deterministic children, point-mass verification is the same as "draw x from p, and descend
# if x is one of the children", so the chance of accepting *some* child is the target's total
# probability of the children. Checked exactly at the root:

# %%
tree = build.build_fixed(ROOT, draft_fn, [2, 1])
kids = children(tree, 0)
p_accept = exact.outcomes(lambda rand: len(verify.verify_point_mass(tree, P[tree.tokens], rand).path) > 1)[True]
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
# best-first tree of 14 nodes and a chain of 4 guesses for reference. What we compare is **tokens
# per target pass**: how much each target pass yields. Seeds are fixed, so the numbers are
# reproducible on one machine, but a run of a few steps is a small sample: differences of a few
# tenths are noise.
#
# The point-mass rule accepts a deterministic child with the target's probability of it (the section
# above): a lot where the target is confident (indentation, a closing bracket), little where its p
# is spread; drawn children are accepted as often as p and q overlap.
#
# Which wins on a short run depends on the text, as the table shows. The last column counts the
# nodes each run spent on a token its sibling already had (only drawing with replacement can). A
# wasted node costs tokens only at the steps where the duplicated token is rejected, so a short run
# can tie; the section after the table compares the two ways of drawing exactly, on the real models'
# distributions.

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
# ## With or without replacement, exactly, on the real models
#
# For one position, the chance that recursive rejection accepts one of k siblings has a short exact
# form, the rule's own recursion: a first sibling x is accepted with probability sum min(p, q);
# otherwise (x drawn and rejected, probability q(x) - min(p(x), q(x))) the next siblings face p' =
# norm(max(p - q, 0)) and q (with replacement) or q without x (without).
#
# Checked against the enumeration of the library's rules on lesson 3's p and q, then evaluated on
# the target's and the draft's distributions (top-k 50, temperature 1) at every position of a
# sampled text: no sampling noise, so the two ways of drawing compare position by position.

# %%
from specdec_np.gpt2 import forward, new_cache  # noqa: E402
from specdec_np.proofs import optimum  # noqa: E402


def p_accept(p, q, k, replacement):
    """P(one of k siblings drawn from q is accepted) by recursive rejection against p, exactly."""
    if k == 0 or q is None:
        return 0.0
    accepted = np.minimum(p, q).sum()
    p_res = verify.residual(p, q)
    if replacement:
        return accepted + (1 - accepted) * p_accept(p_res, q, k - 1, True)
    rejected = q - np.minimum(p, q)  # [V]: P(x drawn first and rejected)
    return accepted + sum(rejected[x] * p_accept(p_res, verify.without(q, x), k - 1, False)
                          for x in np.flatnonzero(rejected > 0))


for k in (1, 2, 3):
    for scheme, rule in (("with", "recursive"), ("without", "recursive_wor")):
        enumerated = optimum.acceptance(optimum.single_position(verify.RULES[rule], P[A], Q[A], k, scheme))
        assert abs(p_accept(P[A], Q[A], k, scheme == "with") - enumerated) < 1e-12

def compare_drawing(seed, k):
    """Recursive rejection's exact P(accept one of k siblings), with and without replacement, at every position of
    the text sampled with `seed`: ({way: its average}, {way: positions where it accepts more, "tie": the rest},
    positions)."""
    text = generate(target_model, prompt, n_new, method="ar", temperature=1.0, top_k=50, seed=seed).tokens
    seq = list(prompt) + text[:-1]
    rows = {name: forward(m, seq, new_cache(m))[len(prompt) - 1:] for name, m in (("p", target_model), ("q", draft_model))}
    wins = {"with": 0, "without": 0, "tie": 0}
    totals = {"with": 0.0, "without": 0.0}
    for lp, lq in zip(rows["p"], rows["q"]):
        p_t = process(lp.astype(np.float64), temperature=1.0, top_k=50)
        q_t = process(lq.astype(np.float64), temperature=1.0, top_k=50)
        keep = np.flatnonzero((p_t > 0) | (q_t > 0))  # the tokens either could emit: at most 100
        acc = {s: p_accept(p_t[keep], q_t[keep], k, s == "with") for s in totals}
        for s in totals:
            totals[s] += acc[s] / len(text)
        diff = acc["without"] - acc["with"]
        wins["without" if diff > 1e-12 else "with" if diff < -1e-12 else "tie"] += 1
    return totals, wins, len(text)


totals, wins, positions = compare_drawing(0, 2)
print(f"2 siblings at each of the {positions} positions of the sampled text: P(accept one) averages "
      f"{totals['with']:.3f} with replacement, {totals['without']:.3f} without")
print(f"positions where drawing without replacement accepts more: {wins['without']}, less: {wins['with']}, "
      f"the same: {wins['tie']}")

# %% [markdown]
# A duplicate sibling can only be rejected if its first copy was, and then the residual owes it
# nothing: drawing without replacement spends that node on a new token instead. `make bench`
# samples its top-k trees without replacement for that reason; `Plan()`'s default stays the
# deterministic tree (pass `Plan(sampled="without")` to draw).

# %% [markdown]
# ## Every check, step by step
#
# A rule returns the tests it made with its verdict (`verify.Check`): the acceptance probability
# min(1, p/q), the uniform draw u it was compared with, the token the target drew at the end. With
# `keep_trees=True` the decoding loop keeps them per step (`step.trace.checks`), and `tools/trace.py` shows them as one
# self-contained HTML page, next to each step's tree. Here the sampled-without-replacement run
# again, kept and written out (keeping the record changes nothing: the same seed gives the same tokens).

# %%
from lesson import show_trace  # tutorials/lesson.py: writes out/NAME (or a temporary folder), shows it in a notebook

method, plan = configs["sampled w/o (recursive_wor)"]
kw = dict(plan=plan, temperature=1.0, top_k=50, seed=0)
r = generate(target_model, prompt, n_new, method, draft_model, keep_trees=True, **kw)
assert r.tokens == generate(target_model, prompt, n_new, method, draft_model, **kw).tokens
# A check where the draw matters: p < q (here p/q < 0.5), so the node is accepted only with probability p/q.
c = next(c for s in r.stats.steps for c in s.trace.checks if c.test == "ratio" and c.u is not None and c.value < 0.5)
print(f"a check: node {c.node}, P(accept) = min(1, p/q) = min(1, {c.p:.3g}/{c.q:.3g}) = {c.value:.3g}, "
      f"u = {c.u:.3f}: {'accepted' if c.accepted else 'rejected'}")
assert c.accepted == (c.u < c.value) and abs(c.value - min(1.0, c.p / c.q)) < 1e-12
show_trace(r, enc, prompt, method, "widths 2,2,1,1 drawn without replacement; temperature 1, top-k 50, seed 0",
           "tutorial_06_trace.html")

# %% [markdown]
# ## Try this
#
# * In the hand-worked tree, put D first and B second (`tokens=[A, D, B]`, and `q=[1.0, q[D],
#   verify.without(q, D)[B]]`): D is now accepted with probability min(1, 0.10/0.25) = 0.4, and B
#   is never emitted, because after D's rejection the residual owes B nothing.
# * In the exactness cell, give the rules three siblings (`WIDTHS = [3]` instead of `[2, 1]`):
#   still exact (TV < 1e-12).
# * Set the sampled runs' `seed` to 1, 2, 3 and look at how each run's tokens per pass moves: a run
#   of a few steps is a small sample. The exact comparison needs no luck: run it on the text each of
#   those seeds samples (`compare_drawing(1, 2)`, ...): at no position does drawing without
#   replacement accept less than drawing with it, and at some it accepts more. With one sibling
#   (`compare_drawing(1, 1)`) the two are the same rule: a tie everywhere.
#
# The predictions, checked by running the lesson's code with each change:

# %%
def check_d_first(first, second):
    """The first prediction for the siblings `first`, `second` (to hold: D, B): the exact distribution of the
    first emitted token, with `first` emitted with probability 0.4 and `second` never."""
    tree = Tree(tokens=[A, first, second], parents=[-1, 0, 0], q=[1.0, q[first], verify.without(q, first)[second]],
                kind="without_replacement", draft_dists=[q, np.zeros(4), np.zeros(4)])
    out = exact.outcomes(lambda rand: verify.emitted(tree, *verify.verify_recursive_wor(tree, P[tree.tokens], rand))[0])
    assert abs(out.get(first, 0.0) - 0.4) < 1e-12 and out.get(second, 0.0) == 0.0, out
    return out


def check_still_exact(cases, widths):
    """The second: every (name, target, drawing, rule) in `cases` on trees of `widths` has TV < 1e-12."""
    tvs = {name: tv_from_target(target, widths, sampled, rule) for name, target, sampled, rule in cases}
    assert tvs and all(tv < 1e-12 for tv in tvs.values()), tvs
    return tvs


def check_without_never_less(seed, k):
    """The third, on the text sampled with `seed`, for k siblings (to hold: k = 2): without replacement accepts
    less at no position and more at some; (its wins, the positions)."""
    _, wins, positions = compare_drawing(seed, k)
    assert wins["with"] == 0 and wins["without"] > 0, wins
    return wins["without"], positions


first = check_d_first(D, B)
tvs = check_still_exact(cases[2:], [3])
print(f"D first: D emitted with probability {first[D]:.2f}, B never; three siblings: "
      + " and ".join(tvs) + " still exact (TV < 1e-12)")
for seed in (1, 2, 3):
    more, positions = check_without_never_less(seed, 2)
    print(f"seed {seed}: without replacement accepts more at {more} of {positions} positions, less at none")
