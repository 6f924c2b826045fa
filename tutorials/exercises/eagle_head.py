"""Exercise 5: the EAGLE head's step (lesson 11, the step after it; lesson 11b is an answer).

The head drafts from the target's own features. At the position of token t_j it reads f_(j-1), the
target's feature of the token before, and t_j's embedding (the target's wte + wpe), fuses them with one
linear layer over [embedding, feature] into its own, narrower width, runs its one GPT-2 block with its own
KV cache over the pairs, and a linear layer "out" back to the target's width guesses f_j: the target's
tied head (wte.T) turns that guess into q for the token after t_j. Deeper in a chain there is no target
feature yet: a node reads its parent's guess.

`make exercises` grades it on the embedded target and head (float64), over a few greedy steps of a
chain: each step, your q for the root and each node must be the library's head's (`eagle.FeatureDrafter`,
difference < 1e-9), the rows you feed the head the library's, and after head_keep your cache the
library's.
"""

import numpy as np  # noqa: F401  (you will need it)

from specdec_np.gpt2 import attention_bias, layer_norm, transformer_block  # noqa: F401


def head_step(head, target, top, seq, cache, chain):
    """One drafting step of the head over a chain: q [len(chain) + 1, V] after the root and after each node.

    head: an eagle.Head. head.wte [V, D], head.wpe [n_ctx, D]: the target's embeddings; head.fc {"w": [2D, d],
      "b": [d]}: the fusion, applied to [embedding, feature]; head.block: its one block of width d (gpt2.py's
      layout); head.out {"w": [d, D], "b": [D]}: back to the feature's width, its guess; head.config: its own
      n_embd (d), n_head, layer_norm_epsilon; head.vocab: [V], 1 for the tokens it may draft (None: all).
    target: the GPT-2 the head drafts for; target.params["ln_f"]: its final layer norm {"g", "b"}.
    top: [len(seq) - 1, D] the target's top block's output at every committed token but the last (the target
      has scored those), as a hook on its last block gives it: *before* its final layer norm.
    seq: the committed tokens (a list); the step's root is seq[-1], at position len(seq) - 1.
    cache: the head's KV cache (one layer), as your head_keep left it (empty at the first step): slot j - 1
      holds the pair of token j. cache.length: the slots in use. Feed the pairs it lacks, the root's last,
      then each node of `chain` (node i at position root + i), and leave them in it.
    chain: the drafted tokens below the root, in order.
    transformer_block(x, head.block, n_head, cache, 0, attention_bias(mask, x.dtype), eps) runs the block over
      x [m, d] after the cache's cache.length slots, writing the m rows' keys and values there; it does not
      advance cache.length (you do). mask [m, cache.length + m] bool: row i may attend to column j.
    q: softmax of the guesses @ wte.T over the tokens the head may draft, 0 elsewhere.
    """
    raise NotImplementedError


def head_keep(cache, root, accepted):
    """After the target verified the step: keep in `cache` what the next step may reuse (change it).

    root: the step's root position (len(seq) - 1 at that step); accepted: how many of the chain's nodes the
    target kept (their tokens are committed now, and the target has computed their features).
    """
    raise NotImplementedError
