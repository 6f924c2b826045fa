"""Exercise 1: block verification of a chain (Sun et al., ICLR 2025), the step after lesson 3's rule.

Lesson 3's rule tests a chain's guesses one at a time and stops at the first rejection. Block
verification decides the kept prefix jointly: a guess the draft over-proposed (p < q) can be made up
by a later one it under-proposed (p > q). It stays lossless and keeps at least as many guesses on
average (lesson 9 compares the two; it is the best any verifier of one sampled chain can do).

`make exercises` grades it by exact enumeration: over small p/q tables, the tokens your rule emits
(continued by the target where a step emits fewer) must be distributed exactly as the target's, and
what it keeps exactly as block verification's (lesson 3's rule is lossless too, but keeps fewer).
"""

import numpy as np  # noqa: F401  (you will need it)


def verify_block(tree, p, rand):
    """Keep a prefix of the chain, decided jointly, then add one token of the target's; return (path, token).

    tree: a chain, node 0 the root (the last emitted token), node i the child of node i - 1, k = len(tree) - 1
      guesses. x_i = tree.tokens[i] is node i's token, drawn from q_(i-1) = tree.draft_dists[i - 1].
    p: [len(tree), V], p[i] the target's distribution of the token after node i.
    rand: the only randomness: rand.coin(prob) -> True with probability prob, rand.draw(weights) -> a token id
      (it normalises the weights). A certain coin (prob >= 1) is True and draws no random number: tossing
      it or not leaves every later draw the same.

    1. Forward, the prefixes' weights: a_0 = 1, a_i = min(1, a_(i-1) p[i-1](x_i) / q_(i-1)(x_i)).
    2. Backward, for i = k, k - 1, ..., 1, toss one coin of probability h_i:
         h_k = a_k;
         h_i = S_i / (S_i + 1 - a_i) for i < k, with r_i = max(a_i p[i] - q_i, 0) and S_i = sum(r_i)
               (h_i = 1 where S_i + 1 - a_i is 0).
       At the first coin that comes up True, keep nodes 0 .. i: return that path and the target's token,
       drawn from p[k] after the whole chain (a bonus token), else from r_i (from p[i] where S_i is 0).
    3. Every coin False: return [0] and a token drawn from lesson 3's residual max(p[0] - q_0, 0).
    """
    raise NotImplementedError
