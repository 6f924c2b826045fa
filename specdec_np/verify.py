"""Lossless verification of a token tree: which drafted path to keep, and the token after it.

Every rule is `rule(tree, p, rand) -> Verdict`. p: [n, V], the target's processed distribution after each tree node.
For every rule paired with the trees it assumes (`LOSSLESS`), the emitted tree.tokens[path[1:]] + [token] is
distributed exactly as if the target had sampled it token by token (the tests enumerate every random branch to prove
it: all randomness goes through rand.coin / rand.draw).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .tree import Tree, children, path_to


@dataclass
class Check:
    """One test a verification rule made, for the trace. test: "argmax" (accepted iff token == the target's argmax,
    `value`); "ratio" (iff the uniform draw `u` < `value`, the acceptance probability); "sequence" (block, traversal:
    iff u < `value`, the chance of keeping the path to this node once all below it was rejected); "draw" (the node's
    next token, from what p still owes: accepted False for a correction, True for the bonus). p, q: the token's
    probabilities, or None. u stays None where no number was drawn; the recorder, which sees them, fills it in."""

    node: int
    token: int
    test: str
    value: float
    accepted: bool
    p: float | None = None
    q: float | None = None
    u: float | None = None


@dataclass
class Verdict:
    """What a rule decided: the root-to-node `path` it accepted, the target's `token` after it (a correction at the
    first rejection, or the bonus after a leaf) and the `tests` it made, in order. Unpacks as (path, token)."""

    path: list
    token: int
    tests: list = field(default_factory=list)

    def __iter__(self):
        return iter((self.path, self.token))


def coin(rand, prob: float, tests: list, node: int, token: int, p=None, q=None, test: str = "ratio") -> bool:
    """rand.coin(prob): a test of kind `test` on `node` (its token, the p and q compared), noted in `tests`."""
    ok = rand.coin(prob)
    tests.append(Check(int(node), int(token), test, float(prob), bool(ok), p, q))
    return ok


def draw(rand, probs, tests: list, node: int, bonus: bool) -> int:
    """rand.draw(probs): the target's token after `node` (a correction, or the bonus after a leaf), noted in `tests`."""
    x = rand.draw(probs)
    tests.append(Check(int(node), x, "draw", float(probs[x] / np.sum(probs)), bool(bonus)))
    return x


def emitted(tree: Tree, path, next_token: int) -> list[int]:
    """The tokens a step emits: the accepted drafted tokens, then the target's next token."""
    return [int(t) for t in tree.tokens[list(path[1:])]] + [int(next_token)]


def residual(p, q):  # [V], [V] -> [V]
    """norm(max(p - q, 0)): what p still owes once a draw from q was rejected; p where that is 0 (p == q: rounding)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    return r / total if total > 0 else p


def without(q, x: int):  # [V] -> [V] or None
    """q without token x, renormalised: the next sibling's q without replacement; None if nothing is left."""
    q = np.array(q, dtype=np.float64)
    q[x] = 0.0
    total = q.sum()
    return q / total if total > 0 else None


def accept_ratio(p_x: float, q_x: float) -> float:
    """min(1, p(x)/q(x)); q(x) = 0 cannot happen for a token drawn from q, treat it as 'p decides'."""
    if q_x <= 0:
        return 1.0 if p_x > 0 else 0.0
    return min(1.0, p_x / q_x)


def verify_greedy(tree: Tree, p, rand=None) -> Verdict:
    """Temperature 0: follow the child equal to argmax p (ties: lowest id); emit the argmax at the first miss. Nothing
    is drawn: its tests follow from p and the path (the recorder derives them)."""
    path = [0]
    while True:
        best = int(np.argmax(p[path[-1]]))
        match = [int(c) for c in children(tree, path[-1]) if tree.tokens[c] == best]
        if not match:
            return Verdict(path, best)
        path.append(match[0])


def verify_point_mass(tree: Tree, p, rand) -> Verdict:
    """Sample-and-match for deterministic children (distinct tokens): draw x ~ p, descend if x is a child. Sequentially:
    accept child c with probability p_res(c)/sum(p_res) (x ~ p is c given it is none of the earlier children), on a
    miss zero p_res(c) and try the next; if none matches, x is drawn from p without them: overall x ~ p."""
    path, tests = [0], []
    while True:
        node = path[-1]
        p_res = np.array(p[node], dtype=np.float64)  # [V]
        for c in children(tree, node):
            x = tree.tokens[c]
            mass = p_res.sum()
            if mass > 0 and coin(rand, p_res[x] / mass, tests, c, x, p_res[x] / mass, 1.0):
                path.append(int(c))
                break
            p_res[x] = 0.0
        else:  # every child missed; no mass left only if they covered p's support (missed by rounding)
            owed = p_res if p_res.sum() > 0 else p[node]
            return Verdict(path, draw(rand, owed, tests, node, children(tree, node).size == 0), tests)


def verify_chain(tree: Tree, p, rand) -> Verdict:
    """Chain rejection sampling (Leviathan et al.; Chen et al.): x ~ q accepted w.p. min(1, p(x)/q(x)); on rejection a
    draw from norm(max(p - q, 0)), after the whole chain a bonus draw from p. q = tree.draft_dists[node] must be the
    exact distribution x was drawn from. It is verify_recursive on a chain (one child per node, so one test each)."""
    return verify_recursive(tree, p, rand)


def verify_recursive(tree: Tree, p, rand, replacement: bool = True) -> Verdict:
    """Recursive rejection sampling over sampled siblings (SpecInfer; RSD/Sequoia without replacement). Test children in
    order, each with min(1, p_res(x)/q_res(x)); on rejection p_res := residual(p_res, q_res), and without
    replacement q_res := q_res without x (the next sibling was drawn so). If all are rejected, draw from p_res."""
    path, tests = [0], []
    while True:
        node = path[-1]
        p_res = np.array(p[node], dtype=np.float64)  # [V]
        kids = children(tree, node)
        if kids.size == 0:
            return Verdict(path, draw(rand, p_res, tests, node, True), tests)  # bonus token
        q_res = tree.draft_dists[node]  # [V]; `without` copies before changing it
        accepted = None
        for c in kids:
            x = tree.tokens[c]
            if coin(rand, accept_ratio(p_res[x], q_res[x]), tests, c, x, p_res[x], q_res[x]):
                accepted = int(c)
                break
            p_res = residual(p_res, q_res)
            if not replacement:
                q_res = without(q_res, x)
                if q_res is None:  # q exhausted: no sibling can follow
                    break
        if accepted is None:
            return Verdict(path, draw(rand, p_res, tests, node, False), tests)  # correction token
        path.append(accepted)


def verify_recursive_wor(tree: Tree, p, rand) -> Verdict:
    """verify_recursive for children drawn without replacement (RSD / Sequoia)."""
    return verify_recursive(tree, p, rand, replacement=False)


def owed_after(a: float, p, q):  # [V], [V] -> (float, [V])
    """(S, max(a p - q, 0)): what the target still owes after a node of weight a once the draft's token there, drawn
    from q, is off the table; S is its mass."""
    r = np.maximum(a * p - q, 0.0)
    return float(r.sum()), r


def stop_weight(a: float, S: float) -> float:
    """S / (S + 1 - a): the chance of stopping at a node of weight a once every deeper candidate was rejected (Sun et
    al.'s h_i). That rejection has probability S + 1 - a (sum(max(q - a p, 0))); stopping in a fraction S of it pays
    exactly what is still owed and leaves 1 - a to the parent. S + 1 - a = 0 (a = 1, p = q) only by rounding."""
    total = S + 1.0 - a
    return S / total if total > 0 else 1.0


def verify_block(tree: Tree, p, rand) -> Verdict:
    """Block verification (Sun et al., ICLR 2025): a sampled chain's accepted prefix, decided jointly.

    Forward, the prefixes' weights a_i = min(1, a_(i-1) p(x_i)/q(x_i)), a_0 = 1: an early deficit (p < q) can be made
    up by a later token with p > q, which token-wise rejection cannot do. Backward, from the last token: keep x_1..x_i
    with probability h_i (a_i at the chain's end, else stop_weight(a_i, S_i)) and emit a draw from p (after the whole
    chain) or norm(max(a_i p - q, 0)). Lossless, by induction from the end: given x_1..x_i, the step keeps them and
    emits a_i times the target's continuation, and with probability 1 - a_i keeps none of them (the next token x pays
    min(q(x), a_i p(x)) of a_i p; when it fails, probability S_i + 1 - a_i, stopping pays the rest, S_i). At the root
    a_0 = 1: the target's distribution. It keeps no fewer tokens in expectation than verify_chain, and (Sun et al.'s
    theorem) no valid verifier of one chain drawn from q keeps more. q = tree.draft_dists[node], as in verify_chain.
    """
    chain = path_to(tree, len(tree) - 1)  # root..leaf; check_tree ensured a chain (nodes in order)
    a, tests = [1.0], []  # a: [len(chain)] the prefixes' weights
    for parent, node in zip(chain, chain[1:]):
        x = tree.tokens[node]
        a.append(accept_ratio(a[-1] * p[parent][x], tree.draft_dists[parent][x]))
    for i in range(len(chain) - 1, 0, -1):
        node, parent = chain[i], chain[i - 1]
        x = tree.tokens[node]
        if i == len(chain) - 1:
            h, owed = a[i], p[node]  # nothing below the last token: keep it with its weight, then a bonus
        else:
            S, r = owed_after(a[i], p[node], tree.draft_dists[node])
            h, owed = stop_weight(a[i], S), (r / S if S > 0 else p[node])
        if coin(rand, h, tests, node, x, p[parent][x], tree.draft_dists[parent][x], test="sequence"):
            return Verdict(chain[:i + 1], draw(rand, owed, tests, node, i == len(chain) - 1), tests)
    # Every drafted token rejected: with a_0 = 1 the correction is the usual residual norm(max(p - q, 0)).
    if len(chain) == 1:
        return Verdict(chain, draw(rand, p[0], tests, 0, True), tests)
    return Verdict(chain[:1], draw(rand, residual(p[0], tree.draft_dists[0]), tests, 0, False), tests)


def verify_traversal(tree: Tree, p, rand) -> Verdict:
    """Traversal verification (Weng et al., 2025) of a sampled tree, siblings drawn as tree.kind says:
    its paths tested from the leaves towards the root, in post-order.

    A node's weight is a = min(1, a_parent p_owed(x)/q_left(x)) when first reached (the root: 1). It is tested only
    once all its children were rejected, kept with its current weight (the next token drawn from what it still owes:
    p after a leaf). A rejected child sets its parent's owed distribution to norm(max(a p_owed - q_left, 0)) and
    weight to stop_weight(a, S), as block verification does (this is it on a chain); without replacement the token
    also leaves q_left, as in verify_recursive (this is it on a tree of depth 1). Lossless by block verification's
    induction, per node: its next child x, drawn from q_left, pays min(q_left(x), a p_owed(x)) of a p_owed through
    its subtree; when that subtree fails, probability S + 1 - a, what is left is max(a p_owed - q_left, 0): the new
    weight and owed distribution. So the next sibling must be drawn from q_left (without replacement the rejected
    token goes, which the residual no longer owes: it was rejected only if q_left > a p_owed there).
    """
    replacement, tests = tree.kind == "with_replacement", []

    def visit(node: int, a: float, p_x=None, q_x=None):
        """The Verdict if the path to `node` (weight a; p_x, q_x: its token's p, q) or below is kept, else None."""
        kids = children(tree, node)
        owed = p[node]  # [V] replaced, never changed in place
        q_left = tree.draft_dists[node]  # [V]; `without` copies before changing it
        for c in kids:
            x = tree.tokens[c]
            found = visit(int(c), accept_ratio(a * owed[x], q_left[x]), owed[x], q_left[x])
            if found is not None:
                return found
            S, r = owed_after(a, owed, q_left)  # c and everything below it rejected
            a, owed = stop_weight(a, S), (r / S if S > 0 else owed)
            if not replacement:
                q_left = without(q_left, x)
                if q_left is None:  # q exhausted: no sibling can follow
                    break
        # The root's weight is 1 here (S / (S + 0)): it is always kept, no test needed.
        if node == 0 or coin(rand, a, tests, node, tree.tokens[node], p_x, q_x, test="sequence"):
            return Verdict(path_to(tree, node), draw(rand, owed, tests, node, kids.size == 0), tests)
        return None

    return visit(0, 1.0)


RULES = {"greedy": verify_greedy, "point_mass": verify_point_mass, "chain": verify_chain, "recursive": verify_recursive,
         "recursive_wor": verify_recursive_wor, "block": verify_block, "traversal": verify_traversal}

# The one table of which rules are lossless on which trees: a tree kind (how its children were chosen)
# -> (its default rule at temperature > 0, every rule lossless on it; greedy only at temperature 0).
LOSSLESS = {
    "deterministic": ("point_mass", ("greedy", "point_mass")),
    "with_replacement": ("recursive", ("greedy", "chain", "recursive", "block", "traversal")),
    "without_replacement": ("recursive_wor", ("greedy", "recursive_wor", "traversal")),  # traversal reads tree.kind
}
CHAIN_RULES = ("chain", "block")  # rules that verify a chain (one child per node), lossless on no wider tree


def default_rule(tree_kind: str, temperature: float, chain: bool = False) -> str:
    """Greedy at temperature 0, else the kind's default; a chain drawn from q with replacement gets the classic
    speculative-sampling rule 'chain' (the recursive rule reduces to it on a chain)."""
    if temperature == 0:
        return "greedy"
    if chain and tree_kind == "with_replacement":
        return "chain"
    return LOSSLESS[tree_kind][0]


def lossless_rules(tree_kind: str, temperature: float | None = None, chain: bool = True) -> tuple:
    """The rules lossless on trees drawn as `tree_kind` (LOSSLESS): 'greedy' at temperature 0 only (None: unknown
    here), 'chain' and 'block' on chains only."""
    return tuple(r for r in LOSSLESS[tree_kind][1]
                 if (r != "greedy" or not temperature) and (chain or r not in CHAIN_RULES))


def check_pairing(tree_kind: str, rule: str, temperature: float | None = None, chain: bool = True) -> None:
    """A ValueError saying why, unless `rule` is one of lossless_rules(tree_kind, temperature, chain)."""
    if rule not in RULES:
        raise ValueError(f"unknown verification rule {rule!r}; choose one of {sorted(RULES)}")
    if tree_kind not in LOSSLESS:
        raise ValueError(f"unknown tree kind {tree_kind!r}; choose one of {tuple(LOSSLESS)}")
    if rule in lossless_rules(tree_kind, temperature, chain):
        return
    if rule == "greedy":  # lossless on every kind, at temperature 0 only
        raise ValueError("plan: rule 'greedy' keeps the target's argmax, which is sampling only at temperature 0; "
                         f"at temperature {temperature} leave rule None (the rule the tree's drafting needs)")
    if rule in LOSSLESS[tree_kind][1]:  # a chain rule on trees that branch
        raise ValueError(f"rule {rule!r} verifies a chain: use method 'speculative', or widths of 1")
    why = {
        "point_mass": "it assumes children are a deterministic function of the draft (e.g. its top-k); "
                      "sampled children need 'chain', 'recursive' or 'recursive_wor'",
        "chain": "it assumes one child per node drawn from q (a sampled chain: build_chain with rand)",
        "recursive": "it assumes siblings drawn from q with replacement; without-replacement "
                     "trees need 'recursive_wor', deterministic trees 'point_mass'",
        "recursive_wor": "it assumes siblings drawn from q without replacement; with-replacement "
                         "trees need 'recursive', deterministic trees 'point_mass'",
        "block": "it assumes a chain whose every token was drawn from q (a sampled chain: build_chain "
                 "with rand), not a copied chain or the draft's top tokens",
        "traversal": "it assumes children drawn from q (with or without replacement, as the tree's kind "
                     "says), not the draft's top tokens; deterministic trees need 'point_mass'",
    }[rule]
    raise ValueError(f"rule {rule!r} is not lossless on a {tree_kind} tree: {why}")


def check_tree(tree: Tree, rule: str) -> None:
    """check_pairing plus the shape the rule needs: chains ('chain', 'block'), distinct siblings ('point_mass')."""
    check_pairing(tree.kind, rule)
    if rule in CHAIN_RULES:
        n_children = np.bincount(tree.parents[1:], minlength=len(tree))
        if n_children.max(initial=0) > 1:
            raise ValueError(f"rule {rule!r} needs at most one child per node; node {int(n_children.argmax())} "
                             f"has {int(n_children.max())} (use 'recursive' or 'traversal')")
    if rule == "point_mass":
        pairs = set(zip(tree.parents[1:].tolist(), tree.tokens[1:].tolist()))
        if len(pairs) != len(tree) - 1:
            raise ValueError("rule 'point_mass' needs distinct sibling tokens; this tree repeats a token "
                             "under one parent")
