"""Exercise 4, a solution: the speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023), as
lesson 4 specifies it. Its one home: lesson 4b shows and runs it, and the grader (checks.py) replays it
to find where a learner's loop departs from it."""

import numpy as np

from specdec_np.gpt2 import forward, new_cache
from specdec_np.sampling import process


def ratio(p, q, x):  # the probability of keeping guess x
    return min(1.0, p[x] / q[x])


def residual(p, q):  # [V], [V] -> [V] (unnormalised)
    return np.maximum(p - q, 0)


def check_guess(x, p, q, rand, correction=residual, acceptance=ratio):
    """(True, x) if guess x ~ q is kept, else (False, the target's token drawn from correction(p, q))."""
    if rand.coin(acceptance(p, q, x)):
        return True, x
    return False, rand.draw(correction(p, q))


def speculative_decode(target, draft, prompt, n_new, k, rand, settings=(0.0, None, None), correction=residual,
                       acceptance=ratio, forward=forward):
    """n_new tokens after prompt: the draft guesses k per step, the target checks them in one pass.

    settings: (temperature, top_k, top_p) for `process`; correction, acceptance: the rule (`check_guess`);
    forward: gpt2.forward, or a stand-in that remembers passes (lesson 4's check 2) or watches them (the grader).
    """
    t_cache, d_cache = new_cache(target), new_cache(draft)
    seq = list(prompt)
    forward(target, seq[:-1], t_cache)  # prefill all but the last token: each step feeds from seq[-1]
    forward(draft, seq[:-1], d_cache)
    while len(seq) < len(prompt) + n_new:
        start = len(seq) - 1  # the target's cache holds seq[:start]
        # 1. Draft: k guesses, one draft pass each; q_i is what guess i was drawn from.
        guesses, qs, feed = [], [], seq[d_cache.length:]  # the draft may lag: it feeds what it has not seen
        for _ in range(k):
            q = process(forward(draft, feed, d_cache)[-1], *settings)  # [V]
            x = rand.draw(q)
            guesses.append(x)
            qs.append(q)
            feed = [x]
        # 2. Verify: one target pass over the last token and the k guesses.
        p = process(forward(target, [seq[-1]] + guesses, t_cache), *settings)  # [k + 1, V]
        # 3. The rule, guess by guess; a rejection ends the step with the target's correction.
        accepted = []
        for i, x in enumerate(guesses):
            kept, token = check_guess(x, p[i], qs[i], rand, correction, acceptance)
            if not kept:
                break
            accepted.append(x)
        else:
            token = rand.draw(p[k])  # every guess kept: a bonus token from the target's last row
        # 4. Both caches keep only the committed text and the accepted guesses.
        t_cache.truncate(start + 1 + len(accepted))
        d_cache.truncate(min(d_cache.length, start + 1 + len(accepted)))
        # 5. Emit.
        seq += accepted + [token]
    return seq[len(prompt):len(prompt) + n_new]
