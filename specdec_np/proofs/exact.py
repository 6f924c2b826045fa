"""Exact output distributions, by enumerating every random branch of the real code.

`outcomes(fn)` runs `fn(rand)` with a scripted stand-in for `sampling.Rand` whose coin/draw follow a prescribed list
of choices and multiply up their probabilities. A depth-first search over choice sequences (each run replays a
prefix, takes the first option at every new choice point and queues the others) visits every branch of positive
probability once, so the tests check the library's actual rules with no re-implementation and no sampling noise. fn
must be deterministic given its choices. `step_error`, built on it, is the exact check of one speculative step.
"""

from __future__ import annotations

import numpy as np

from ..sampling import certain, support
from ..tree import path_key


class ScriptedRand:
    """Rand's interface, driven by a list of option indices instead of a generator."""

    def __init__(self, script):
        self.script = script  # option index to take at each choice point, for a prefix of them
        self.n_options = []  # number of options at each choice point this run met
        self.prob = 1.0  # probability of the choices taken so far

    def choose(self, options):  # options: [(value, probability > 0)]
        i = len(self.n_options)
        k = self.script[i] if i < len(self.script) else 0
        if k >= len(options):
            raise RuntimeError("outcomes: fn is not deterministic given its random choices")
        self.n_options.append(len(options))
        self.prob *= options[k][1]
        return options[k][0]

    def coin(self, p: float) -> bool:
        p, sure = float(p), certain(p)  # as Rand.coin: a certain coin has one option
        return self.choose([(True, p), (False, 1.0 - p)] if sure is None else [(sure, 1.0)])

    def draw(self, probs) -> int:
        probs = np.asarray(probs, dtype=np.float64)  # [V]
        ids, cum = support(probs)  # as Rand.draw: the same ids (a model's V is thousands, these a few) and total
        return self.choose([(i, pi / float(cum[-1])) for i, pi in zip(ids.tolist(), probs[ids].tolist())])


def outcomes(fn, max_runs: int = 1_000_000) -> dict:
    """{fn(rand)'s return value: its exact total probability} over every random branch (prob > 0)."""
    dist, todo, runs = {}, [()], 0
    while todo:
        script = todo.pop()
        rand = ScriptedRand(script)
        value = fn(rand)
        runs += 1
        if runs > max_runs:
            raise RuntimeError(f"outcomes: more than {max_runs} branches; make the example smaller")
        if len(rand.n_options) < len(script):
            raise RuntimeError("outcomes: fn is not deterministic given its random choices")
        # Queue the untaken options of every choice point met beyond the replayed prefix (where option 0 was taken).
        for i in range(len(script), len(rand.n_options)):
            for k in range(1, rand.n_options[i]):
                todo.append(tuple(script) + (0,) * (i - len(script)) + (k,))
        dist[value] = dist.get(value, 0.0) + rand.prob
    return dist


def total_variation(a: dict, b: dict) -> float:
    """Half the L1 distance between two distributions given as {outcome: probability}."""
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


def marginal(dist: dict, key) -> dict:
    """{key(outcome): total probability} of a distribution {outcome: probability}."""
    out = {}
    for x, pr in dist.items():
        out[key(x)] = out.get(key(x), 0.0) + pr
    return out


def sequence_distribution(next_dist, context: tuple, m: int) -> dict:
    """The exact distribution {tokens: prob} of m tokens sampled autoregressively from next_dist(context) -> [V]; a
    sequence whose next distribution is all zeros stops there."""
    dist = {(): 1.0}
    for _ in range(m):
        new = {}
        for seq, pr in dist.items():
            probs = np.asarray(next_dist(tuple(context) + seq), dtype=np.float64)  # [V]
            if not probs.sum() > 0:
                new[seq] = pr
            for x in np.flatnonzero(probs > 0):
                new[seq + (int(x),)] = pr * float(probs[x] / probs.sum())
        dist = new
    return dist


# -- the exact check of one speculative step against the target ----------------------------------
# Tables are functions of a context: next_dist(tokens from the step's root, as a tuple) -> [V].

def context(tokens, parents, node) -> tuple:
    """The tokens from the root down to `node` of a (partial) tree, as a tuple: a table's key."""
    return (int(tokens[0]),) + path_key(tokens, parents, node)


def callback(next_dist):
    """A tree builder's dist_fn serving a table: the distribution after each requested node."""
    return lambda tokens, parents, nodes: np.array([next_dist(context(tokens, parents, i)) for i in nodes])


def target_rows(tree, target):  # -> [n, V]
    """The target's distribution after every node of the tree: what one verification pass gives."""
    return np.array([target(context(tree.tokens, tree.parents, i)) for i in range(len(tree))])


def step_outcomes(build, rule, draft, target, root) -> dict:
    """{(tree tokens, tree parents, path, token): probability} of one speculative step, over every tree `build(root,
    dist_fn, rand)` draws from the draft and every random choice `rule(tree, p, rand)` makes on it (the tree's key
    is taken before the rule runs)."""
    def run(rand):
        tree = build(root, callback(draft), rand)
        key = tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())
        path, token = rule(tree, target_rows(tree, target), rand)
        return key + (tuple(int(i) for i in path), int(token))
    return outcomes(run)


def emitted_distribution(steps: dict, target, root, m: int) -> dict:
    """{first m tokens: probability} of step_outcomes' steps: the accepted nodes' tokens, then the rule's token,
    continued by the target itself where a step emitted fewer than m."""
    dist = {}
    for (tokens, _, path, token), pr in steps.items():
        head = (tuple(tokens[i] for i in path[1:]) + (token,))[:m]
        for tail, pt in sequence_distribution(target, (root,) + head, m - len(head)).items():
            dist[head + tail] = dist.get(head + tail, 0.0) + pr * pt
    return dist


def step_error(build, rule, draft, target, root, m: int) -> float:
    """The total variation between the first m tokens of one speculative step (continued by the target) and the
    target's own m tokens: 0 up to rounding for a lossless rule. It bounds the error of every shorter prefix too (a
    marginal is never further from the target's than the whole)."""
    steps = step_outcomes(build, rule, draft, target, root)
    return total_variation(emitted_distribution(steps, target, root, m), sequence_distribution(target, (root,), m))
