# %% [markdown]
# # Lesson 9: how close is each rule to the best possible?
#
# You will compute, for one position, the best acceptance any lossless verifier could reach, from a
# small formula over subsets of the vocabulary. You will build the verifier that reaches it and set
# each library rule next to it. Then you will do the same for chains: token by token against the
# whole block.
#
# Lesson 6 proved each tree rule lossless. Lossless is the constraint; acceptance is the goal.
# How many drafts could *any* lossless rule accept? For one position the question has an exact
# answer, and it depends on **how the drafts were drawn** (with replacement, without, or the
# draft's top k), so every number below says which.
#
# One position, k drafts: the draft proposes k tokens from q; a verifier sees them and the
# target's p, and outputs a token y that must be distributed exactly as p. It *accepts* when y is
# one of the drafts. Over all such verifiers the best acceptance is an optimal-transport problem
# (SpecTr, Sun et al. 2023): couple the random set D of drafted tokens with y ~ p so that
# P(y in D) is largest. Its dual (Hu et al. 2025, "Towards Optimal Multi-draft Speculative
# Decoding") is a minimum over subsets H of the vocabulary:
#
#     alpha* = min over H of  p(H) + P(D not inside H)
#
# Any H gives an upper bound: if y is accepted and all drafts lie in H, then y is in H; so
# P(accept) <= P(y in H) + P(D not inside H). The drafts' favourite tokens make the tightest H:
# the verifier has to reject at least the excess P(D inside H) - p(H).

# %%
import numpy as np

from specdec_np import build, verify
from specdec_np.proofs import exact, optimum
try:
    from lesson import check, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/09_optimal_verification.py")

NAMES = "ABCD"
p = np.array([0.45, 0.30, 0.15, 0.10])  # target (lessons 3 and 6)
q = np.array([0.20, 0.50, 0.05, 0.25])  # draft: too fond of B and D
try_this("q = p: the draft is the target", np.array_equal(q, p))
SCHEME_NAMES = {"with": "drawn from q with replacement", "without": "drawn from q without replacement",
                "deterministic": "q's top k (deterministic)"}


def names(tokens):
    return "{" + ",".join(NAMES[x] for x in tokens) + "}"


# %% [markdown]
# ## The subset formula, by hand
#
# Two drafts drawn from q with replacement. `optimum.draft_tuples` lists every ordered pair
# with its probability; `optimum.cut_values` evaluates p(H) + P(D not inside H) for all 16
# subsets H. The smallest few:

# %%
K = 2  # drafts
try_this(f"{K} drafts", K != 2)
drafts = optimum.draft_tuples(q, K, "with")
cuts = optimum.cut_values(p, drafts)
print(f"{len(drafts)} ordered {'pairs' if K == 2 else f'{K}-tuples'} of drafts, e.g. ({', '.join('B' * K)}) with probability {drafts[(1,) * K]:.4f}")
print("   H          p(H)  P(D not in H)  bound")
for H in np.argsort(cuts, kind="stable")[:5]:
    tokens = [x for x in range(4) if H >> x & 1]
    print(f"  {names(tokens):<10} {p[tokens].sum():.3f}  {cuts[H] - p[tokens].sum():.4f}         {cuts[H]:.4f}")
best = optimum.optimal_acceptance(p, drafts)
print(f"alpha* = {best:.4f}, reached at H = {names(optimum.bottleneck(p, drafts))}")
assert abs(best - cuts.min()) < 1e-15
# One draft: the best H is where q exceeds p, and alpha* is lesson 3's sum(min(p, q)).
assert abs(optimum.optimal_acceptance(p, optimum.draft_tuples(q, 1, "with")) - np.minimum(p, q).sum()) < 1e-12

# %% [markdown]
# ## The bound is reached: a verifier built from the max flow
#
# The primal side: send flow from each draft set S (capacity P(D = S)) to the tokens in S and on
# to the target (capacity p(y)). `optimum.optimal_plan` runs a max flow; its value equals the
# smallest cut (max-flow = min-cut), which is the subset formula. The flow *is* a verifier: given
# the drafts S, accept y in S with probability plan[S, y] / P(S), otherwise draw from what p is
# still owed. We check it like every rule in this project, by enumerating every random branch.

# %%
masks, plan = optimum.optimal_plan(p, drafts)
# Every column at 4 decimals: a row's accepts are parts of its P(set) and never add up to more.
print("draft set  P(set)   accepted as A, B, C, D")
for m, row in zip(masks, plan):
    tokens = [x for x in range(4) if m >> x & 1]
    print(f"  {names(tokens):<8} {optimum.draft_sets(drafts)[int(m)]:.4f}   " + " ".join(f"{v:.4f}" for v in row))
out = optimum.single_position(optimum.optimal_rule(p, drafts), p, q, K, "with")
tv = exact.total_variation(optimum.output_distribution(out), dict(enumerate(p)))
print(f"flow value {plan.sum():.4f}; the verifier built from it accepts {optimum.acceptance(out):.4f}, "
      f"TV from p = {tv:.1e}")
assert tv < 1e-12 and abs(optimum.acceptance(out) - best) < 1e-12 and abs(plan.sum() - best) < 1e-12
assert all(row.sum() <= optimum.draft_sets(drafts)[int(m)] + 1e-12 for m, row in zip(masks, plan))

# %% [markdown]
# ## Each rule next to the optimum
#
# For each way of drawing k = 1..3 drafts, the library's paired rule (lesson 6) runs on a tree of
# one level, the root and its k children, built by `build.build_fixed` exactly as decoding builds
# it; `optimum.single_position` enumerates every branch of drafting and verifying. In the chart,
# `#` is the rule's acceptance and `+` what the optimum would add.

# %%
WIDTH = 50


def cells(value, full=1.0):  # how many of WIDTH characters `value` fills (rounding 0.65 and 0.65 + 1e-16 alike)
    return int(WIDTH * value / full + 0.5 + 1e-9)


def bar(got, best):
    n_got, n_best = cells(got), cells(best)
    return "#" * n_got + "+" * (n_best - n_got) + "." * (WIDTH - n_best)


gaps, optima = {}, {}
for scheme in optimum.SCHEMES:
    rule_name = optimum.PAIRED_RULE[scheme]
    print(f"\ndrafts {SCHEME_NAMES[scheme]}, rule '{rule_name}'")
    for k in (1, 2, 3):
        out = optimum.single_position(verify.RULES[rule_name], p, q, k, scheme)
        got = optimum.acceptance(out)
        best = optimum.optimal_acceptance(p, optimum.draft_tuples(q, k, scheme))
        tv = exact.total_variation(optimum.output_distribution(out), dict(enumerate(p)))
        print(f"  k={k} {bar(got, best)} {got:.3f} of {best:.3f}")
        assert tv < 1e-12, "every paired rule is lossless"
        assert got <= best + 1e-12, "no lossless rule beats the optimum"
        gaps[scheme, k], optima[scheme, k] = best - got, best

assert gaps["with", 1] < 1e-12 and gaps["without", 1] < 1e-12  # one draft: token-wise rejection is optimal
# The text's one-draft figures: sum(min(p, q)) when drawn, p of q's argmax when deterministic.
assert abs(optima["with", 1] - np.minimum(p, q).sum()) < 1e-12 and abs(optima["without", 1] - optima["with", 1]) < 1e-12
assert abs(optima["deterministic", 1] - p[np.argmax(q)]) < 1e-12
check(optima["deterministic", 1] < optima["with", 1], "one deterministic draft accepts no less than one drawn")
assert all(gaps["deterministic", k] < 1e-12 for k in (1, 2, 3))  # point-mass reaches p(drafts)
check(gaps["with", 2] > 0.05 and gaps["without", 2] > 0.05, "no gap between two sampled siblings' rule and the optimum")
assert all(optima["without", k] >= optima["with", k] - 1e-12 for k in (1, 2, 3))  # distinct drafts cover more

# %% [markdown]
# What the chart shows:
#
# * **One draft**: drawn from q (with or without replacement is the same for one draft), the optimum
#   is sum(min(p, q)) = 0.650 and the classic rule min(1, p/q) reaches it: it is optimal for one
#   draft. The deterministic draft differs: it is always q's argmax, B, so the most any rule can
#   accept is p(B) = 0.300, and point mass reaches that. A draft that is always the draft's
#   favourite loses where q's favourite is not p's.
# * **Deterministic drafts**: nothing can be accepted that was not drafted, so the optimum is p of
#   the drafted set, and point-mass verification reaches it. Here q's top tokens are B and D, which
#   p does not favour: more drafts help little until A is among them (k = 3).
# * **Sampled drafts**: recursive rejection sampling falls short, with replacement and without.
#   It tests the drafts one at a time, each against what is still owed; the first draft's test
#   cannot know that the second draft will offer the token p wants. With replacement it also wastes
#   repeats (B twice). The optimum looks at the whole set at once.
# * Without replacement, the *optimum* is higher than with replacement for the same k: distinct
#   drafts cover more of p. Choosing how to draw matters as much as how to verify.
#
# The optimum is a yardstick, not a faster decoder: the verifier above needs a max flow over all
# 2^V subsets, hopeless for GPT-2's 50257 tokens. Practical rules trade some acceptance for cost.

# %% [markdown]
# ## Lossless and accepting are separate claims
#
# Staying under the optimum proves nothing about the output. Verifying without-replacement drafts
# with the with-replacement rule (lesson 6's mismatched pairing) accepts *less* than the optimum,
# and still changes the output distribution; a rule that always accepts the first draft goes over
# the bound. The tests run both checks together.

# %%
drafts_wo = optimum.draft_tuples(q, 2, "without")
out = optimum.single_position(verify.verify_recursive, p, q, 2, "without")
tv = exact.total_variation(optimum.output_distribution(out), dict(enumerate(p)))
print(f"recursive on without-replacement drafts: accepts {optimum.acceptance(out):.3f} "
      f"<= optimum {optimum.optimal_acceptance(p, drafts_wo):.3f}, yet TV from p = {tv:.4f}")
assert optimum.acceptance(out) <= optimum.optimal_acceptance(p, drafts_wo)
check(tv > 0.005, "the mismatched pairing kept the output distribution")

# %% [markdown]
# ## Chains: token by token, or the whole block
#
# A chain of L drafts drawn one after the other from the draft's table (lesson 3's P and Q, which
# depend on the previous token). `verify_chain` tests token by token and stops at the first
# rejection. Block verification (Sun et al., ICLR 2025) decides the accepted prefix jointly, and no
# lossless verifier of one sampled chain keeps more in expectation.
#
# For comparison, a bound any verifier obeys: accepting j drafts makes the output's first j tokens
# (distributed as p) equal the drafts' (distributed as q), which a coupling achieves at most with
# probability sum over x_1..x_j of min(p(x_1..x_j), q(x_1..x_j)). Summed over j, that bounds the
# expected accepted length, but the prefixes are bounded one at a time, so it need not be reachable.

# %%
P = np.array([p, [0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])  # P[last] = target
Q = np.array([q, [0.4, 0.3, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7], [0.6, 0.0, 0.2, 0.2]])  # Q[last] = draft
target, draft = (lambda ctx: P[ctx[-1]]), (lambda ctx: Q[ctx[-1]])
chain_rules = {"token-wise": verify.verify_chain, "block": verify.RULES["block"]}


def length_bar(value, most):
    return "#" * cells(value, most)


for L in (1, 2, 3, 4):
    bound = optimum.chain_coupling_bound(target, draft, 0, L)
    print(f"\nchain of {L}: expected accepted drafts (the bar's full width is {L})")
    found = {}
    for name, rule in chain_rules.items():
        found[name] = optimum.expected(optimum.chain_accepted(rule, target, draft, 0, L))
        print(f"  {name:<11} {length_bar(found[name], L):<{WIDTH}} {found[name]:.3f}")
    print(f"  {'bound':<11} {length_bar(bound, L):<{WIDTH}} {bound:.3f}")
    assert found["token-wise"] <= bound + 1e-12
    if "block" in found:
        assert found["token-wise"] - 1e-12 <= found["block"] <= bound + 1e-12
        if L == 1:  # one draft: block verification is the classic rule
            assert abs(found["block"] - found["token-wise"]) < 1e-12

# %% [markdown]
# **How block verification works.** Token-wise rejection judges each draft on its own: x_i is kept
# with probability min(1, p(x_i)/q(x_i)), and a draft the draft model over-proposes is at risk even
# when the next draft would make up for it. Block verification judges prefixes. Going forward it
# gives each prefix a weight, a_i = min(1, a_(i-1) p(x_i)/q(x_i)) with a_0 = 1: the share of the
# prefix x_1..x_i the target still "wants", where a later token with p > q can win back what an
# earlier one with p < q lost.
#
# Going backward, from the whole chain towards the root, it keeps x_1..x_i with probability a_i at
# the end of the chain and with a stopping weight (what is still owed there against what the draft
# over-proposed, `verify.stop_weight`) before it, and after a stop draws the correction from
# norm(max(a_i p - q, 0)).
#
# On one draft it is the classic rule. An example, with the two-token tables of the next cell (the
# target prefers the second token, 1/3 : 2/3, the draft the first, 2/3 : 1/3): the chain drafted A
# then B. Token-wise, A is kept with probability 1/2 (p/q = 1/2) and B then surely (p/q = 2); block
# verification has a_1 = 1/2 and a_2 = min(1, 1/2 x 2) = 1, so it keeps both, always. Over every
# drafted chain both rules are lossless (the tests enumerate them), and on average block
# verification never keeps fewer (the bars above).

# %%
from specdec_np.tree import Tree  # noqa: E402

two_p, two_q = np.array([1 / 3, 2 / 3]), np.array([2 / 3, 1 / 3])
a_then_b = Tree(tokens=[0, 0, 1], parents=[-1, 0, 1], q=[1.0, two_q[0], two_q[1]], kind="with_replacement",
                draft_dists=[two_q, two_q, np.zeros(2)])  # root, then A, then B: a drafted chain
kept = {name: exact.outcomes(lambda rand: len(rule(a_then_b, np.tile(two_p, (3, 1)), rand).path) - 1)
        for name, rule in chain_rules.items()}
for name, dist in kept.items():
    print(f"  chain A, B; {name:<10}: "
          + ", ".join(f"{n} kept with probability {pr:.2f}" for n, pr in sorted(dist.items())))
assert kept["token-wise"] == {0: 0.5, 2: 0.5} and kept["block"] == {2: 1.0}

# %% [markdown]
# Sun et al.'s own example makes the three levels exact: two tokens, the target prefers the
# second (1/3, 2/3), the draft the first (2/3, 1/3), at every position, chains of 2. Token-wise
# verification accepts 10/9 drafts on average, block verification 11/9, and the per-prefix bound
# is 12/9, which no lossless verifier of the chain reaches (block verification is optimal).

# %%
t2, d2 = (lambda ctx: np.array([1 / 3, 2 / 3])), (lambda ctx: np.array([2 / 3, 1 / 3]))
try_this("d2 = t2: the draft is the target", d2 is t2)
example = {name: optimum.expected(optimum.chain_accepted(rule, t2, d2, 0, 2)) for name, rule in chain_rules.items()}
example["bound"] = optimum.chain_coupling_bound(t2, d2, 0, 2)
print("  ".join(f"{name}: {v * 9:.2f}/9" for name, v in example.items()))
check(abs(example["token-wise"] - 10 / 9) < 1e-12 and abs(example["bound"] - 12 / 9) < 1e-12,
      "token-wise and the bound are not Sun et al.'s 10/9 and 12/9")
if "block" in example:
    check(abs(example["block"] - 11 / 9) < 1e-12, "block verification is not Sun et al.'s 11/9")

# %% [markdown]
# ## Trees: traversal verification
#
# On a tree, recursive rejection sampling decides top-down: once a node is rejected its whole
# subtree is gone, even if a token below it would have made up for it. Traversal verification (Weng
# et al. 2025) carries block verification's prefix weights to trees. Each node gets a weight when
# its parent first reaches it, a = min(1, a_parent p_owed(x)/q_left(x)), and the tree is tested from
# the leaves towards the root (post-order): a node is tested only after all of its children were
# rejected, and is kept with its current weight.
#
# When a child fails, its parent's owed distribution becomes norm(max(a p_owed - q_left, 0)) and its
# weight a stopping weight, as in block verification; without replacement the failed token also
# leaves q_left, as in recursive rejection. On a chain it is block verification; on a tree of depth
# 1 it is recursive rejection.
#
# An example on the two-token tables: the root's children A (with a child B) and B. Recursive
# rejection tests A first, keeps it half the time (and then B below it), and otherwise falls back to
# the sibling B; traversal weighs the path A, B as a whole (weight 1) and keeps it always.

# %%
a_b_and_b = Tree(tokens=[0, 0, 1, 1], parents=[-1, 0, 1, 0], q=[1.0, two_q[0], two_q[1], two_q[1]],
                 kind="with_replacement", draft_dists=[two_q, two_q, np.zeros(2), np.zeros(2)])
for name in ("recursive", "traversal"):
    paths = exact.outcomes(lambda rand: tuple(verify.RULES[name](a_b_and_b, np.tile(two_p, (4, 1)), rand).path))
    shown = [("-".join("root" if i == 0 else "AB"[a_b_and_b.tokens[i]] for i in path), pr)
             for path, pr in sorted(paths.items())]
    print(f"  {name:<10}: " + ", ".join(f"path {path} with probability {pr:.2f}" for path, pr in shown))
    assert paths == ({(0, 1, 2): 0.5, (0, 3): 0.5} if name == "recursive" else {(0, 1, 2): 1.0})

# %% [markdown]
# Expected accepted drafts on a small tree (2 children at the root, 1 below each) sampled as the
# rule assumes, over every way of drafting it:

# %%
def tree_accepted(rule, replacement):
    def step(rand):
        tree = build.build_fixed(0, lambda tokens, parents, nodes: Q[tokens[nodes]], [2, 1], rand=rand,
                                 replacement=replacement)
        path, _ = rule(tree, P[tree.tokens], rand)
        return len(path) - 1
    return optimum.expected(exact.outcomes(step))


for replacement, base in ((True, "recursive"), (False, "recursive_wor")):
    kind = "with" if replacement else "without"
    ours = tree_accepted(verify.RULES[base], replacement)
    theirs = tree_accepted(verify.RULES["traversal"], replacement)
    print(f"  siblings drawn {kind:<7} replacement: {base:<13} {ours:.3f}   traversal {theirs:.3f}")
    assert theirs >= ours - 1e-12

# %% [markdown]
# ## A picture (only if matplotlib is installed)
#
# The same single-position numbers as a plot, written to `out/` (ignored by git).

# %%
from lesson import out_dir  # noqa: E402  (tutorials/lesson.py)

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2), sharey=True)
    for ax, scheme in zip(axes, optimum.SCHEMES):
        ks = [1, 2, 3]
        got = [optimum.acceptance(optimum.single_position(verify.RULES[optimum.PAIRED_RULE[scheme]], p, q, k, scheme))
               for k in ks]
        best = [optimum.optimal_acceptance(p, optimum.draft_tuples(q, k, scheme)) for k in ks]
        ax.plot(ks, best, marker="o", label="optimum")
        ax.plot(ks, got, marker="s", label=optimum.PAIRED_RULE[scheme])
        ax.set_title(SCHEME_NAMES[scheme], fontsize=9)
        ax.set_xlabel("drafts k")
        ax.set_xticks(ks)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("P(accept a draft)")
    fig.tight_layout()
    png = out_dir() / "tutorial_09_optimum.png"  # out/, or a temporary folder where out/ cannot be written
    fig.savefig(png)
    print(f"wrote {png}")
except ImportError:
    pass

# %% [markdown]
# ## Try this
#
# * Set `q = p` at the top. Drafts drawn from q (with or without replacement): every rule, and the
#   optimum, accept with probability 1 for every k. Drafts that are q's top k: the rule and the
#   optimum accept p's top k's mass, 0.45, 0.75, 0.90 for k = 1, 2, 3 (the draft never proposes the
#   other tokens, so when the target draws one of them no verifier can accept).
# * In Sun et al.'s example, make the draft equal the target (`d2 = t2`): token-wise, block and
#   the bound all become 2 (both drafts always kept).
# * Give the subset formula three drafts (`K = 3`) and find which H
#   is now the bottleneck.
#
# The first two predictions, checked:

# %%
def check_same_draft(p, q, ks=(1, 2, 3)):
    """The first prediction for the draft q (to hold, q = p): {(scheme, k): acceptance}, each scheme's rule equal
    to the optimum, 1 for drawn drafts and p's top k's mass for the deterministic ones."""
    got = {}
    for scheme in optimum.SCHEMES:
        for k in ks:
            rule = optimum.single_position(verify.RULES[optimum.PAIRED_RULE[scheme]], p, q, k, scheme)
            best = optimum.optimal_acceptance(p, optimum.draft_tuples(q, k, scheme))
            expected = np.sort(p)[::-1][:k].sum() if scheme == "deterministic" else 1.0
            got[scheme, k] = optimum.acceptance(rule)
            assert abs(got[scheme, k] - expected) < 1e-12 and abs(best - expected) < 1e-12, (scheme, k, got[scheme, k])
    assert got, "no case checked"
    return got


def check_equal_tables(target, draft, length=2):
    """The second (to hold, draft = target): token-wise, block and the bound all accept `length` drafts."""
    equal = {name: optimum.expected(optimum.chain_accepted(rule, target, draft, 0, length))
             for name, rule in chain_rules.items()}
    equal["bound"] = optimum.chain_coupling_bound(target, draft, 0, length)
    assert len(equal) > 1 and all(abs(v - length) < 1e-12 for v in equal.values()), equal
    return equal


same = check_same_draft(p, p.copy())
for scheme in optimum.SCHEMES:
    print(f"q = p, drafts {SCHEME_NAMES[scheme] + ':':<34} " + ", ".join(f"k={k} {same[scheme, k]:.3f}" for k in (1, 2, 3)))
equal = check_equal_tables(t2, t2)
print("equal tables in Sun et al.'s example: " + ", ".join(f"{name} {v:.0f}" for name, v in equal.items()))
