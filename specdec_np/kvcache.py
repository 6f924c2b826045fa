"""The KV cache: every layer's keys and values of the tokens seen so far, so a step costs O(new tokens).

A speculative decoder writes a whole block (a token tree) into the cache, then keeps only the
accepted root-to-node path, compacted into contiguous slots (`keep`): the cache then holds exactly
what a plain prefill of the accepted text would have written, because each node's K/V were
computed at its true position (prefix + depth) seeing only its ancestors.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    """Preallocated keys and values of one model (its GPT2Config): `k, v` are [n_layer, n_head, capacity, head_dim];
    `k` is a transposed view of [.., head_dim, capacity] storage: a block's scores `q @ k.T` read contiguous rows.

    Slots `0..length-1` hold the committed sequence (slot i = position i); capacity: the context plus the largest
    block (`gpt2.new_cache(model, max_block)`). Storage starts unset (np.empty, no memset of megabytes per cache):
    a pass writes its rows at `length..` before reading up to them; `keep` reads only below `length`.
    """

    def __init__(self, config, capacity: int | None = None, dtype=np.float32, max_block: int = 64):
        self.config = config
        self.capacity = capacity if capacity is not None else config.n_ctx + max_block
        L, H, D = config.n_layer, config.n_head, config.head_dim
        self.k = np.empty((L, H, D, self.capacity), dtype=dtype).transpose(0, 1, 3, 2)  # [L, H, capacity, D]
        self.v = np.empty((L, H, self.capacity, D), dtype=dtype)
        self.length = 0

    def keep(self, start: int, offsets) -> None:
        """Keep slots `start + offsets` (ascending) at `start, start+1, ...`; drop everything after:
        `start` is where the block began, `offsets` the accepted path's nodes within it."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.size and (np.any(np.diff(offsets) <= 0) or offsets[0] < 0 or start + offsets[-1] >= self.length):
            raise ValueError(f"keep: offsets {offsets.tolist()} must be ascending slots of the block "
                             f"[{start}, {self.length})")
        if not 0 <= start <= self.length:
            raise ValueError(f"keep: start {start} outside the cache (length {self.length})")
        n = offsets.size
        if n and offsets[-1] != n - 1:  # else ascending from 0 up to n - 1: already in place (a chain)
            src = start + offsets  # fancy indexing copies the sources first, so overlapping moves are safe
            self.k[:, :, start:start + n] = self.k[:, :, src]
            self.v[:, :, start:start + n] = self.v[:, :, src]
        self.length = start + n

    def truncate(self, length: int) -> None:
        """Forget every slot from `length` on."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate: length {length} outside 0..{self.length}")
        self.length = length

    def copy(self) -> "KVCache":
        c = KVCache.__new__(KVCache)
        c.config, c.capacity, c.length = self.config, self.capacity, self.length
        c.k, c.v = self.k.copy(order="K"), self.v.copy()  # "K": keep k's transposed storage
        return c

