# %% [markdown]
# # Lesson 1: GPT-2 in NumPy
#
# You will build GPT-2's forward pass from three small NumPy functions and walk a short prompt
# through the embedded tiny target, block by block. You will see the last token's attention weights
# and the five most likely next tokens. Each step is checked against the library's `forward`, and
# the "Try this" edits show what breaks without the mask or the positions.
#
# A GPT-2 forward pass is a handful of array operations: look up token and position embeddings,
# run a stack of identical blocks (attention, then an MLP, each added back to a residual stream),
# normalise, and multiply by the embedding table again to score every vocabulary token.
#
# We write the three small functions a block is made of (`linear`, `layer_norm`, `gelu`), walk a
# short prompt through the embedded tiny target model step by step with them, and check that we
# land on exactly what the library's `forward` computes. Run it with
# `.venv/bin/python tutorials/01_gpt2_numpy.py`, or open it cell by cell (`# %%` markers) in VS Code,
# PyCharm or Jupyter (via jupytext).

# %%
import math

import numpy as np

from specdec_np import gpt2
from specdec_np.gpt2 import attention, forward, new_cache
from specdec_np.models import load_model
from specdec_np.sampling import process
from specdec_np.tokenizer import decode, encode, get_encoding
try:
    from lesson import check, print_rounding, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/01_gpt2_numpy.py")

model = load_model("tiny-target")  # the small GPT-2 shipped in specdec_np/weights/ (no network needed)
cfg, params = model.config, model.params
enc = get_encoding(cfg.n_vocab)  # GPT-2's BPE, cut to this model's vocabulary
print(cfg)
print(f"{model.n_params / 1e6:.1f}M parameters, {model.weight_bytes / 1e6:.1f} MB of float32 weights")

# %% [markdown]
# ## Three small functions
#
# * `linear`: x @ w + b, one row per token (GPT-2 stores w as [n_in, n_out]).
# * `layer_norm`: each row shifted to mean 0 and scaled to variance 1, then scaled by a learned g
#   and shifted by a learned b, so that every block sees inputs of a steady size.
# * `gelu`: the MLP's nonlinearity, x times (about) the chance a standard normal is below x;
#   GPT-2 uses this tanh approximation of it.
#
# Each is checked against the library's version on random inputs (the library's are written for
# speed: in-place updates, a choice of product layout; the numbers are the same).

# %%
def linear(x, w, b):  # [n, n_in] -> [n, n_out]
    return x @ w + b


def layer_norm(x, g, b, eps=1e-5):  # [n, d] -> [n, d]
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + eps) + b


def gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


rng = np.random.default_rng(0)
xs = rng.standard_normal((3, cfg.n_embd)).astype(np.float32)  # [3, n_embd]
ln = params["blocks"][0]["ln_1"]
fc = params["blocks"][0]["mlp"]["c_fc"]
assert np.allclose(linear(xs, **fc), gpt2.linear(xs, **fc), atol=1e-5)
assert np.allclose(layer_norm(xs, **ln), gpt2.layer_norm(xs, **ln), atol=1e-5)
assert np.allclose(gelu(xs), gpt2.gelu(xs), atol=1e-6)
print("linear, layer_norm, gelu == the library's")

# %% [markdown]
# ## Tokens and embeddings
#
# The prompt becomes token ids. Each id picks a row of `wte` (what the token is) and each position
# picks a row of `wpe` (where it is); their sum is the residual stream `x`, one row per token.

# %%
prompt = "def add(a, b):\n    return a"
tokens = np.array(encode(enc, prompt))  # [n]
n = tokens.size
print(f"{n} tokens:", [decode(enc, [t]) for t in tokens])

x = params["wte"][tokens] + params["wpe"][np.arange(n)]  # [n] -> [n, n_embd]
print("residual stream x:", x.shape)
try_this("no position embeddings", not np.allclose(x, params["wte"][tokens] + params["wpe"][np.arange(n)]))

# %% [markdown]
# ## One transformer block, by hand
#
# Attention first. A linear layer makes a query, key and value for every token; they are split
# into `n_head` heads of `head_dim` numbers. Each token's query is compared with every key
# (scaled dot product); the causal mask hides the future, so token i only mixes the values of
# tokens 0..i. Below we write the scores and the softmax out, then check them against the library's
# causal attention: `gpt2.attention` with the mask `forward` builds when it is given none.

# %%
block = params["blocks"][0]
h, hd = cfg.n_head, cfg.head_dim

a_in = layer_norm(x, **block["ln_1"], eps=cfg.layer_norm_epsilon)  # [n, n_embd], pre-LayerNorm
qkv = linear(a_in, **block["attn"]["c_attn"])  # [n, n_embd] -> [n, 3*n_embd]
q, k, v = qkv.reshape(n, 3, h, hd).transpose(1, 2, 0, 3)  # -> 3 x [n_head, n, head_dim]
causal = np.tril(np.ones((n, n), dtype=bool))  # [n, n]: row i sees columns 0..i
try_this("every token visible to every other", not np.array_equal(causal, np.tri(n, dtype=bool)))
# The library takes the mask as an additive bias (0 = visible, -inf = hidden), built once per pass.
bias = np.where(causal, 0.0, -np.inf).astype(np.float32)


def attention_by_hand(q, k, v, causal):  # 3 x [n_head, n, head_dim], [n, n] -> [n_head, n, head_dim], [n_head, n, n]
    """Each token's mix of the values it may see (`causal`), and the weights it gave them."""
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)  # [n_head, n, n]
    scores = np.where(causal, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)  # softmax over the keys: each row sums to 1
    return weights @ v, weights


def attention_matches(causal):
    """Whether our attention with this mask equals the library's causal attention (forward's own mask)."""
    causal_bias = np.where(np.tri(n, dtype=bool), 0.0, -np.inf).astype(np.float32)  # forward's own: 0 or -inf
    library = attention(q, k, v, causal_bias)  # [n_head, n, head_dim]
    mixed, _ = attention_by_hand(q, k, v, causal)
    return np.allclose(mixed, library, atol=1e-6)


mixed, weights = attention_by_hand(q, k, v, causal)
if check(attention_matches(causal), "inline attention != gpt2.attention"):
    print("inline attention == gpt2.attention")
last = weights[0, -1]  # head 0: how much the last token attends to each token
print("head 0, last token attends to:")
for t, w in zip(tokens, last):
    print(f"  {decode(enc, [t])!r:>12} {'#' * int(round(40 * w)):<40} {w:.2f}")

# %% [markdown]
# The heads are concatenated back to `[n, n_embd]`, projected, and added to the residual stream.
# Then the MLP: LayerNorm, widen 4x, GELU, project back, add. That is the whole block.

# %%
x1 = x + linear(mixed.transpose(1, 0, 2).reshape(n, cfg.n_embd), **block["attn"]["c_proj"])  # [n, n_embd]
m_in = layer_norm(x1, **block["ln_2"], eps=cfg.layer_norm_epsilon)
hidden = gelu(linear(m_in, **block["mlp"]["c_fc"]))  # [n, n_embd] -> [n, 4*n_embd]
x1 = x1 + linear(hidden, **block["mlp"]["c_proj"])  # -> [n, n_embd]
print("after block 0:", x1.shape)

# %% [markdown]
# ## The rest of the stack and the LM head
#
# Every block has the same shape, so the remaining ones are a loop over the same code. The
# final LayerNorm and the *tied* head (the token embedding `wte` reused) turn each row into one
# score (logit) per vocabulary token: row i predicts the token after token i.

# %%
def block_by_hand(x, block):  # [n, n_embd] -> [n, n_embd]
    qkv = linear(layer_norm(x, **block["ln_1"], eps=cfg.layer_norm_epsilon), **block["attn"]["c_attn"])
    q, k, v = qkv.reshape(n, 3, h, hd).transpose(1, 2, 0, 3)  # -> 3 x [n_head, n, head_dim]
    att = attention(q, k, v, bias).transpose(1, 0, 2).reshape(n, cfg.n_embd)  # -> [n, n_embd]
    x = x + linear(att, **block["attn"]["c_proj"])
    return x + linear(gelu(linear(layer_norm(x, **block["ln_2"], eps=cfg.layer_norm_epsilon),
                                  **block["mlp"]["c_fc"])), **block["mlp"]["c_proj"])


assert np.allclose(block_by_hand(x, block), x1, atol=1e-5)  # the loop body is the block we just did
y = x
for blk in params["blocks"]:
    y = block_by_hand(y, blk)
y = layer_norm(y, **params["ln_f"], eps=cfg.layer_norm_epsilon)
logits_by_hand = y @ params["wte"].T  # [n, n_embd] -> [n, n_vocab]
print("logits:", logits_by_hand.shape)

probs = process(logits_by_hand[-1], temperature=1.0)  # softmax: the next-token distribution after the prompt
top = np.argsort(-probs)[:5]
print("most likely next tokens:", ", ".join(f"{decode(enc, [t])!r} {probs[t]:.2f}" for t in top))

# %% [markdown]
# ## The same thing, from the library
#
# `forward(model, tokens, cache)` does all of the above (plus the KV cache of lesson 2, and the
# tree masks of lesson 5). Our hand-written walk must agree with it.

# %%
logits = forward(model, tokens, new_cache(model))  # [n, n_vocab]
diff = np.abs(logits - logits_by_hand).max()
print_rounding(f"largest difference from forward(): {diff:.2e}")  # float32 rounding: varies with the BLAS
if check(np.allclose(logits, logits_by_hand, atol=1e-4, rtol=1e-4), "the walk-through disagrees with forward()"):
    print("OK: the walk-through reproduces gpt2.forward")

# %% [markdown]
# ## Try this
#
# * In the attention cell, make every token visible to every other: `causal = np.ones((n, n),
#   dtype=bool)`. The check against `gpt2.attention` fails, yet the bar chart of the last token
#   does not move: the last row already saw every token. Only the earlier rows change.
# * Drop the position embeddings (`x = params["wte"][tokens]`): the model can no longer tell
#   word order, and the next-token guesses change.
# * Change the prompt and watch the five most likely next tokens.
#
# The first two predictions, checked by running the lesson's own code on the changed value:

# %%
def check_all_visible(causal):
    """The first prediction, for the mask `causal` (to hold: all ones): the check against gpt2.attention fails,
    the last token's weights do not move from the causal mask's, the earlier rows' do."""
    assert not attention_matches(causal), "the check against gpt2.attention passed with this mask"
    _, shipped = attention_by_hand(q, k, v, np.tri(n, dtype=bool))
    _, edited = attention_by_hand(q, k, v, causal)
    assert np.allclose(edited[:, -1], shipped[:, -1]) and not np.allclose(edited[:, :-1], shipped[:, :-1])


def check_no_positions(x_edited):
    """The second, for the residual stream `x_edited` (to hold: token embeddings only): the most likely next
    tokens differ from forward()'s (which adds the positions); the new five."""
    y = x_edited
    for blk in params["blocks"]:
        y = block_by_hand(y, blk)
    edited = layer_norm(y, **params["ln_f"], eps=cfg.layer_norm_epsilon) @ params["wte"].T  # [n, n_vocab]
    five = np.argsort(-edited[-1])[:5]
    assert five.tolist() != np.argsort(-logits[-1])[:5].tolist(), "the five most likely next tokens did not change"
    return five


check_all_visible(np.ones((n, n), dtype=bool))
five = check_no_positions(params["wte"][tokens])
print("every token visible: the check against gpt2.attention fails, the last row's weights stay; "
      "without positions the most likely next tokens become " + ", ".join(repr(decode(enc, [t])) for t in five))
