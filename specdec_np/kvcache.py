"""The KV cache: every layer's keys and values of the tokens seen so far, so a step costs O(new tokens).

A speculative decoder writes a whole block (a token tree) into the cache, then keeps only the
accepted root-to-node path, compacted into contiguous slots (`keep`): the cache then holds exactly
what a plain prefill of the accepted text would have written, because each node's K/V were
computed at its true position (prefix + depth) seeing only its ancestors.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    """Preallocated keys and values of one model: `k, v` are [n_layer, n_head, capacity, head_dim].

    `k` is a transposed view of [n_layer, n_head, head_dim, capacity] storage, so that the scores
    `q @ k.T` of a block are a plain matrix product over contiguous rows: a multi-token block's
    scores cost less than from [.., capacity, head_dim] storage (measured: docs/performance.md).

    Slots `0..length-1` hold the committed sequence (slot i = position i). A forward pass writes
    its block of new tokens at slots `length..length+n_new-1` and advances `length`; a speculative
    decoder then `keep`s only the accepted root-to-node path of that block (compacted into
    contiguous slots) or `truncate`s. Nothing is ever concatenated: a step costs O(new tokens).
    Size it for the context plus the largest block (a tree occupies slots it will not keep).
    `config` is the model's GPT2Config (n_layer, n_head, head_dim, n_ctx); make one with
    `gpt2.new_cache(model, max_block)`, which sizes it for the model's padded blocks too.
    """

    def __init__(self, config, capacity: int | None = None, dtype=np.float32, max_block: int = 64):
        self.config = config
        self.capacity = capacity if capacity is not None else config.n_ctx + max_block
        shape = (config.n_layer, config.n_head, self.capacity, config.head_dim)
        k_shape = (config.n_layer, config.n_head, config.head_dim, self.capacity)
        self.k = np.zeros(k_shape, dtype=dtype).transpose(0, 1, 3, 2)
        self.v = np.zeros(shape, dtype=dtype)
        self.length = 0

    def keep(self, start: int, offsets) -> None:
        """Keep slots `start + offsets` (ascending) at `start, start+1, ...`; drop everything after.

        Used after verification: `start` is where the block began, `offsets` the accepted path's
        nodes within the block. Their K/V were computed at the right positions (prefix + depth),
        so moving them into contiguous slots gives exactly the cache a plain prefill would.
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.size and (np.any(np.diff(offsets) <= 0) or offsets[0] < 0 or start + offsets[-1] >= self.length):
            raise ValueError(f"keep: offsets {offsets.tolist()} must be ascending slots of the block "
                             f"[{start}, {self.length})")
        if not 0 <= start <= self.length:
            raise ValueError(f"keep: start {start} outside the cache (length {self.length})")
        n = offsets.size
        if n == 0 or offsets[-1] == n - 1:  # ascending from 0 up to n - 1: already in place (a chain, plain decoding)
            self.length = start + n
            return
        src = start + offsets
        # Fancy indexing copies the sources first, so overlapping moves are safe.
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

