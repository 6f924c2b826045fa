"""Exercise 1, a solution: block verification of a chain (Sun et al., ICLR 2025)."""

import numpy as np


def verify_block(tree, p, rand):
    k, x, q = len(tree) - 1, tree.tokens, tree.draft_dists
    a = [1.0]  # [k + 1] the prefixes' weights
    for i in range(1, k + 1):
        a.append(min(1.0, a[-1] * p[i - 1][x[i]] / q[i - 1][x[i]]))
    for i in range(k, 0, -1):  # backward: the longest prefix first
        if i == k:
            h, owed = a[k], p[k]  # the whole chain: a bonus token after it
        else:
            r = np.maximum(a[i] * p[i] - q[i], 0)  # what the target still owes after x_1..x_i
            S = r.sum()
            h = S / (S + 1 - a[i]) if S + 1 - a[i] > 0 else 1.0
            owed = r if S > 0 else p[i]
        if rand.coin(h):
            return list(range(i + 1)), rand.draw(owed)
    return [0], rand.draw(np.maximum(p[0] - q[0], 0) if k else p[0])  # lesson 3's correction
