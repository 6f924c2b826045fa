"""Exercise 2, a solution: the accepted path's rows moved to the slots of their positions."""

import numpy as np


def keep_path(cache, start, path):
    rows = start + np.asarray(path)  # [len(path)] the path's slots in the block, ascending
    n = len(path)
    cache.k[:, :, start:start + n] = cache.k[:, :, rows]  # fancy indexing copies first: overlapping moves are safe
    cache.v[:, :, start:start + n] = cache.v[:, :, rows]
    cache.length = start + n
