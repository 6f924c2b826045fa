"""Exact losslessness of every verification rule, with negative controls.

For each rule and the builder it is paired with, `exact.outcomes` enumerates every random branch
of the real code (drafting sampled children, verifying, completing with the target) and the
resulting distribution of the first m emitted tokens must equal the target's own distribution
P_target(x_1..x_m) to ~1e-12. A step that emits fewer than m tokens is completed by sampling
the target autoregressively, so the check covers the whole emitted block, not just its first
token. The negative controls (known mistakes, written here as small variants) must fail it.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (TOL, always_accept, assert_lossless, callback, context, dense_tables, keep_top_k,
                     sampled, tables, target_rows)
from specdec_np import verify
from specdec_np.build import build_best_first, build_chain, build_fixed
from specdec_np.proofs import exact
from specdec_np.sampling import Rand, process
from specdec_np.tree import Tree, children, path_to

# ----------------------------------------------------------------------------- tables
# helpers.tables(seed, V): a target and a draft table (a lazily generated distribution per context),
# with zeros, ties and near-ties, the draft at random independent, equal, disjoint, near or one-hot;
# helpers.callback serves a table to the builders as their dist_fn.


def one_hot(dist):
    """The temperature-0 target: one-hot on the argmax (ties -> lowest id)."""
    return lambda ctx: process(np.log(np.maximum(dist(ctx), 1e-300)), temperature=0)


# Tree shapes: small enough that every branch can be enumerated quickly.
SAMPLED_WIDTHS = [(1,), (2,), (3,), (1, 1), (2, 1), (1, 2), (1, 1, 1), (4,)]
DET_WIDTHS = [(1,), (2,), (3,), (2, 1), (1, 2), (2, 2), (3, 1), (1, 1, 1), (2, 1, 1)]

common = dict(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5), m=st.integers(2, 3))


def root_of(seed, V):
    return seed % V


# ----------------------------------------------------------------------------- positive: every rule

@settings(max_examples=30)
@given(**common, widths=st.sampled_from(DET_WIDTHS))
def test_point_mass_lossless_on_fixed_trees(seed, V, m, widths):
    target, draft = tables(seed, V)
    build = lambda root, dist_fn, rand: build_fixed(root, dist_fn, widths)
    assert_lossless(build, verify.verify_point_mass, draft, target, root_of(seed, V), m)


@settings(max_examples=30)
@given(**common, budget=st.integers(0, 6), max_depth=st.integers(0, 3))
def test_point_mass_lossless_on_best_first_trees(seed, V, m, budget, max_depth):
    target, draft = tables(seed, V)
    build = lambda root, dist_fn, rand: build_best_first(root, dist_fn, budget, max_depth)
    assert_lossless(build, verify.verify_point_mass, draft, target, root_of(seed, V), m)


@settings(max_examples=30)
@given(**common, k=st.integers(0, 3))
def test_chain_lossless_on_sampled_chains(seed, V, m, k):
    target, draft = tables(seed, V)
    build = lambda root, dist_fn, rand: build_chain(root, dist_fn, k, rand=rand)
    assert_lossless(build, verify.verify_chain, draft, target, root_of(seed, V), m)


@settings(max_examples=25)
@given(**common, widths=st.sampled_from(SAMPLED_WIDTHS + [(2, 2)]))
def test_recursive_lossless_with_replacement(seed, V, m, widths):
    V = 3 if widths == (2, 2) else V  # keep the enumeration small
    target, draft = tables(seed, V)
    assert_lossless(sampled(widths), verify.verify_recursive, draft, target, root_of(seed, V), m)


@settings(max_examples=25)
@given(**common, widths=st.sampled_from(SAMPLED_WIDTHS + [(2, 2), (3, 1)]))
def test_recursive_lossless_without_replacement(seed, V, m, widths):
    V = 3 if widths == (2, 2) else V  # keep the enumeration small
    target, draft = tables(seed, V)
    assert_lossless(sampled(widths, replacement=False), verify.verify_recursive_wor, draft, target, root_of(seed, V), m)


@settings(max_examples=30)
@given(**common, shape=st.sampled_from(["fixed", "best_first", "chain", "sampled"]))
def test_greedy_matches_target_argmax(seed, V, m, shape):
    target, draft = tables(seed, V)
    target = one_hot(target)
    build = {
        "fixed": lambda root, dist_fn, rand: build_fixed(root, dist_fn, (2, 2)),
        "best_first": lambda root, dist_fn, rand: build_best_first(root, dist_fn, 5, 3),
        "chain": lambda root, dist_fn, rand: build_chain(root, dist_fn, 3),
        "sampled": lambda root, dist_fn, rand: build_fixed(root, dist_fn, (2, 1), rand=rand),
    }[shape]
    assert_lossless(build, verify.verify_greedy, draft, target, root_of(seed, V), m)


# ----------------------------------------------------------------------------- trees that stop where the draft doubts
# Plan.min_q: a drafted node whose q is below it gets no children. Each rule on trees of the kind it is lossless on.
STOPPING = {"point_mass": ((2, 1, 1), None, verify.verify_point_mass), "chain": ((1, 1, 1), True, verify.verify_chain),
            "block": ((1, 1, 1), True, verify.verify_block), "recursive": ((2, 1), True, verify.verify_recursive),
            "recursive_wor": ((2, 1), False, verify.verify_recursive_wor),
            "traversal": ((2, 1), False, verify.verify_traversal),
            "traversal, with replacement": ((1, 2), True, verify.verify_traversal)}


def stopping(widths, replacement, min_q):
    """A builder of trees of `widths` whose doubted nodes are leaves: top tokens (replacement None) or drawn."""
    return lambda root, dist_fn, rand: build_fixed(root, dist_fn, widths, rand=None if replacement is None else rand,
                                                   replacement=bool(replacement), min_q=min_q)


@settings(max_examples=40)
@given(**common, name=st.sampled_from(sorted(STOPPING)), min_q=st.sampled_from([0.2, 0.35, 0.5]))
def test_every_rule_lossless_on_trees_that_stop_below_a_doubted_token(seed, V, m, name, min_q):
    """Whether a node gets children is decided from its own q before they are drawn: every rule stays lossless."""
    widths, replacement, rule = STOPPING[name]
    target, draft = tables(seed, V)
    assert_lossless(stopping(widths, replacement, min_q), rule, draft, target, root_of(seed, V), m)


def prune_doubted(widths, replacement, min_q):
    """Broken: the children drawn as always, then each doubted one dropped with what lies below it: the children
    kept are no longer draws from q (those the draft doubts never are)."""
    def build(root, dist_fn, rand):
        tree = build_fixed(root, dist_fn, widths, rand=rand, replacement=replacement)
        kept = [i for i in range(len(tree)) if all(tree.q[j] >= min_q for j in path_to(tree, i))]
        new = {old: k for k, old in enumerate(kept)}
        return Tree(tree.tokens[kept], [-1] + [new[tree.parents[i]] for i in kept[1:]], tree.q[kept], tree.kind,
                    draft_dists=tree.draft_dists[kept])
    return build


@pytest.mark.parametrize("name", ["chain", "recursive", "traversal"])
def test_negative_control_dropping_doubted_children_after_drawing_them(name):
    widths, replacement, rule = STOPPING[name]
    caught = 0
    for seed in range(10):
        target, draft = dense_tables(seed, 4)
        right = stopping(widths, replacement, 0.3)
        assert exact.step_error(right, rule, draft, target, 0, 2) < TOL
        # ... and its trees really do stop: some are smaller than the full shape.
        sizes = exact.outcomes(lambda rand: len(right(0, exact.callback(draft), rand)))
        assert min(sizes) < len(stopping(widths, replacement, 0.0)(0, exact.callback(draft), Rand(0)))
        caught += exact.step_error(prune_doubted(widths, replacement, 0.3), rule, draft, target, 0, 2) > 1e-3
    assert caught >= 7, f"dropping doubted children detected on only {caught}/10 examples"


def test_greedy_accepts_the_whole_matching_chain():
    target, draft = tables(1, 4, modes=("same",))
    target, draft = one_hot(target), one_hot(draft)
    tree = build_chain(0, callback(draft), 3)
    path, nxt = verify.verify_greedy(tree, target_rows(tree, target))
    assert path == [0, 1, 2, 3]  # a perfect draft: every token accepted, plus the bonus token
    assert nxt == int(np.argmax(target(context(tree.tokens, tree.parents, 3))))


def test_residual_guard_when_p_equals_q():
    p = np.array([0.5, 0.5, 0.0])
    np.testing.assert_array_equal(verify.residual(p, p), p)  # would be 0/0 without the guard
    np.testing.assert_allclose(verify.residual(p, np.array([0.8, 0.2, 0.0])), [0, 1, 0])


# ----------------------------------------------------------------------------- pairing checks

def test_check_pairing_and_check_tree():
    for rule in verify.RULES:
        verify.check_pairing("deterministic" if rule in ("greedy", "point_mass") else
                             "without_replacement" if rule == "recursive_wor" else "with_replacement", rule)
    for kind, rule in [("with_replacement", "point_mass"), ("deterministic", "chain"),
                       ("without_replacement", "recursive"), ("with_replacement", "recursive_wor"),
                       ("deterministic", "recursive")]:
        with pytest.raises(ValueError, match=rule):
            verify.check_pairing(kind, rule)
    with pytest.raises(ValueError, match="unknown verification rule"):
        verify.check_pairing("deterministic", "magic")
    with pytest.raises(ValueError, match="unknown tree kind"):
        verify.check_pairing("sampled", "greedy")
    q = np.full((3, 3), 1 / 3)
    fork = Tree([0, 1, 2], [-1, 0, 0], [1, 1 / 3, 1 / 3], kind="with_replacement", draft_dists=q)
    with pytest.raises(ValueError, match="one child"):
        verify.check_tree(fork, "chain")
    verify.check_tree(fork, "recursive")
    with pytest.raises(ValueError, match="distinct"):
        verify.check_tree(Tree([0, 1, 1], [-1, 0, 0], [1, 0.5, 0.5]), "point_mass")


# ----------------------------------------------------------------------------- negative controls

# helpers.always_accept: broken, accepts every drafted token of the (first-child) chain, then a bonus token.


def resample_from_p(tree, p, rand):
    """Broken: chain rule that resamples the correction from p instead of the residual."""
    path = [0]
    while True:
        node = path[-1]
        kids = children(tree, node)
        if kids.size == 0:
            return path, rand.draw(p[node])
        x = tree.tokens[kids[0]]
        if not rand.coin(verify.accept_ratio(p[node][x], tree.draft_dists[node][x])):
            return path, rand.draw(p[node])
        path.append(int(kids[0]))


def unnormalised_residual(tree, p, rand):
    """Broken: recursive rule whose residual max(p - q, 0) is not renormalised before the next sibling."""
    path = [0]
    while True:
        node = path[-1]
        kids = children(tree, node)
        p_res, q = p[node].copy(), tree.draft_dists[node]
        if kids.size == 0:
            return path, rand.draw(p_res)
        for c in kids:
            x = tree.tokens[c]
            if rand.coin(verify.accept_ratio(p_res[x], q[x])):
                path.append(int(c))
                break
            p_res = np.maximum(p_res - q, 0.0)
            if p_res.sum() == 0:
                p_res = p[node].copy()
        else:
            return path, rand.draw(p_res)


def chain_with_q_equal_p(tree, p, rand):
    """Broken: the chain rule handed p as the draft distribution (accepts whenever p(x) > 0)."""
    return verify.verify_chain(Tree(tree.tokens, tree.parents, tree.q, tree.kind, draft_dists=p), p, rand)


def fixed_example(seed=0, V=5):
    target, draft = dense_tables(seed, V)
    return target, draft, 0


NEGATIVE = {
    "always_accept": (sampled((1, 1)), always_accept),
    "resample_from_p": (sampled((1, 1)), resample_from_p),
    "unnormalised_residual": (sampled((3,)), unnormalised_residual),
    "wor_tree_with_wr_rule": (sampled((3,), replacement=False), verify.verify_recursive),
    "wr_tree_with_wor_rule": (sampled((3,)), verify.verify_recursive_wor),
    "chain_with_q_equal_p": (sampled((1, 1)), chain_with_q_equal_p),
}


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_negative_control_fails_on_fixed_example(name):
    build, rule = NEGATIVE[name]
    target, draft, root = fixed_example()
    assert exact.step_error(build, rule, draft, target, root, 2) > 1e-3
    # ... and the correct rule passes on the very same example.
    good = verify.verify_chain if name in ("always_accept", "resample_from_p", "chain_with_q_equal_p") else \
        verify.verify_recursive_wor if name == "wor_tree_with_wr_rule" else verify.verify_recursive
    assert exact.step_error(build, good, draft, target, root, 2) < TOL


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_negative_control_fails_on_most_random_examples(name):
    build, rule = NEGATIVE[name]
    caught = 0
    for seed in range(10):
        target, draft = dense_tables(seed, 5)
        caught += exact.step_error(build, rule, draft, target, 0, 1) > 1e-3
    assert caught >= 7, f"{name} detected on only {caught}/10 examples"


def test_negative_control_q_differs_from_sampling_distribution():
    """Children drawn from the top-2 processed draft, but the rule is handed the raw draft as q."""
    target, raw, root = fixed_example(seed=3)
    processed = lambda ctx: keep_top_k(raw(ctx), 2)

    def build_mismatched(root, dist_fn, rand):
        tree = build_chain(root, dist_fn, 2, rand=rand)  # draws from the processed draft
        wrong = np.array([raw(context(tree.tokens, tree.parents, i)) for i in range(len(tree))])
        return Tree(tree.tokens, tree.parents, tree.q, tree.kind, draft_dists=wrong)

    build_right = lambda root, dist_fn, rand: build_chain(root, dist_fn, 2, rand=rand)
    assert exact.step_error(build_right, verify.verify_chain, processed, target, root, 2) < TOL
    assert exact.step_error(build_mismatched, verify.verify_chain, processed, target, root, 2) > 1e-3


# ----------------------------------------------------------------------------- the enumerator itself

def test_outcomes_enumerates_exactly():
    def fn(rand):
        a = rand.coin(0.25)
        b = rand.draw([0.0, 1.0, 3.0]) if a else rand.draw([2.0, 0.0, 0.0])
        return (a, b, rand.coin(0.0), rand.coin(1.0))
    got = exact.outcomes(fn)
    want = {(True, 1, False, True): 0.25 * 0.25, (True, 2, False, True): 0.25 * 0.75, (False, 0, False, True): 0.75}
    assert set(got) == set(want) and all(abs(got[k] - want[k]) < 1e-15 for k in want)


def test_outcomes_rejects_nondeterministic_fn():
    state = {"n": 0}

    def fn(rand):
        state["n"] += 1
        return rand.coin(0.5) if state["n"] == 1 else None  # makes fewer choices on replay
    with pytest.raises(RuntimeError, match="deterministic"):
        exact.outcomes(fn)
