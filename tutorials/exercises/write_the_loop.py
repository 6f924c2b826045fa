"""Exercise 4: the speculative decoding loop (lesson 4 specifies it; write it here, then go back).

`make exercises` grades it with a tiny random target and draft: at temperature 0 your tokens must
be those of `generate(method="speculative")`; sampled, your first tokens must be distributed exactly
as the target's (every random branch enumerated, TV < 1e-12), and with a seed you must emit
generate's very tokens (the same random numbers, drawn in the same order).

The building blocks, and nothing from `decode`, `methods`, `drafting` or `verify`:
"""

import numpy as np  # noqa: F401  (you will need it)

from specdec_np.gpt2 import forward, new_cache  # noqa: F401
from specdec_np.sampling import process  # noqa: F401


def speculative_decode(target, draft, prompt, n_new, k, rand, settings=(0.0, None, None)):
    """The n_new tokens after prompt (a list of token ids, at least 2): each step the draft guesses k
    tokens, one pass each, and the target checks them all in one pass. Returns a list of n_new ints.

    target, draft: GPT-2 models with the same vocabulary.
    forward(model, tokens, cache) -> logits [len(tokens), V]: one pass over `tokens` after the ones the
      cache holds, which it appends to the cache. new_cache(model): an empty cache; cache.length: how
      many tokens it holds; cache.truncate(n): forget all but its first n.
    process(logits, *settings) -> the distribution to sample from ([V], or [n, V] for [n, V] logits);
      settings = (temperature, top_k, top_p); at temperature 0 a one-hot of the argmax.
    rand: the only randomness: rand.draw(probs) -> a token id (it normalises probs), rand.coin(prob) -> bool.
      To emit generate's tokens for a seed, draw in its order: each step, the k draws of the guesses
      (draft order), then one coin per guess from the first up to the first rejection, then one draw
      (the correction from the residual, or the bonus token when every guess was kept).
    After a step the target's cache holds every committed token but the last (the step's new token,
      fed first in the next step's target pass); the draft's holds at most as many.
    A step drafts its k guesses even when fewer tokens are still wanted: keep only the first n_new.
    """
    raise NotImplementedError
