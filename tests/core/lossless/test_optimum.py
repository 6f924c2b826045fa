"""The optimum of k drafts at one position, and how far the library's rules are from it.

- The subset formula (the dual) equals a max flow (the primal) that is checked feasible: a feasible
  plan and a cut of equal value prove each other optimal (every cut bounds every plan). scipy's
  linprog on the ordered-draft LP is a third opinion (scipy is in the test extra).
- The plan is a real verifier (optimum.optimal_rule): lossless by exact enumeration, and it
  accepts exactly the optimum, so the optimum is reached, not just bounded.
- Every paired rule (recursive, recursive_wor, point_mass) is lossless and accepts at most the
  optimum; equality where theory says so (one draft; deterministic drafts); a real gap elsewhere.
- Negative controls: a misread formula is caught by a lossless rule beating it; a rule that
  accepts too much is caught by the bound and by its output; a mismatched rule that stays under the
  bound is caught only by its output distribution, which is why both checks run together.
- Chains: token-wise verification against block verification and the per-prefix coupling bound.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import always_accept, tables, weights
from specdec_np import verify
from specdec_np.proofs import exact, optimum

TOL = 1e-12


def pair(seed, V):
    """A target p and a draft q on V tokens, with zeros and ties (helpers.weights)."""
    rng = np.random.default_rng(seed)
    return weights(rng, V), weights(rng, V)


def lossless_error(outcomes, p):
    return exact.total_variation(optimum.output_distribution(outcomes), dict(enumerate(p)))


case = dict(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5), k=st.integers(1, 3),
            scheme=st.sampled_from(optimum.SCHEMES))


# ----------------------------------------------------------------------------- the drafts

@settings(deadline=None, max_examples=15)
@given(**case)
def test_draft_tuples_are_what_the_builder_draws(seed, V, k, scheme):
    _, q = pair(seed, V)
    drawn = exact.outcomes(lambda rand: tuple(int(x) for x in optimum.one_level_tree(q, k, scheme, rand).tokens[1:]))
    mine = optimum.draft_tuples(q, k, scheme)
    assert set(drawn) == set(mine)
    assert max(abs(drawn[t] - mine[t]) for t in mine) < TOL


# ----------------------------------------------------------------------------- dual == primal

def cut_values_by_loops(p, drafts):
    """The subset formula written out with Python sets, to check the bitmask version."""
    V = len(p)
    out = {}
    for r in range(V + 1):
        for H in itertools.combinations(range(V), r):
            outside = sum(prob for tokens, prob in drafts.items() if not set(tokens) <= set(H))
            out[H] = sum(p[x] for x in H) + outside
    return out


@settings(deadline=None, max_examples=40)
@given(**case)
def test_subset_formula_equals_a_feasible_max_flow(seed, V, k, scheme):
    p, q = pair(seed, V)
    drafts = optimum.draft_tuples(q, k, scheme)
    cuts = optimum.cut_values(p, drafts)
    for H, value in cut_values_by_loops(p, drafts).items():
        assert abs(cuts[optimum.mask_of(H)] - value) < TOL
    masks, plan = optimum.optimal_plan(p, drafts)
    sets = optimum.draft_sets(drafts)
    # Feasible: nonnegative, only drafted tokens, within each set's probability and each token's p.
    assert plan.min() >= 0
    inside = np.array([[m >> y & 1 for y in range(V)] for m in masks], dtype=bool)
    assert np.all(plan[~inside] == 0)
    assert np.all(plan.sum(axis=1) <= np.array([sets[int(m)] for m in masks]) + TOL)
    assert np.all(plan.sum(axis=0) <= p + TOL)
    # A feasible plan's value never exceeds a cut's; equal values prove both optimal.
    assert abs(plan.sum() - optimum.optimal_acceptance(p, drafts)) < TOL


@settings(deadline=None, max_examples=10)
@given(**case)
def test_subset_formula_equals_linprog(seed, V, k, scheme):
    """scipy's LP over ordered draft tuples (not sets) agrees."""
    from scipy.optimize import linprog
    p, q = pair(seed, V)
    drafts = optimum.draft_tuples(q, k, scheme)
    variables = [(t, y) for t in drafts for y in sorted(set(t))]  # x[t, y]: drafts t, output y, accepted
    A = np.zeros((len(drafts) + V, len(variables)))
    for j, (t, y) in enumerate(variables):
        A[list(drafts).index(t), j] = 1.0  # sum over y of x[t, y] <= P(t)
        A[len(drafts) + y, j] = 1.0  # sum over t of x[t, y] <= p(y)
    b = np.concatenate([list(drafts.values()), p])
    res = linprog(-np.ones(len(variables)), A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    assert res.status == 0
    assert abs(-res.fun - optimum.optimal_acceptance(p, drafts)) < 1e-9


@settings(deadline=None, max_examples=40)
@given(**case)
def test_the_optimal_plan_is_a_lossless_verifier_that_reaches_the_optimum(seed, V, k, scheme):
    p, q = pair(seed, V)
    drafts = optimum.draft_tuples(q, k, scheme)
    out = optimum.single_position(optimum.optimal_rule(p, drafts), p, q, k, scheme)
    assert lossless_error(out, p) < TOL
    assert abs(optimum.acceptance(out) - optimum.optimal_acceptance(p, drafts)) < TOL


# ----------------------------------------------------------------------------- the library's rules

@settings(deadline=None, max_examples=40)
@given(**case)
def test_every_paired_rule_is_lossless_and_under_the_optimum(seed, V, k, scheme):
    p, q = pair(seed, V)
    out = optimum.single_position(verify.RULES[optimum.PAIRED_RULE[scheme]], p, q, k, scheme)
    assert lossless_error(out, p) < TOL
    assert optimum.acceptance(out) <= optimum.optimal_acceptance(p, optimum.draft_tuples(q, k, scheme)) + TOL


@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5))
def test_one_draft_optimum_is_token_wise_rejection(seed, V):
    p, q = pair(seed, V)
    best = optimum.optimal_acceptance(p, optimum.draft_tuples(q, 1, "with"))
    assert abs(best - np.minimum(p, q).sum()) < TOL
    for rule in (verify.verify_chain, verify.verify_recursive):
        assert abs(optimum.acceptance(optimum.single_position(rule, p, q, 1, "with")) - best) < TOL


@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5), k=st.integers(1, 5))
def test_point_mass_is_optimal_for_deterministic_drafts(seed, V, k):
    """A fixed draft set D: no verifier accepts more than p(D), and point-mass reaches it; 1 once D
    covers p's support."""
    p, q = pair(seed, V)
    drafts = optimum.draft_tuples(q, k, "deterministic")
    (D,) = drafts
    best = optimum.optimal_acceptance(p, drafts)
    assert abs(best - p[list(D)].sum()) < TOL
    out = optimum.single_position(verify.verify_point_mass, p, q, k, "deterministic")
    assert abs(optimum.acceptance(out) - best) < TOL
    if set(np.flatnonzero(p > 0)) <= set(D):
        assert abs(best - 1) < TOL


P4 = np.array([0.45, 0.30, 0.15, 0.10])  # lessons 3 and 6's target and draft
Q4 = np.array([0.20, 0.50, 0.05, 0.25])


@pytest.mark.parametrize("scheme", ["with", "without"])
def test_sampled_siblings_leave_a_real_gap(scheme):
    best = optimum.optimal_acceptance(P4, optimum.draft_tuples(Q4, 2, scheme))
    got = optimum.acceptance(optimum.single_position(verify.RULES[optimum.PAIRED_RULE[scheme]], P4, Q4, 2, scheme))
    assert best - got > 0.05  # 0.8375 vs 0.7375 with replacement, 0.979 vs 0.800 without


# ----------------------------------------------------------------------------- negative controls

def misread_optimum(p, drafts):
    """Broken on purpose: p(H) + P(*every* draft outside H) -- equal to the right formula for one
    draft, too small for several."""
    sets = optimum.draft_sets(drafts)
    return min(sum(p[x] for x in range(len(p)) if H >> x & 1) + sum(pr for m, pr in sets.items() if m & H == 0)
               for H in range(2 ** len(p)))


def test_a_misread_optimum_is_beaten_by_a_lossless_rule():
    drafts = optimum.draft_tuples(Q4, 2, "with")
    out = optimum.single_position(verify.verify_recursive, P4, Q4, 2, "with")
    assert lossless_error(out, P4) < TOL
    assert optimum.acceptance(out) > misread_optimum(P4, drafts) + 0.1  # 0.7375 > 0.4625: caught
    assert optimum.acceptance(out) <= optimum.optimal_acceptance(P4, drafts) + TOL


def test_accepting_too_often_is_caught_by_the_bound_and_the_output():
    out = optimum.single_position(always_accept, P4, Q4, 2, "with")
    assert optimum.acceptance(out) > optimum.optimal_acceptance(P4, optimum.draft_tuples(Q4, 2, "with")) + 0.1
    assert lossless_error(out, P4) > 0.1  # its output is q's, not p's


@pytest.mark.parametrize("scheme, rule", [("without", verify.verify_recursive), ("with", verify.verify_recursive_wor)])
def test_a_mismatched_rule_under_the_bound_is_caught_only_by_its_output(scheme, rule):
    """The bound alone proves nothing: these rules accept less than the optimum yet are lossy."""
    out = optimum.single_position(rule, P4, Q4, 2, scheme)
    assert optimum.acceptance(out) <= optimum.optimal_acceptance(P4, optimum.draft_tuples(Q4, 2, scheme))
    assert lossless_error(out, P4) > 0.005


# ----------------------------------------------------------------------------- chains

def constant(dist):
    return lambda ctx: np.asarray(dist)


def test_chain_rules_on_block_verifications_example():
    """Sun et al.'s example: target (1/3, 2/3), draft (2/3, 1/3) at every position, 2 drafts:
    token-wise 10/9 accepted, block verification 11/9, the per-prefix coupling bound 12/9."""
    target, draft = constant([1 / 3, 2 / 3]), constant([2 / 3, 1 / 3])
    assert abs(optimum.expected(optimum.chain_accepted(verify.verify_chain, target, draft, 0, 2)) - 10 / 9) < TOL
    assert abs(optimum.chain_coupling_bound(target, draft, 0, 2) - 12 / 9) < TOL
    assert abs(optimum.expected(optimum.chain_accepted(verify.verify_block, target, draft, 0, 2)) - 11 / 9) < TOL


@settings(deadline=None, max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 4), length=st.integers(1, 3))
def test_token_wise_chain_under_block_under_the_coupling_bound(seed, V, length):
    target, draft = tables(seed, V)
    root = seed % V
    chain = optimum.expected(optimum.chain_accepted(verify.verify_chain, target, draft, root, length))
    bound = optimum.chain_coupling_bound(target, draft, root, length)
    assert chain <= bound + TOL
    got = optimum.expected(optimum.chain_accepted(verify.verify_block, target, draft, root, length))
    assert chain - TOL <= got <= bound + TOL
