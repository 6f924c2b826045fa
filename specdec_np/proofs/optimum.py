"""The best acceptance any lossless verifier can reach, and what the library's rules reach.

One position, k drafts from q (with replacement, without, or deterministically its top k); a verifier sees them and
the target's p, must output y ~ p exactly whatever the drafts, and *accepts* when y is a draft. The best acceptance
of any lossless verifier is an optimal-transport value (SpecTr, Sun et al. 2023), the max-flow source -> draft set S
(capacity P(D = S)) -> token y in S -> sink (capacity p(y)); by max-flow = min-cut a minimum over subsets H of the
vocabulary, the dual form of Hu et al. 2025 ("Towards Optimal Multi-draft Speculative Decoding"):

    alpha* = min over H of  p(H) + P(D not inside H)  =  1 - max over H of [P(D inside H) - p(H)]

If the drafts land inside H more often than p does, the verifier must reject at least that excess; for k = 1 the
max is TV(p, q), so alpha* = sum(min(p, q)), lesson 3's acceptance. Functions take the drafts' distribution {tuple of
drafted tokens, in order: probability} and are exhaustive over 2^V subsets (the 3-5 tokens of the tests and lesson
9). The library's rules are measured, not re-derived: run on the builder's trees under `exact.outcomes`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .. import build, verify
from . import exact
from ..tree import Tree, children

SCHEMES = ("with", "without", "deterministic")  # how the k drafts are drawn from q
KIND = {"with": "with_replacement", "without": "without_replacement", "deterministic": "deterministic"}  # tree.KINDS
PAIRED_RULE = {scheme: verify.LOSSLESS[KIND[scheme]][0] for scheme in SCHEMES}  # each scheme's default rule
ROOT = 0  # the root token of the one-level trees: irrelevant, only its children are drafts


# ----------------------------------------------------------------------------- the drafts' distribution
def draft_tuples(q, k: int, scheme: str) -> dict:
    """{drafted tokens in the order drawn: probability}, as build.build_fixed(..., [k]) drafts them: "with" k iid draws
    from q, "without" each from q without the earlier ones (until q is exhausted), "deterministic" q's top k."""
    q = np.asarray(q, dtype=np.float64)  # [V]
    if scheme == "deterministic":
        return {tuple(int(x) for x in build.top_tokens(q, k)): 1.0}
    if scheme not in ("with", "without"):
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")

    def left(drafts):  # [V]: what the next draft is drawn from (normalised there), given the earlier ones
        return np.where(np.isin(np.arange(q.size), drafts), 0.0, q) if scheme == "without" else q
    return exact.sequence_distribution(left, (), k)


def mask_of(tokens) -> int:
    """A set of tokens as a bitmask: bit x is set when token x is in the set (V <= ~20)."""
    return sum(1 << x for x in set(map(int, tokens)))


def draft_sets(drafts: dict) -> dict:
    """{bitmask of the set of drafted tokens: probability}: acceptance only asks *whether* y was drafted."""
    return exact.marginal(drafts, mask_of)


# ----------------------------------------------------------------------------- the optimum (dual)
def cut_values(p, drafts: dict):  # -> [2^V]
    """p(H) + P(D not inside H) for every subset H (indexed by its bitmask), each an upper bound on any lossless
    verifier's acceptance (y in D and D inside H put y in H); the smallest is the optimum."""
    p, sets = np.asarray(p, dtype=np.float64), draft_sets(drafts)
    V = p.size
    masks = np.array(list(sets), dtype=np.int64)  # [m]
    probs = np.array(list(sets.values()))  # [m]
    H = np.arange(2 ** V)
    inside = (H[:, None] >> np.arange(V)) & 1 == 1  # [2^V, V] token x is in subset H
    outside = (masks[None, :] & ~H[:, None]) != 0  # [2^V, m] draft set S has a token outside H
    return inside @ p + outside @ probs


def optimal_acceptance(p, drafts: dict) -> float:
    """alpha* = min over subsets H of p(H) + P(D not inside H): the best any lossless verifier does."""
    return float(cut_values(p, drafts).min())


def bottleneck(p, drafts: dict) -> list[int]:
    """The tokens of a minimising H: where the drafts crowd in more than p does (ties: smallest mask)."""
    H = int(np.argmin(cut_values(p, drafts)))
    return [x for x in range(len(p)) if H >> x & 1]


# ----------------------------------------------------------------------------- the optimum (primal)
def max_flow(capacity, source: int, sink: int, tol: float = 1e-15):  # [n, n] -> [n, n]
    """Edmonds-Karp: push flow along shortest augmenting paths until none is left. capacity[i, j] >= 0 (np.inf
    allowed); flow[i, j] >= 0 is sent along i -> j, never both ways. Exact up to rounding: each augmentation saturates
    an edge, and shortest paths bound their number by O(n * edges)."""
    n = capacity.shape[0]
    flow = np.zeros((n, n))
    while True:
        residual = capacity - flow + flow.T  # pushing back flow already sent is allowed
        parent = np.full(n, -1)
        parent[source] = source
        todo = deque([source])
        while todo and parent[sink] < 0:
            i = todo.popleft()
            for j in np.flatnonzero((residual[i] > tol) & (parent < 0)):
                parent[j] = i
                todo.append(j)
        if parent[sink] < 0:
            return flow
        path, j = [], sink
        while j != source:
            path.append((parent[j], j))
            j = parent[j]
        push = min(residual[i, j] for i, j in path)
        for i, j in path:
            back = min(push, flow[j, i])  # cancel reverse flow first, then add forward flow
            flow[j, i] -= back
            flow[i, j] += push - back


def optimal_plan(p, drafts: dict):
    """A best coupling, from the max-flow: (masks [m], plan [m, V]), plan[i, y] = P(D = masks[i] and the verifier
    accepts y); > 0 only for y in masks[i], rows sum to <= P(D = masks[i]), columns to <= p(y), plan.sum() = alpha*."""
    p, sets = np.asarray(p, dtype=np.float64), draft_sets(drafts)
    V, masks = p.size, list(sets)
    m = len(masks)
    # Nodes: 0 source, 1..m draft sets, m+1..m+V tokens, m+V+1 sink.
    cap = np.zeros((m + V + 2, m + V + 2))
    cap[0, 1:1 + m] = list(sets.values())
    cap[1:1 + m, 1 + m:1 + m + V] = np.where((np.array(masks)[:, None] >> np.arange(V)) & 1, np.inf, 0.0)  # y in S
    cap[1 + m:1 + m + V, -1] = p
    flow = max_flow(cap, 0, m + V + 1)
    return np.array(masks, dtype=np.int64), flow[1:1 + m, 1 + m:1 + m + V]


def optimal_rule(p, drafts: dict):
    """A verification rule for one-level trees that reaches alpha*, built from `optimal_plan`: given the drafted set
    S, accept y in S with probability plan[S, y] / P(S) (descend to the first child with token y), else emit a draw
    from what p is still owed, p - (accepted mass per token). Rejection has probability 1 - alpha* = sum(owed), so y
    comes out with plan[:, y].sum() + owed(y) = p(y): lossless. A max flow leaves no augmenting path, so owed tokens
    are never drafted ones (zeroing them below only removes rounding). rule(tree, p_rows, rand) -> (path, token)."""
    p = np.asarray(p, dtype=np.float64)
    masks, plan = optimal_plan(p, drafts)
    sets = draft_sets(drafts)
    accept = {int(mask): plan[i] / sets[int(mask)] for i, mask in enumerate(masks)}  # [V] per set
    owed = np.maximum(p - plan.sum(axis=0), 0.0)  # [V]

    def rule(tree: Tree, p_rows, rand):
        kids = children(tree, 0)
        tokens = tree.tokens[kids]
        w = accept[mask_of(tokens)]  # [V] zero outside the drafted set
        if rand.coin(w.sum()):
            y = rand.draw(w)
            c = int(kids[np.flatnonzero(tokens == y)[0]])
            return [0, c], rand.draw(p_rows[c])  # the bonus token after the leaf
        rest = owed.copy()
        rest[tokens] = 0.0
        return [0], rand.draw(rest if rest.sum() > 0 else p)

    return rule


# ----------------------------------------------------------------------------- the library's rules, measured
def one_level_tree(q, k: int, scheme: str, rand) -> Tree:
    """Root + k drafted children, built by the library's builder exactly as decoding builds them."""
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    q = np.asarray(q, dtype=np.float64)
    dist_fn = lambda tokens, parents, nodes: np.tile(q, (len(nodes), 1))  # noqa: E731
    return build.build_fixed(ROOT, dist_fn, [k], rand=None if scheme == "deterministic" else rand,
                             replacement=scheme == "with")


def single_position(rule, p, q, k: int, scheme: str) -> dict:
    """{(accepted, first emitted token): exact probability} of drafting k children and verifying, every random branch
    enumerated. The children's target rows only feed the bonus token, which plays no part here: a point mass."""
    p = np.asarray(p, dtype=np.float64)

    def step(rand):
        tree = one_level_tree(q, k, scheme, rand)
        rows = np.tile(np.eye(p.size)[0], (len(tree), 1))  # [n, V]
        rows[0] = p
        path, nxt = rule(tree, rows, rand)
        return len(path) == 2, verify.emitted(tree, path, nxt)[0]

    return exact.outcomes(step)


def acceptance(outcomes: dict) -> float:
    """P(accepted) from single_position's outcomes."""
    return sum(prob for (accepted, _), prob in outcomes.items() if accepted)


def output_distribution(outcomes: dict) -> dict:
    """{first emitted token: probability} from single_position's outcomes: must equal p."""
    return exact.marginal(outcomes, lambda outcome: outcome[1])


# ----------------------------------------------------------------------------- chains
def chain_accepted(rule, target, draft, root: int, length: int) -> dict:
    """{drafted tokens accepted: exact probability} for one step on a chain of `length` sampled drafts, drawn by
    build.build_chain as decoding draws them; target, draft: context tuple (from `root`) -> [V]."""
    def step(rand):
        tree = build.build_chain(root, exact.callback(draft), length, rand=rand)
        path, _ = rule(tree, exact.target_rows(tree, target), rand)
        return len(path) - 1

    return exact.outcomes(step)


def expected(dist: dict) -> float:
    """The mean of {value: probability}."""
    return sum(v * prob for v, prob in dist.items())


def chain_coupling_bound(target, draft, root: int, length: int) -> float:
    """sum over j = 1..length of sum over x_1..x_j of min(p(x_1..x_j), q(x_1..x_j)): an upper bound on any lossless
    verifier's expected accepted length on a sampled chain. Accepting >= j drafts means the output's first j tokens
    (~ p) equal the drafts' (~ q), at most 1 - TV of the two j-token distributions under any coupling. Each j is
    bounded on its own, so the sum need not be reachable (block verification, optimal, can stay below it)."""
    total = 0.0
    for j in range(1, length + 1):
        p_seq = exact.sequence_distribution(target, (root,), j)
        q_seq = exact.sequence_distribution(draft, (root,), j)
        total += sum(min(pr, q_seq.get(seq, 0.0)) for seq, pr in p_seq.items())
    return total
