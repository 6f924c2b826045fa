"""Exercise 4, a solution: the speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023), as in lesson 4."""

import numpy as np

from specdec_np.gpt2 import forward, new_cache
from specdec_np.sampling import process


def speculative_decode(target, draft, prompt, n_new, k, rand, settings=(0.0, None, None)):
    t_cache, d_cache = new_cache(target), new_cache(draft)
    seq = list(prompt)
    forward(target, seq[:-1], t_cache)  # both caches hold every committed token but the last
    forward(draft, seq[:-1], d_cache)
    while len(seq) < len(prompt) + n_new:
        start = len(seq) - 1  # the target's cache holds seq[:start]
        guesses, qs, feed = [], [], seq[d_cache.length:]  # the draft may lag: it feeds what it has not seen
        for _ in range(k):
            q = process(forward(draft, feed, d_cache)[-1], *settings)  # [V]
            guesses.append(rand.draw(q))
            qs.append(q)
            feed = guesses[-1:]
        p = process(forward(target, [seq[-1]] + guesses, t_cache), *settings)  # [k + 1, V]
        accepted = []
        for i, x in enumerate(guesses):
            if not rand.coin(min(1.0, p[i][x] / qs[i][x])):
                token = rand.draw(np.maximum(p[i] - qs[i], 0))  # the residual (draw normalises it)
                break
            accepted.append(x)
        else:
            token = rand.draw(p[k])  # every guess kept: a bonus token
        t_cache.truncate(start + 1 + len(accepted))
        d_cache.truncate(min(d_cache.length, start + 1 + len(accepted)))
        seq += accepted + [token]
    return seq[len(prompt):len(prompt) + n_new]
