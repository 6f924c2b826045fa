"""Exercise 2: after the tree pass, keep the accepted path in the cache (lesson 5, the step after it).

Lesson 5 scores a whole token tree in one target pass: its mask and positions let each node see only
its ancestors, and the pass writes every node's keys and values into the cache after the prefix, in
node order. The rule then accepts one root-to-node path. Before the next step the cache must hold
exactly what a plain pass over the accepted text would have written: the path's rows, in consecutive
slots right after the prefix, and nothing after them.

`make exercises` grades it on random trees and paths: after your keep_path the cache's length, keys
and values must be those of a plain prefill of the prefix and the path's tokens (float64, difference
< 1e-9).
"""

import numpy as np  # noqa: F401  (you will need it)


def keep_path(cache, start, path):
    """Keep the accepted path's rows of the tree's block in `cache` (change it; return nothing).

    cache.k, cache.v: [n_layer, n_head, capacity, head_dim], the keys and values; slot s holds the token at
      position s of the committed text. cache.length: the slots in use.
    start: the slot where the tree's block begins (the cache held `start` tokens before the tree pass): node
      i of the tree is at slot start + i, and the block ends at cache.length.
    path: the accepted root-to-node path, node ids ascending, starting with the root 0.
    After it, slots start .. start + len(path) - 1 hold the path's nodes' keys and values in path order,
    and cache.length is start + len(path). (A node's position is start + its depth: the rows move to the
    slots of their positions.)
    """
    raise NotImplementedError
