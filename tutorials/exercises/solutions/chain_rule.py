"""Exercise 1, a solution: chain rejection sampling (Leviathan et al. 2023; Chen et al. 2023)."""

import numpy as np


def verify_chain(tree, p, rand):
    path = [0]
    for node in range(len(tree) - 1):
        x, q = tree.tokens[node + 1], tree.draft_dists[node]  # the guess and what it was drawn from
        if not rand.coin(min(1.0, p[node][x] / q[x])):
            return path, rand.draw(np.maximum(p[node] - q, 0))  # the residual (draw normalises it)
        path.append(node + 1)
    return path, rand.draw(p[path[-1]])  # every guess accepted: a bonus token
