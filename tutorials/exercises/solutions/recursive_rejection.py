"""Exercise 3, a solution: recursive rejection sampling without replacement (SpecInfer; Sequoia)."""

import numpy as np

from specdec_np.tree import children


def verify_recursive_wor(tree, p, rand):
    path = [0]
    while True:
        node = path[-1]
        p_res, q_res = p[node], tree.draft_dists[node]  # a leaf's q is all zeros: no children to test
        accepted = None
        for c in children(tree, node):
            x = tree.tokens[c]
            if rand.coin(min(1.0, p_res[x] / q_res[x])):
                accepted = int(c)
                break
            r = np.maximum(p_res - q_res, 0)  # what p still owes once x was rejected (q from before x is removed)
            p_res = r / r.sum() if r.sum() > 0 else p_res
            q_res = q_res.copy()
            q_res[x] = 0  # the next sibling was drawn from q without x ...
            if q_res.sum() > 0:  # (no mass left: every token q could draw was a child, there is no next one)
                q_res = q_res / q_res.sum()  # ... renormalised
        if accepted is None:  # every child rejected (a correction), or a leaf (a bonus token)
            return path, rand.draw(p_res)
        path.append(accepted)
