"""Exercise 2: the token tree's attention mask and position ids (lesson 5).

`make exercises` grades them by running the forward pass over random trees with your mask and
positions, and checking each node's logits against feeding that node's root-to-node path alone
as a chain (float64, difference < 1e-9).
"""

import numpy as np  # noqa: F401  (you will need it)


def attention_mask(tree):  # -> [n, n] bool
    """mask[i, j]: node i may attend to node j of the tree (the cached prefix is always visible).

    tree.parents: [n] the parent of each node (parents[0] = -1 for the root; parents[i] < i).
    """
    raise NotImplementedError


def positions(tree, prefix_len: int):  # -> [n] int
    """The position id of each node, when the cache holds `prefix_len` tokens before the root.

    The cache holds positions 0 to prefix_len - 1, so the root (the last emitted token, not yet in the
    cache) is at position prefix_len; a node is one position after its parent.
    """
    raise NotImplementedError
