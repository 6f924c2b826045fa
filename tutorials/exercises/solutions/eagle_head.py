"""Exercise 5, a solution: the EAGLE head's step (Li et al. 2024), as lesson 11 describes it. Its one home:
lesson 11b shows and runs it."""

import numpy as np

from specdec_np.gpt2 import attention_bias, layer_norm, transformer_block


def fused_pass(head, feats, tokens, positions, cache, mask):  # [m, D], [m], [m] -> [m, D]
    """The head over m (feature, token) pairs after its cache: the fusion into its width d, its one block, out back
    to the target's width D; its guesses."""
    e = head.wte[tokens] + head.wpe[positions]  # the target's own embedding of each token [m, D]
    x = np.concatenate([e, feats], axis=1) @ head.fc["w"] + head.fc["b"]  # [m, 2D] -> [m, d]
    c = head.config  # its own: n_embd d, n_head
    x = transformer_block(x, head.block, c.n_head, cache, 0, attention_bias(mask, x.dtype), c.layer_norm_epsilon)
    cache.length += len(tokens)
    return x @ head.out["w"] + head.out["b"]  # [m, d] -> [m, D]


def head_q(head, guesses):  # [m, D] -> [m, V]
    """q: the target's tied head (wte.T) on the guessed features, over the tokens the head may draft."""
    logits = guesses @ head.wte.T  # [m, V]
    if head.vocab is not None:
        logits = np.where(head.vocab > 0, logits, -np.inf)
    q = np.exp(logits - logits.max(axis=1, keepdims=True))
    return q / q.sum(axis=1, keepdims=True)


def head_step(head, target, top, seq, cache, chain):
    feats = layer_norm(top, **target.params["ln_f"], eps=target.config.layer_norm_epsilon)  # [n - 1, D] f_0..
    root, start = len(seq) - 1, cache.length
    js = np.arange(start + 1, root + 1)  # the catch-up pairs' tokens, by position (the root's last)
    m = len(js)
    causal = np.tri(m, start + m, start, dtype=bool)  # [m, start + m]: the cache and the pairs before
    guess = fused_pass(head, feats[js - 1], np.asarray(seq)[js], js, cache, causal)[-1]  # the root's guess of f_root
    guesses = [guess]
    for i, x in enumerate(chain, 1):  # node i at position root + i reads its parent's guessed feature
        sees_all = np.ones((1, cache.length + 1), dtype=bool)
        guess = fused_pass(head, guess[None], np.array([x]), np.array([root + i]), cache, sees_all)[0]
        guesses.append(guess)
    return head_q(head, np.stack(guesses))  # [k + 1, V]


def head_keep(cache, root, accepted):
    cache.truncate(root)  # the pairs through the root's: the chain's were fed on guessed features
