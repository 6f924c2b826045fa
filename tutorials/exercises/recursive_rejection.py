"""Exercise 3: recursive rejection sampling over siblings drawn without replacement (lesson 6).

`make exercises` grades it by exact enumeration: over small p/q tables and tree shapes, the tokens
your rule emits (continued by the target where a step emits fewer) must be distributed exactly as
the target's.
"""

import numpy as np  # noqa: F401  (you will need it)

from specdec_np.tree import children  # noqa: F401  children(tree, node) -> the node's children, in draw order


def verify_recursive_wor(tree, p, rand):
    """Walk down the tree: test each node's children in order; return (path, token).

    tree: node 0 the root; tree.parents[i] < i; tree.tokens[i] node i's token. The children of a
      node were drawn from q = tree.draft_dists[node] *without replacement*: the first from q, the
      next from q with the first removed and renormalised (call it q'), and so on.
      After a rejected child, what p still owes is computed with the q that child was drawn from
      (before its token is removed); the next sibling is then tested against that and q'.
    p: [len(tree), V], p[i] the target's distribution of the token after node i.
    rand: rand.coin(prob) -> bool, rand.draw(weights) -> token id (it normalises the weights).
    Returns path (accepted nodes from the root 0) and the target's token after its last node.
    """
    raise NotImplementedError
