"""Block verification (chains) and traversal verification (trees): exact proofs, and what they buy.

The same check as test_verify_exact.py: `exact.outcomes` enumerates every random branch of the
real code (drawing the sampled draft, verifying, completing with the target) and the first m
emitted tokens must be distributed as the target's own, to 1e-12, on random small tables with
zeros, ties, point masses, disjoint supports and q == p, raw or top-k / top-p processed. Then:
the negative controls (the real rules with one piece swapped, or paired with the wrong trees)
fail that check; the expected number of accepted tokens, enumerated exactly, is never below the
token-wise rules' on the same drafts and sometimes above; the pairing errors; and end-to-end runs
through `generate` on the embedded models.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import (TOL, ar_greedy, assert_lossless, callback, dense_tables, processed, sampled, tables,
                     models_for, target_rows)
from specdec_np import verify
from specdec_np.build import build_chain, build_fixed
from specdec_np.decode import generate
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.sampling import SURE
from specdec_np.tree import Tree

PROCESSING = [dict(), dict(top_k=2), dict(top_p=0.7), dict(top_k=3, top_p=0.8)]


def chains(k):
    """A builder of chains of k tokens, each drawn from the draft (a sampled chain)."""
    return lambda root, dist_fn, rand: build_chain(root, dist_fn, k, rand=rand)


def case(seed, V, processing):
    """target, draft tables for one example, both processed alike (the draft's processed rows are
    what the tree is drawn from, so they are q)."""
    target, draft = tables(seed, V)
    return processed(target, **processing), processed(draft, **processing), seed % V


# ----------------------------------------------------------------------------- lossless

@settings(deadline=None, max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5), m=st.integers(2, 3), k=st.integers(0, 4),
       processing=st.sampled_from(PROCESSING))
def test_block_lossless_on_sampled_chains(seed, V, m, k, processing):
    V = min(V, 4) if k == 4 else V  # keep the enumeration small
    target, draft, root = case(seed, V, processing)
    assert_lossless(chains(k), verify.verify_block, draft, target, root, m)


TREES = [(1,), (2,), (3,), (1, 1), (2, 1), (1, 2), (1, 1, 1), (2, 2), (3, 1), (2, 1, 1)]


@settings(deadline=None, max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), V=st.integers(3, 5), m=st.integers(2, 3), widths=st.sampled_from(TREES),
       replacement=st.booleans(), processing=st.sampled_from(PROCESSING))
def test_traversal_lossless_on_sampled_trees(seed, V, m, widths, replacement, processing):
    if int(np.prod(widths)) * len(widths) > 3:
        V, m = 3, 2  # keep the enumeration small
    target, draft, root = case(seed, V, processing)
    assert_lossless(sampled(widths, replacement), verify.verify_traversal, draft, target, root, m)


def test_lossless_on_degenerate_tables():
    """Point masses, disjoint supports and q == p everywhere (the guards' 0/0 cases), for both rules."""
    V = 4
    eye = np.eye(V)
    spread = np.array([0.0, 0.5, 0.5, 0.0])
    cases = {
        "point masses, equal": (lambda ctx: eye[len(ctx) % V], lambda ctx: eye[len(ctx) % V]),
        "point masses, different": (lambda ctx: eye[len(ctx) % V], lambda ctx: eye[(len(ctx) + 1) % V]),
        "disjoint supports": (lambda ctx: spread, lambda ctx: np.array([0.5, 0.0, 0.0, 0.5])),
        "q == p": (lambda ctx: spread, lambda ctx: spread),
        "draft a point mass inside p": (lambda ctx: spread, lambda ctx: eye[1]),
    }
    for name, (target, draft) in cases.items():
        for k in (1, 3):
            assert exact.step_error(chains(k), verify.verify_block, draft, target, 0, 3) < TOL, name
        for widths in ((2, 1), (3,)):
            for replacement in (True, False):
                err = exact.step_error(sampled(widths, replacement), verify.verify_traversal, draft, target, 0, 2)
                assert err < TOL, (name, widths, replacement)


# ----------------------------------------------------------------------------- how the rules relate

def same_step(build, rule_a, rule_b, draft, target, root):
    """Total variation between two rules' (path, next token) distributions on the same drafts."""
    def outcomes(rule):
        return exact.marginal(exact.step_outcomes(build, rule, draft, target, root), lambda step: step[2:])
    return exact.total_variation(outcomes(rule_a), outcomes(rule_b))


@pytest.mark.parametrize("seed", range(6))
def test_traversal_is_block_verification_on_chains(seed):
    target, draft = dense_tables(seed, 4)
    for k in (1, 2, 3):
        assert same_step(chains(k), verify.verify_traversal, verify.verify_block, draft, target, 0) < TOL


@pytest.mark.parametrize("seed", range(6))
def test_traversal_is_recursive_rejection_on_one_level(seed):
    target, draft = dense_tables(seed, 4)
    for width in (1, 2, 3):
        assert same_step(sampled((width,)), verify.verify_traversal, verify.verify_recursive, draft, target, 0) < TOL
        assert same_step(sampled((width,), replacement=False), verify.verify_traversal, verify.verify_recursive_wor,
                         draft, target, 0) < TOL


# ----------------------------------------------------------------------------- expected accepted length

def expected_accepted(build, rules, draft, target, root) -> list:
    """E[drafted tokens accepted per step] under each rule, exactly, on the same drafts: every tree `build` draws
    from the draft is enumerated once, then every branch of each rule verifying it (P(tree) * P(branch | tree), the
    same sum as enumerating both together, without redrawing the tree per branch). The tree and the target's rows
    are frozen, so a rule that wrote to them would raise instead of changing the next branch's tree."""
    trees = []

    def draw(rand):
        trees.append(build(root, exact.callback(draft), rand))
        return len(trees) - 1

    means = [0.0] * len(rules)
    for i, pt in exact.outcomes(draw).items():
        tree, rows = trees[i], exact.target_rows(trees[i], target)
        for a in (tree.tokens, tree.parents, tree.q, tree.draft_dists, rows):
            if a is not None:
                a.setflags(write=False)
        for j, rule in enumerate(rules):
            accepted = exact.outcomes(lambda rand: len(rule(tree, rows, rand).path) - 1)
            means[j] += pt * sum(n * pr for n, pr in accepted.items())
    return means


def test_block_on_the_papers_example():
    """Sun et al.'s example: p = (1/3, 2/3), q = (2/3, 1/3) at every position, two drafted tokens:
    token-wise verification keeps 10/9 tokens on average, block verification 11/9."""
    p, q = (lambda ctx: np.array([1, 2]) / 3), (lambda ctx: np.array([2, 1]) / 3)
    tokenwise, block = expected_accepted(chains(2), (verify.verify_chain, verify.verify_block), q, p, 0)
    assert abs(tokenwise - 10 / 9) < 1e-12 and abs(block - 11 / 9) < 1e-12


def test_block_keeps_at_least_as_many_tokens_as_tokenwise():
    gains = []
    for seed in range(8):
        for table in (tables, dense_tables):
            target, draft = table(seed, 4)
            for k in (2, 3, 4):
                block, tokenwise = expected_accepted(chains(k), (verify.verify_block, verify.verify_chain),
                                                     draft, target, 0)
                assert block >= tokenwise - 1e-12, (seed, k, block, tokenwise)
                gains.append(block - tokenwise)
    assert max(gains) > 0.05  # and strictly more on some drafts


def test_traversal_keeps_at_least_as_many_tokens_as_recursive():
    gains = []
    for seed in range(4):
        for table in (tables, dense_tables):
            target, draft = table(seed, 3)
            for widths in ((2, 1), (1, 2), (2, 2)):
                for replacement, recursive in ((True, verify.verify_recursive), (False, verify.verify_recursive_wor)):
                    build = sampled(widths, replacement)
                    traversal, token_level = expected_accepted(build, (verify.verify_traversal, recursive),
                                                               draft, target, 0)
                    assert traversal >= token_level - 1e-12, (seed, widths, replacement, traversal, token_level)
                    gains.append(traversal - token_level)
    assert max(gains) > 0.05


# ----------------------------------------------------------------------------- negative controls

def unscaled_residual(a, p, q):
    """Broken: what is owed after a rejection taken as max(p - q, 0), ignoring the path's weight a."""
    r = np.maximum(p - q, 0.0)
    return float(r.sum()), r


def chain_as_sampled(root, dist_fn, rand):
    """Broken pairing: the draft's argmax chain (a top-k chain) handed over as if drawn from q."""
    tree = build_chain(root, dist_fn, 2)
    return sampled_label(tree, dist_fn)


def top_tokens_as_sampled(root, dist_fn, rand):
    """Broken pairing: the draft's top-2 children handed over as if drawn from q."""
    return sampled_label(build_fixed(root, dist_fn, (2, 1)), dist_fn)


def sampled_label(tree, dist_fn):
    """A deterministic tree relabelled with_replacement, with q after each node as draft_dists."""
    dists = dist_fn(tree.tokens, tree.parents, np.arange(len(tree)))
    return Tree(tree.tokens, tree.parents, tree.q, "with_replacement", draft_dists=dists)


def without_replacement_as_with(root, dist_fn, rand):
    """Broken pairing: siblings drawn without replacement, labelled as drawn with replacement."""
    tree = build_fixed(root, dist_fn, (3,), rand=rand, replacement=False)
    return Tree(tree.tokens, tree.parents, tree.q, "with_replacement", draft_dists=tree.draft_dists)


def with_replacement_as_without(root, dist_fn, rand):
    """Broken pairing: siblings drawn with replacement, labelled as drawn without."""
    tree = build_fixed(root, dist_fn, (3,), rand=rand)
    return Tree(tree.tokens, tree.parents, tree.q, "without_replacement", draft_dists=tree.draft_dists)


# name: (builder, rule, {verify attribute: broken replacement}, the correct (builder, rule) on the same example)
NEGATIVE = {
    "block, residual without the weight": (chains(2), verify.verify_block, {"owed_after": unscaled_residual}, None),
    "block, stop weight = path weight": (chains(2), verify.verify_block, {"stop_weight": lambda a, S: a}, None),
    "block, top chain as sampled": (chain_as_sampled, verify.verify_block, {}, (chains(2), verify.verify_block)),
    "traversal, residual without the weight": (sampled((2, 1)), verify.verify_traversal,
                                               {"owed_after": unscaled_residual}, None),
    "traversal, top-k tree as sampled": (top_tokens_as_sampled, verify.verify_traversal, {},
                                         (sampled((2, 1)), verify.verify_traversal)),
    "traversal, without-replacement tree as with": (without_replacement_as_with, verify.verify_traversal, {},
                                                    (sampled((3,), replacement=False), verify.verify_traversal)),
    "traversal, with-replacement tree as without": (with_replacement_as_without, verify.verify_traversal, {},
                                                    (sampled((3,)), verify.verify_traversal)),
}


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_negative_control_fails_on_fixed_example(name, monkeypatch):
    build, rule, broken, correct = NEGATIVE[name]
    target, draft = dense_tables(0, 5)
    good_build, good_rule = correct or (build, rule)
    assert exact.step_error(good_build, good_rule, draft, target, 0, 2) < TOL  # the correct pairing passes...
    for attr, fn in broken.items():
        monkeypatch.setattr(verify, attr, fn)
    assert exact.step_error(build, rule, draft, target, 0, 2) > 1e-3  # ... the broken one fails the same check


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_negative_control_fails_on_most_random_examples(name, monkeypatch):
    build, rule, broken, _ = NEGATIVE[name]
    for attr, fn in broken.items():
        monkeypatch.setattr(verify, attr, fn)
    caught = 0
    for seed in range(10):
        target, draft = dense_tables(seed, 4)
        caught += exact.step_error(build, rule, draft, target, 0, 2) > 1e-3
        if caught == 7:
            break  # the verdict is settled: the remaining examples cannot change it
    assert caught >= 7, f"{name} detected on only {caught}/10 examples"


# ----------------------------------------------------------------------------- the tests a verdict holds

def test_checks_record_every_test_and_the_final_draw():
    """Per branch: a "sequence" check per node tested (all rejected but the last, which is the end of
    the accepted path), then the draw of the next token; a draw after a leaf is the bonus."""
    target, draft = dense_tables(1, 3)

    def run(build, rule, rand):
        tree = build(0, callback(draft), rand)
        verdict = rule(tree, target_rows(tree, target), rand)
        path, nxt = verdict
        *tests, final = verdict.tests
        assert all(c.test == "sequence" for c in tests) and not any(c.accepted for c in tests[:-1])
        assert final.test == "draw" and final.token == nxt and final.node == path[-1]
        if len(path) > 1:
            assert tests[-1].accepted and tests[-1].node == path[-1]
        assert final.accepted == (not np.any(tree.parents == path[-1]))  # the bonus after a leaf
        return len(tests)

    for build, rule in ((chains(3), verify.verify_block), (sampled((2, 1)), verify.verify_traversal)):
        assert max(exact.outcomes(lambda rand: run(build, rule, rand))) > 1  # some branch tested several nodes


# ----------------------------------------------------------------------------- pairing

def test_pairing_errors():
    with pytest.raises(ValueError, match="'block' is not lossless on a deterministic tree: .*sampled chain"):
        verify.check_pairing("deterministic", "block")
    with pytest.raises(ValueError, match="'block' is not lossless on a without_replacement"):
        verify.check_pairing("without_replacement", "block")
    with pytest.raises(ValueError, match="'traversal' is not lossless on a deterministic tree: .*point_mass"):
        verify.check_pairing("deterministic", "traversal")
    verify.check_pairing("with_replacement", "traversal")
    verify.check_pairing("without_replacement", "traversal")
    q = np.full((3, 3), 1 / 3)
    for kind in ("with_replacement", "without_replacement"):
        fork = Tree([0, 1, 2], [-1, 0, 0], [1, 1 / 3, 1 / 3], kind=kind, draft_dists=q)
        verify.check_tree(fork, "traversal")
    with pytest.raises(ValueError, match="'block' needs at most one child per node.*'traversal'"):
        verify.check_tree(Tree([0, 1, 2], [-1, 0, 0], [1, 1 / 3, 1 / 3], "with_replacement", draft_dists=q), "block")
    assert Plan(rule="block").rule == "block" and Plan(rule="traversal").rule == "traversal"


# ----------------------------------------------------------------------------- end to end

E2E = {  # rule: (method, plan)
    "block": ("speculative", Plan(chain=4, sampled="with", rule="block")),
    "traversal": ("tree", Plan(shape="fixed", widths=(2, 2, 1), sampled="without", rule="traversal")),
    "traversal, with replacement": ("tree", Plan(shape="fixed", widths=(2, 1, 1), sampled="with", rule="traversal")),
    "traversal, staged": ("staged", Plan(shape="fixed", widths=(2, 1), sampled="without", rule="traversal")),
}


@pytest.mark.parametrize("name", sorted(E2E))
def test_generate_at_top_k(embedded, name):
    """A seeded top-k run completes, is reproducible, and every step's record agrees with its tokens."""
    target, draft, ngram, enc = embedded
    method, plan = E2E[name]
    prompt = list(range(100, 120))
    kw = dict(method=method, plan=plan, temperature=1.0, top_k=50, seed=3, eos=None, **models_for(method, draft, ngram))
    res = generate(target, prompt, 40, keep_trees=True, **kw)
    assert len(res.tokens) == 40 and res.stop_reason == "max_new_tokens"
    assert generate(target, prompt, 40, **kw).tokens == res.tokens
    stats = res.stats
    assert sum(stats.accepted) == len(res.tokens) == len(stats.source)
    out = []
    for step in stats.steps:
        *tests, final = step.trace.checks
        assert final.test == "draw"
        if step.trace.copied:
            continue  # stage 2's copies are verified by the rule for copied chains
        assert step.trace.rule == plan.rule
        assert all(c.test == "sequence" for c in tests)
        # The recorder gave each test the uniform number that decided it, where one was drawn.
        assert all((c.u is not None) == (SURE < c.value < 1 - SURE) for c in tests)
        assert all(c.accepted == (c.u < c.value) for c in tests if c.u is not None)
        emitted = verify.emitted(step.trace.tree, step.trace.path, final.token)
        assert step.tokens == emitted[:len(step.tokens)]
        out += step.tokens
    if method != "staged":
        assert out == res.tokens
    assert stats.tokens_per_pass > 1  # the rule kept drafted tokens


def test_temperature_zero(embedded):
    """At temperature 0 the rules need sampled trees: the draft's top tokens (the default there) are
    refused with the pairing error; drawn from the one-hot draft, they emit exactly greedy's tokens."""
    target, draft, ngram, enc = embedded
    prompt = list(range(100, 120))
    greedy = ar_greedy(target, prompt, 24)
    for method, plan in (("speculative", Plan(chain=4, rule="block")),
                         ("tree", Plan(shape="fixed", widths=(2, 1), rule="traversal"))):
        with pytest.raises(ValueError, match="not lossless on a deterministic tree"):
            generate(target, prompt, 8, method=method, draft=draft, plan=plan, eos=None)
        res = generate(target, prompt, 24, method=method, draft=draft, plan=dataclasses.replace(plan, sampled="with"),
                       eos=None)
        assert res.tokens == greedy


@pytest.mark.parametrize("rule", ["chain", "block", "traversal"])
def test_an_explicit_rule_decodes_up_to_the_end_of_the_context(small, rule):
    """Near the end of the context a step drafts nothing (a root-only tree, which no sampled-tree
    rule is paired with): it is verified by the rule its own kind needs, not the plan's."""
    n_ctx = small.target.config.n_ctx
    method, plan = ("speculative", Plan(chain=3, rule=rule)) if rule != "traversal" else \
        ("tree", Plan(widths=(2, 1), sampled="with", rule=rule))
    res = generate(small.target, [1] * (n_ctx - 6), 20, method, small.draft, plan=plan, temperature=1.0, seed=3)
    assert res.stop_reason == "context" and len(res.tokens) == 6
