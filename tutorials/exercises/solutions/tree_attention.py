"""Exercise 2, a solution: a node sees its ancestors and itself, at position prefix + depth."""

import numpy as np


def attention_mask(tree):  # -> [n, n] bool
    n = len(tree.parents)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if i:
            mask[i] = mask[tree.parents[i]]  # the parent's row: every ancestor
        mask[i, i] = True
    return mask


def positions(tree, prefix_len):  # -> [n]
    depth = np.zeros(len(tree.parents), dtype=np.int64)
    for i in range(1, len(tree.parents)):
        depth[i] = depth[tree.parents[i]] + 1
    return prefix_len + depth  # siblings share a position: alternatives for one slot
