"""Exercise 1: verify a chain of draft guesses (lesson 3's rule, in the library's shape).

`make exercises` grades it by exact enumeration: over small p/q tables, the tokens your rule emits
(continued by the target where a step emits fewer) must be distributed exactly as the target's.
"""

import numpy as np  # noqa: F401  (you will need it)


def verify_chain(tree, p, rand):
    """Accept a prefix of the chain, then add one token of the target's; return (path, token).

    tree: a chain, node 0 the root (the last emitted token), node i + 1 the child of node i.
      tree.tokens[i] is node i's token; tree.draft_dists[i] is the distribution q that node i's
      child was drawn from; len(tree) is the number of nodes.
    p: [len(tree), V], p[i] the target's distribution of the token after node i.
    rand: the only randomness: rand.coin(prob) -> bool, rand.draw(weights) -> token id
      (it normalises the weights).
    Returns path (the accepted nodes, starting with the root 0) and the target's token after the
    path's last node: a correction after a rejection, or a bonus token when all were accepted.
    """
    raise NotImplementedError
