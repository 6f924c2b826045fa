"""Token trees: derived arrays on hand-made trees, rendering, and the builders (incl. best-first vs brute force)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import callback, context, table
from specdec_np.build import build_best_first, build_chain, build_fixed
from specdec_np.proofs import exact
from specdec_np.tree import (Tree, attention_mask, children, cumulative_q, depths, draw_mask,
                             path_to, positions, render)

#        0 (tok 5)
#       / \
#  1 (7)   2 (8)
#     |
#  3 (9)
#     |
#  4 (3)
HAND = Tree(tokens=[5, 7, 8, 9, 3], parents=[-1, 0, 0, 1, 3], q=[1.0, 0.5, 0.25, 0.8, 0.5])


def test_derived_arrays_of_a_hand_made_tree():
    assert depths(HAND).tolist() == [0, 1, 1, 2, 3]
    assert positions(HAND, 10).tolist() == [10, 11, 11, 12, 13]  # prefix + depth, not prefix + index
    want = np.array([[1, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0],
                     [1, 0, 1, 0, 0],
                     [1, 1, 0, 1, 0],
                     [1, 1, 0, 1, 1]], dtype=bool)
    np.testing.assert_array_equal(attention_mask(HAND), want)
    assert path_to(HAND, 4) == [0, 1, 3, 4] and path_to(HAND, 2) == [0, 2] and path_to(HAND, 0) == [0]
    assert children(HAND, 0).tolist() == [1, 2] and children(HAND, 2).tolist() == []
    assert len(HAND) == 5
    np.testing.assert_allclose(cumulative_q(HAND), [1, 0.5, 0.25, 0.4, 0.2])
    assert HAND.source.tolist() == [0] + [1] * 4  # the root was emitted by the target; the rest drafted


def test_render_and_mask_drawing():
    text = render(HAND, decode_fn=lambda t: f"w{t}", accepted=[0, 1, 3])
    lines = text.splitlines()
    assert len(lines) == 5
    assert "'w9'" in text and "'w5'" in text
    marked = [line for line in lines if line.startswith("*")]
    assert len(marked) == 3 and all("'w8'" not in line for line in marked)
    assert "cum=0.400" in text
    assert "*" not in render(HAND)
    grid = draw_mask(HAND).splitlines()
    assert len(grid) == 6 and grid[-1].endswith("x x . x x")


def test_mask_drawing_labels_every_column_with_its_node_number():
    """Past node 9 the header takes a row per digit: read top to bottom, column j says j (node 10
    is "1" over "0", never a bare "0"), and the 'x' of row i's own node sits under label i."""
    chain = Tree(tokens=list(range(13)), parents=list(range(-1, 12)), q=[1.0] * 13)
    grid = draw_mask(chain).splitlines()
    head, rows = grid[:2], grid[2:]
    for i, row in enumerate(rows):
        col = row.rindex("x")  # the diagonal: node i sees itself last
        assert "".join(line[col] for line in head).strip() == str(i)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tokens=[1, 2], parents=[0, 0], q=[1, 1]), "parents\\[0\\]"),
    (dict(tokens=[1, 2, 3], parents=[-1, 2, 0], q=[1, 1, 1]), "parents\\[i\\]"),
    (dict(tokens=[1, 2], parents=[-1, 0], q=[1]), "same length"),
    (dict(tokens=[1, 2], parents=[-1, 0], q=[1, 1], kind="sampled"), "kind"),
    (dict(tokens=[1, 2], parents=[-1, 0], q=[1, 1], kind="with_replacement"), "draft_dists"),
])
def test_tree_rejects_malformed_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Tree(**kwargs)


# ----------------------------------------------------------------------------- draft tables
# helpers.table(seed, V): a lazily generated distribution per context; helpers.callback serves it
# to the builders as their dist_fn.


def best_first_reference(dist, root, budget, max_depth, V):
    """Brute force: every path up to max_depth, cum = product of q, top `budget` by (-cum, depth, path)."""
    nodes = []
    for d in range(1, max_depth + 1):
        for path in itertools.product(range(V), repeat=d):
            cum = 1.0
            for i in range(d):  # same multiplication order as the builder: root to leaf
                q = dist((root,) + path[:i])
                cum = cum * (q / q.sum())[path[i]]  # builders renormalise what dist_fn returns
            if cum > 0:
                nodes.append((-cum, d, path))
    top = sorted(sorted(nodes)[:budget], key=lambda n: (n[1], n[2]))
    paths = [()] + [n[2] for n in top]
    index = {p: i for i, p in enumerate(paths)}
    return [root] + [p[-1] for p in paths[1:]], [-1] + [index[p[:-1]] for p in paths[1:]]


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.integers(2, 4), st.integers(0, 12), st.integers(0, 4))
def test_best_first_equals_brute_force(seed, V, budget, max_depth):
    dist = table(seed, V)
    calls = []
    tree = build_best_first(1, callback(dist, calls), budget, max_depth)
    tokens, parents = best_first_reference(dist, 1, budget, max_depth, V)
    assert tree.tokens.tolist() == tokens and tree.parents.tolist() == parents
    assert tree.kind == "deterministic"
    for i in range(1, len(tree)):  # q is the draft probability under the parent's distribution
        q = dist(context(tree.tokens, tree.parents, tree.parents[i]))
        assert tree.q[i] == (q / q.sum())[tree.tokens[i]]
    # The partial tree handed to dist_fn only grows by appending, and each call expands new nodes.
    for (tok, par, _), (tok2, par2, _) in zip(calls, calls[1:]):
        assert tok2[:len(tok)] == tok and par2[:len(par)] == par
    seen = set()
    for tok, par, nodes in calls:
        assert par[0] == -1 and all(0 <= par[i] < i for i in range(1, len(par)))
        assert not seen & set(nodes)
        seen |= set(nodes)


def test_best_first_small_example_by_hand():
    q = {(0,): [0.0, 0.6, 0.3, 0.1], (0, 1): [0.9, 0.1, 0.0, 0.0], (0, 2): [0.5, 0.5, 0.0, 0.0]}
    dist = lambda ctx: np.array(q.get(ctx, [0.25] * 4))
    tree = build_best_first(0, callback(dist), budget=3, max_depth=2)
    # cums: (1) .6, (1,0) .54, (2) .3, (1,1) .06, (2,0) .15, ... -> top 3: (1), (1,0), (2)
    assert tree.tokens.tolist() == [0, 1, 2, 0] and tree.parents.tolist() == [-1, 0, 0, 1]
    assert len(build_best_first(0, callback(dist), budget=0, max_depth=3)) == 1
    assert len(build_best_first(0, callback(dist), budget=5, max_depth=0)) == 1


def test_fixed_and_chain_deterministic():
    q = {(0,): [0.1, 0.4, 0.4, 0.1, 0.0], (0, 1): [0.0, 0.0, 0.0, 0.0, 1.0]}
    dist = lambda ctx: np.array(q.get(ctx, [0.2] * 5))
    calls = []
    tree = build_fixed(0, callback(dist, calls), [3, 2])
    # depth 1: top-3 with ties by id (1, 2 tie at 0.4; then 0, 3 tie at 0.1 -> 0);
    # under token 1 only one token has mass, so only one child; a uniform row gives ids 0, 1.
    assert tree.tokens.tolist() == [0, 1, 2, 0, 4, 0, 1, 0, 1]
    assert tree.parents.tolist() == [-1, 0, 0, 0, 1, 2, 2, 3, 3]
    assert [c[2] for c in calls] == [[0], [1, 2, 3]]  # one batched call per level, whole frontier
    chain = build_chain(0, callback(dist), 3)
    assert chain.tokens.tolist() == [0, 1, 4, 0] and chain.kind == "deterministic"
    assert chain.parents.tolist() == [-1, 0, 1, 2]
    assert len(build_chain(0, callback(dist), 0)) == 1


def test_sampled_builders_keep_duplicates_and_draft_dists():
    from specdec_np.sampling import Rand
    dist = lambda ctx: np.array([0.0, 1.0, 0.0])  # every draw is token 1
    wr = build_fixed(2, callback(dist), [3, 1], rand=Rand(0))
    assert wr.tokens.tolist() == [2, 1, 1, 1, 1, 1, 1] and wr.kind == "with_replacement"
    np.testing.assert_array_equal(wr.draft_dists[0], [0, 1, 0])
    np.testing.assert_array_equal(wr.draft_dists[-1], [0, 0, 0])  # leaves: no children drawn
    wor = build_fixed(2, callback(dist), [3], rand=Rand(0), replacement=False)
    assert wor.tokens.tolist() == [2, 1] and wor.kind == "without_replacement"  # q ran out of mass
    chain = build_chain(2, callback(dist), 2, rand=Rand(0))
    assert chain.tokens.tolist() == [2, 1, 1] and chain.kind == "with_replacement"


def test_a_node_the_draft_doubts_gets_no_children():
    """min_q: a drafted node whose q is below it is a leaf (top tokens, and tokens drawn from q), every other node
    above the last level has its widths' children; 0 stops nowhere. A chain ends at its first doubted token."""
    from specdec_np.sampling import Rand
    q = {(0,): [0.1, 0.5, 0.3, 0.1, 0.0], (0, 1): [0.0, 0.0, 0.6, 0.4, 0.0]}
    dist = lambda ctx: np.array(q.get(ctx, [0.2] * 5))
    widths = [2, 2, 1]
    for rand in (None, 0, 1):
        for min_q in (0.0, 0.35, 0.55):
            tree = build_fixed(0, callback(dist), widths, rand=None if rand is None else Rand(rand), min_q=min_q)
            kids, d = np.bincount(tree.parents[1:], minlength=len(tree)), depths(tree)
            assert kids.tolist() == [0 if d[i] == len(widths) or tree.q[i] < min_q else widths[d[i]]
                                     for i in range(len(tree))]
    assert [len(build_fixed(0, callback(dist), widths, min_q=m)) for m in (0.0, 0.35, 0.55)] == [11, 7, 3]
    assert build_chain(0, callback(dist), 4, min_q=0.45).tokens.tolist() == [0, 1, 2, 0]  # 0 has q 0.2: a leaf
    assert build_chain(0, callback(dist), 4, min_q=0.55).tokens.tolist() == [0, 1]


def test_exact_distribution_of_two_sampled_children():
    q = np.array([0.5, 0.3, 0.2, 0.0])
    dist = lambda ctx: q

    def children_of(replacement):
        return lambda rand: tuple(build_fixed(0, callback(dist), [2], rand=rand, replacement=replacement)
                                  .tokens[1:].tolist())

    wor = exact.outcomes(children_of(False))
    want = {(a, b): q[a] * q[b] / (1 - q[a]) for a in range(3) for b in range(3) if a != b}
    assert set(wor) == set(want)
    assert max(abs(wor[k] - want[k]) for k in want) < 1e-15
    wr = exact.outcomes(children_of(True))
    want = {(a, b): q[a] * q[b] for a in range(3) for b in range(3)}  # duplicates (a, a) included
    assert set(wr) == set(want)
    assert max(abs(wr[k] - want[k]) for k in want) < 1e-15


def test_builders_reject_bad_callbacks():
    with pytest.raises(ValueError, match="dist_fn"):
        build_chain(0, lambda t, p, n: np.zeros((len(n), 3)), 1)
    with pytest.raises(ValueError, match="dist_fn"):
        build_chain(0, lambda t, p, n: np.ones(3), 1)
