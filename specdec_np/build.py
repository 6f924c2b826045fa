"""Tree builders over a draft callback, so model drafters, staged drafters and test tables all fit.

The callback `dist_fn(tree_tokens, tree_parents, nodes) -> [len(nodes), V]` returns the draft's
processed next-token distribution after each given node of the partial tree (two flat arrays,
parents[i] < i). Builders call it once per level with the whole frontier (a model drafter expands
a frontier in one tree-masked pass); the partial tree only grows by appending.
"""

from __future__ import annotations

import numpy as np

from .sampling import top_ids
from .tree import Tree


def expand(dist_fn, tokens, parents, nodes):  # -> [len(nodes), V]
    """One batched dist_fn call on the partial tree, checked, its rows normalised into exact
    probability vectors (what a draw samples from, and so what q must be)."""
    rows = np.asarray(dist_fn(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                              np.asarray(nodes, dtype=np.int64)), dtype=np.float64)
    if rows.ndim != 2 or rows.shape[0] != len(nodes):
        raise ValueError(f"dist_fn must return [{len(nodes)}, V] for {len(nodes)} nodes, got shape {rows.shape}")
    total = rows.sum(axis=-1, keepdims=True)
    if not (total > 0).all() or rows.min() < 0:  # reductions: no [k, V] temporaries
        raise ValueError("dist_fn returned a row that is not a distribution (negative, NaN or zero mass)")
    return rows / total


def top_tokens(dist, k: int):  # [V] -> [<=k]
    """The k most probable tokens with positive probability, ties by token id."""
    ids = top_ids(dist, k)
    return ids[dist[ids] > 0]


def draw_children(dist, k: int, rand, replacement: bool) -> list[int]:
    """k draws from dist: with replacement (duplicates kept), or without (renormalise after each)."""
    if replacement:
        return [rand.draw(dist) for _ in range(k)]
    left = dist.copy()
    out = []
    for _ in range(k):
        if not left.sum() > 0:  # every token with mass is already a child
            break
        x = rand.draw(left)  # draw() normalises by the sum: this is q with earlier children removed
        out.append(x)
        left[x] = 0.0
    return out


def build_fixed(root_token: int, dist_fn, widths, rand=None, replacement: bool = True, min_q: float = 0.0) -> Tree:
    """A fixed-shape tree: widths[d] children under every node at depth d whose q is at least `min_q` (a node the
    draft gave less is a leaf: whether a node has children is decided before they are drawn, from the draft alone).

    Deterministic (rand None): the top-widths[d] tokens of q with positive probability. Sampled:
    widths[d] draws from q, with replacement (duplicates kept as separate nodes: merging them would
    bias the output) or without; children are stored in the order drawn, the order the rules test
    them in. Sampled kinds carry the distributions children were drawn from (draft_dists).
    """
    tokens, parents, q = [int(root_token)], [-1], [1.0]
    dists = {}  # node -> the distribution its children came from
    frontier = [0]
    for width in widths:
        if width < 0:
            raise ValueError(f"build_fixed: widths must be >= 0, got {list(widths)}")
        if not frontier or width == 0:
            break
        rows = expand(dist_fn, tokens, parents, frontier)  # [len(frontier), V]
        new = []
        for node, dist in zip(frontier, rows):
            dists[node] = dist
            kids = top_tokens(dist, width) if rand is None else draw_children(dist, width, rand, replacement)
            for x in kids:
                new.append(len(tokens))
                tokens.append(int(x))
                parents.append(node)
                q.append(float(dist[x]))
        frontier = [i for i in new if q[i] >= min_q]
    if rand is None:
        return Tree(np.array(tokens), np.array(parents), np.array(q), kind="deterministic")
    V = next(iter(dists.values())).size if dists else 1
    draft_dists = np.zeros((len(tokens), V))  # [n, V]; zero rows for nodes without children
    for node, dist in dists.items():
        draft_dists[node] = dist
    kind = "with_replacement" if replacement else "without_replacement"
    return Tree(np.array(tokens), np.array(parents), np.array(q), kind=kind, draft_dists=draft_dists)


def build_chain(root_token: int, dist_fn, k: int, rand=None, min_q: float = 0.0) -> Tree:
    """Up to k drafted tokens in a chain: argmax each step (rand None) or drawn from q (the 1-child tree), ending at
    a token whose q is below `min_q`."""
    if k < 0:
        raise ValueError(f"build_chain: k must be >= 0, got {k}")
    return build_fixed(root_token, dist_fn, [1] * k, rand=rand, replacement=True, min_q=min_q)


def build_best_first(root_token: int, dist_fn, budget: int, max_depth: int) -> Tree:
    """The dynamic tree (cf. EAGLE-2): the `budget` nodes of highest cumulative draft probability.

    Among all paths of depth <= max_depth with positive cumulative probability (product of q along
    the path), the top `budget` by (-cum, depth, path tokens): ties go to the shallower, then the
    lexicographically smaller path. The set is closed under ancestors: a child's cum never exceeds
    its parent's (q <= 1, rounding is monotone), and on a tie the shallower parent wins.

    Computed by selecting the top `budget` candidates (children of expanded nodes), expanding in one
    dist_fn call every selected node not yet expanded, until none is left: then any node of the true
    top set would have an unexpanded ancestor-or-self in the selection, so the selection is that set.
    """
    if budget < 0 or max_depth < 0:
        raise ValueError(f"build_best_first: budget and max_depth must be >= 0, got {budget}, {max_depth}")
    if budget == 0 or max_depth == 0:
        return Tree(np.array([root_token]), np.array([-1]), np.array([1.0]))
    # The partial tree handed to dist_fn: the root and every expanded node, append-only.
    work_tokens, work_parents = [int(root_token)], [-1]
    work_index = {(): 0}  # path (tokens after the root) -> index in the partial tree
    cand = {}  # path -> (cumulative q, q); the children of expanded nodes
    todo = [()]  # the selected paths to expand next, already in the partial tree
    while todo:
        rows = expand(dist_fn, work_tokens, work_parents, [work_index[p] for p in todo])  # [len(todo), V]
        for path, dist in zip(todo, rows):
            cum = (cand[path][0] if path else 1.0) * dist  # [V] the children's cumulative q
            # Only the node's `budget` best children can ever make the top set: each of the
            # others is beaten by `budget` siblings (same depth and parent, higher or tied cum).
            for x in top_tokens(cum, budget):
                cand[path + (int(x),)] = (float(cum[x]), float(dist[x]))
        top = sorted(cand, key=lambda p: (-cand[p][0], len(p), p))[:budget]
        todo = sorted((p for p in top if len(p) < max_depth and p not in work_index), key=lambda p: (len(p), p))
        for path in todo:  # parents are expanded already, so parents[i] < i holds
            work_index[path] = len(work_tokens)
            work_tokens.append(path[-1])
            work_parents.append(work_index[path[:-1]])
    # Final order: by depth, then parent, then token id == by (depth, path tokens).
    chosen = [()] + sorted(top, key=lambda p: (len(p), p))
    index = {path: i for i, path in enumerate(chosen)}
    tokens = [int(root_token)] + [p[-1] for p in chosen[1:]]
    parents = [-1] + [index[p[:-1]] for p in chosen[1:]]
    q = [1.0] + [cand[p][1] for p in chosen[1:]]
    return Tree(np.array(tokens), np.array(parents), np.array(q), kind="deterministic")
