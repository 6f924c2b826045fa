"""GPT-2 in NumPy: the forward pass over a block of new tokens (a chain or a token tree) with a KV cache.

What GPT-2 computes (Radford et al. 2019), written after picoGPT's small pure functions: learned positions,
pre-LayerNorm blocks, GELU (tanh approximation), a tied LM head. One addition for speculative decoding: `forward`
takes each new token's position and which tokens it may attend to, so a whole token tree is scored in one pass
(tree attention). `forward` is `hidden` (embeddings, blocks, final layer norm: the features) then `lm_head`
(features -> logits). Parameters are plain arrays in a nested dict (picoGPT's layout; linear weights
[n_in, n_out], GPT-2's Conv1D orientation, so `x @ w + b`):

    params = {"wte": [n_vocab, n_embd], "wpe": [n_ctx, n_embd], "ln_f": {"g", "b"},
              "blocks": [{"ln_1": {"g", "b"}, "attn": {"c_attn": {"w", "b"}, "c_proj": {"w", "b"}},
                          "ln_2": {"g", "b"}, "mlp": {"c_fc": {"w", "b"}, "c_proj": {"w", "b"}}}, ...]}

The speed tricks (behind `x @ w`) live in `fastpath.py`, the KV cache in `kvcache.py`, HF's names in `checkpoint.py`.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import numpy as np

from .fastpath import Layout, by_one_row, prepare, softmax_
from .kvcache import KVCache
from .values import real, whole

# ----------------------------------------------------------------------------- the math
# Python floats, not NumPy float64 scalars: those would silently promote float32 arrays to float64.
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def gelu(x):  # GPT-2's tanh approximation
    # x * x * x, not x ** 3: NumPy's float32 power is a generic pow, slower than two products.
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))


def layer_norm(x, g, b, eps: float = 1e-5):  # [n, d] -> [n, d]
    # np.add.reduce rather than np.mean/np.var: the same math with less per-call overhead, which is
    # what a one-token step pays (the scale and shift are applied in place to the fresh xc).
    d = x.shape[-1]
    xc = x - np.add.reduce(x, axis=-1, keepdims=True) / d
    var = np.add.reduce(xc * xc, axis=-1, keepdims=True) / d  # [n, 1]
    xc *= g / np.sqrt(var + eps)  # [n, d]
    xc += b
    return xc


def linear(x, w, b):  # [n, n_in] -> [n, n_out]
    return x @ w + b  # w: a fastpath.Weight, whose product reads the layout that suits n rows


def attention(q, k, v, bias):  # [h, n, d], [h, L, d], [h, L, d], [n, <= L] or None -> [h, n, d]
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(0, 2, 1)  # [h, n, L]
    if bias is not None:  # 0 or -inf (each row sees itself) on the last columns; all rows see the earlier ones
        scores[..., k.shape[1] - bias.shape[1]:] += bias
    return softmax_(scores) @ v


def mha(x, c_attn, c_proj, n_head, cache, layer, bias):  # [n, n_embd] -> [n, n_embd]
    n, d = x.shape
    qkv = linear(x, **c_attn)  # [n, n_embd] -> [n, 3*n_embd]
    qkv = qkv.reshape(n, 3, n_head, d // n_head).transpose(1, 2, 0, 3)  # -> [3, n_head, n, head_dim]
    start = cache.length
    cache.k[layer, :, start:start + n] = qkv[1]  # the block's keys and values join the cache
    cache.v[layer, :, start:start + n] = qkv[2]
    k = cache.k[layer, :, :start + n]  # [n_head, L, head_dim], L = prefix + n
    v = cache.v[layer, :, :start + n]
    out = attention(qkv[0], k, v, bias)  # [n_head, n, head_dim]
    out = out.transpose(1, 0, 2).reshape(n, d)  # -> [n, n_embd]
    return linear(out, **c_proj)


def mlp(x, c_fc, c_proj):  # [n, n_embd] -> [n, n_embd]
    return linear(gelu(linear(x, **c_fc)), **c_proj)  # via [n, 4*n_embd]


def transformer_block(x, block, n_head, cache, layer, bias, eps):  # [n, n_embd] -> [n, n_embd]
    x = x + mha(layer_norm(x, **block["ln_1"], eps=eps), **block["attn"], n_head=n_head,
                cache=cache, layer=layer, bias=bias)
    return x + mlp(layer_norm(x, **block["ln_2"], eps=eps), **block["mlp"])


def forward(model: GPT2, tokens, cache: KVCache, positions=None, mask=None, logits_from: int = 0):
    """Logits [n_new - logits_from, n_vocab] for a block of new tokens [n_new] appended after the cached
    prefix, whose K/V are written at slots `prefix..prefix+n_new-1` (`cache.length` advances).

    positions: [n_new] position ids; default `prefix + arange(n_new)` (a chain); in a tree prefix + depth.
    mask:      bool, [n_new, n_new] (the prefix always visible) or [n_new, prefix + n_new]; default causal.
               Row i: what node i attends to (in a tree, its ancestors and itself).
    logits_from: the first `logits_from` tokens (fed only to catch a cache up) get no logits: the head
               is a large share of a small model's weights.
    """
    return lm_head(model, hidden(model, tokens, cache, positions, mask, logits_from))


def hidden(model: GPT2, tokens, cache: KVCache, positions=None, mask=None, rows_from: int = 0):
    """The features [n_new - rows_from, n_embd] of a block of new tokens (forward's arguments): the top layer's
    hidden states after the final layer norm, what the LM head reads (and an EAGLE head, eagle.py)."""
    tokens, positions, bias, n = inputs(model, tokens, cache, positions, mask, rows_from)  # [n'], n' >= n if padded
    c, p = model.config, model.prepared
    x = p["wte"][tokens] + p["wpe"][positions]  # [n'] -> [n', n_embd]
    for layer, block in enumerate(p["blocks"]):
        x = transformer_block(x, block, c.n_head, cache, layer, bias, c.layer_norm_epsilon)  # [n', n_embd]
    cache.length += n  # padding rows' K/V stay in scratch slots past the end
    return layer_norm(x[rows_from:n], **p["ln_f"], eps=c.layer_norm_epsilon)  # [n - rows_from, n_embd]


def lm_head(model: GPT2, x):  # [n, n_embd] -> [n, n_vocab]
    """GPT-2's tied LM head: x @ wte.T."""
    return x @ model.prepared["head"]


# ----------------------------------------------------------------------------- the block
def inputs(model: GPT2, tokens, cache: KVCache, positions, mask, rows_from: int):
    """forward's arguments checked once (a ValueError names what is wrong) and built into what its layers read:
    tokens [n'], positions [n'], the attention bias [n', <= prefix + n'] (the mask completed, causal by default,
    padded to `Layout.rows(n)` rows by `pad`, `attention_bias`) and n, the real rows."""
    c, prefix = model.config, cache.length
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = tokens.size
    if n == 0:
        raise ValueError("forward needs at least one new token")
    if tokens.min() < 0 or tokens.max() >= c.n_vocab:
        bad = tokens[(tokens < 0) | (tokens >= c.n_vocab)][0]
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{c.n_vocab - 1})")
    positions = prefix + np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64).reshape(-1)
    if positions.size != n:
        raise ValueError(f"{positions.size} positions for {n} tokens")
    if positions.max() >= c.n_ctx:
        raise ValueError(f"context overflow: position {positions.max()} >= n_ctx={c.n_ctx}")
    if not 0 <= rows_from < n:
        raise ValueError(f"logits_from={rows_from}: must be in 0..{n - 1} for {n} tokens")
    mask = None if mask is None else np.asarray(mask, dtype=bool)
    if mask is not None and mask.shape not in ((n, n), (n, prefix + n)):
        raise ValueError(f"mask shape {mask.shape}: expected ({n}, {n}) or ({n}, {prefix + n})")
    rows = model.layout.rows(n)  # >= n: a layout pads a block, never cuts it
    if prefix + rows > cache.capacity:
        raise ValueError(f"KV cache overflow: {prefix} cached + {rows} {'padded' if rows > n else 'new'} > "
                         f"capacity {cache.capacity}")
    if mask is None and n == 1 and rows == 1:
        return tokens, positions, None, n  # one token of a chain sees the whole prefix and itself: no mask to build
    mask = np.tril(np.ones((n, n), dtype=bool)) if mask is None else mask
    if mask.shape == (n, n):
        mask = np.concatenate([np.ones((n, prefix), dtype=bool), mask], axis=1)  # [n, prefix + n]
    if rows > n:
        tokens, positions, mask = pad(tokens, positions, mask, rows)  # [n', prefix + n']
    return tokens, positions, attention_bias(mask, model.dtype), n


def pad(tokens, positions, mask, size: int):
    """Append dummy rows up to `size`: token 0 at the first position, seeing only itself and unseen by every real
    row, so real rows compute exactly what they would alone (a BLAS kernel that works in panels can make a few rows
    cost more than a larger block: the tools set the sizes as `Layout.padding`)."""
    n, width = mask.shape  # width = prefix + n
    extra = size - n
    padded = np.zeros((size, width + extra), dtype=bool)  # [size, prefix + size]
    padded[:n, :width] = mask
    padded[np.arange(n, size), width + np.arange(extra)] = True
    tokens = np.concatenate([tokens, np.zeros(extra, dtype=np.int64)])
    positions = np.concatenate([positions, np.full(extra, positions[0], dtype=np.int64)])
    return tokens, positions, padded


def attention_bias(mask, dtype):  # [n, L] bool -> [n, <= L] or None
    """0 where the mask lets a row attend, -inf elsewhere, from the first column some row may not see (the leading
    ones, seen by all, need no bias: `attention` adds it to the last columns); None when all see all."""
    seen = mask.all(axis=0)  # [L]
    if seen.all():
        return None
    first = int(np.argmin(seen))
    return np.where(mask[:, first:], 0.0, -np.inf).astype(dtype)  # [n, L - first]


# ----------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class GPT2Config:
    """Hyperparameters, named as in GPT-2's `config.json` (n_ctx is its `n_positions`)."""

    n_vocab: int = 50257
    n_ctx: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self):
        for field, value in vars(self).items():
            check_hyperparameter(field, value)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_params(self) -> int:
        """Parameters of a model of this shape (`param_places`; the tied head counted once), in Python's integers."""
        return sum(math.prod(shape) for shape in param_places(self).values())


def check_hyperparameter(field: str, value, name: str | None = None) -> None:
    """A ValueError naming `name` (default: the field) unless `value` suits `field`: a number in (0, 1] for
    layer_norm_epsilon (added to a variance: 1e308 is inf in float32), else an integer >= 1 (not a bool)."""
    name = name or field
    if field == "layer_norm_epsilon":
        if not (real(value) and 0 < value <= 1):
            raise ValueError(f"{name}={value!r} must be a small positive number, at most 1 (GPT-2's is 1e-05)")
    elif not whole(value, 1):
        raise ValueError(f"{name}={value!r} must be an integer >= 1")


# The real GPT-2 family's shapes (GPT-2 small is GPT2Config's default).
GPT2_SHAPES = {"distilgpt2": GPT2Config(n_layer=6), "gpt2": GPT2Config(),
               "gpt2-medium": GPT2Config(n_embd=1024, n_layer=24, n_head=16),
               "gpt2-large": GPT2Config(n_embd=1280, n_layer=36, n_head=20),
               "gpt2-xl": GPT2Config(n_embd=1600, n_layer=48, n_head=25)}


@dataclass(frozen=True, eq=False)
class GPT2:
    """A model: its config, its parameters (plain arrays of one dtype) and how fast its passes are computed
    (`fastpath.Layout`: the tools' choice for a machine; `fastpath.laid_out` changes it)."""

    config: GPT2Config
    params: dict
    layout: Layout = Layout()

    def __post_init__(self):
        object.__setattr__(self, "layout", self.layout.check(self.config.n_ctx))

    @property
    def dtype(self) -> np.dtype:
        return self.params["wte"].dtype

    def astype(self, dtype) -> "GPT2":
        """The same model with every parameter cast to `dtype` (float64 for exact tests)."""
        return GPT2(self.config, map_params(lambda a: a.astype(dtype, order="K"), self.params), self.layout)

    @functools.cached_property
    def prepared(self) -> dict:
        """The parameters as `forward` reads them (`fastpath.prepare`), made on first use."""
        return by_one_row(prepare(self.params, self.layout.slab_rows, self.weight_bytes, head=self.params["wte"].T),
                          self.layout)

    @property
    def n_params(self) -> int:
        return sum(a.size for a in iter_params(self.params))

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward pass reads: every tensor once (`wte` as the tied head, which reads it whole)."""
        return sum(a.nbytes for a in iter_params(self.params))


def new_cache(model: GPT2, max_block: int = 64) -> KVCache:
    """An empty cache for `model` (its dtype), for n_ctx plus a block of up to `max_block` tokens and its padding."""
    return KVCache(model.config, dtype=model.dtype, max_block=max_block + max(model.layout.padding, default=0))


def map_params(fn, tree):
    if isinstance(tree, dict):
        return {k: map_params(fn, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_params(fn, v) for v in tree]
    return fn(tree)


def iter_params(tree) -> list:  # the leaves, in order
    leaves = []
    map_params(leaves.append, tree)
    return leaves


def param_places(config: GPT2Config) -> dict:
    """Where each parameter sits in params (its keys and block index) -> its shape, in the params' order."""
    d = config.n_embd
    per_block = {("ln_1", "g"): (d,), ("ln_1", "b"): (d,), ("attn", "c_attn", "w"): (d, 3 * d),
                 ("attn", "c_attn", "b"): (3 * d,), ("attn", "c_proj", "w"): (d, d), ("attn", "c_proj", "b"): (d,),
                 ("ln_2", "g"): (d,), ("ln_2", "b"): (d,), ("mlp", "c_fc", "w"): (d, 4 * d),
                 ("mlp", "c_fc", "b"): (4 * d,), ("mlp", "c_proj", "w"): (4 * d, d), ("mlp", "c_proj", "b"): (d,)}
    places = {("wte",): (config.n_vocab, d), ("wpe",): (config.n_ctx, d)}
    places.update({("blocks", i, *where): shape for i in range(config.n_layer) for where, shape in per_block.items()})
    return places | {("ln_f", "g"): (d,), ("ln_f", "b"): (d,)}


def empty_params(config: GPT2Config) -> dict:
    """The nested dict of params with empty leaves, to fill at `param_places`."""
    blocks = [{"ln_1": {}, "attn": {"c_attn": {}, "c_proj": {}}, "ln_2": {}, "mlp": {"c_fc": {}, "c_proj": {}}}
              for _ in range(config.n_layer)]
    return {"wte": None, "wpe": None, "blocks": blocks, "ln_f": {}}


def put(params: dict, where: tuple, a) -> None:
    """Set the parameter at `where` (a key path, as `param_places` gives) to `a`."""
    functools.reduce(operator.getitem, where[:-1], params)[where[-1]] = a


def random_params(config: GPT2Config, seed: int = 0, dtype=np.float32, scale: float = 0.02) -> GPT2:
    """A GPT-2 with random weights (GPT-2's init scale), for tests and cost measurements."""
    rng = np.random.default_rng(seed)
    gen_dtype = np.float32 if np.dtype(dtype) == np.float32 else np.float64  # GPT-2-large: no 6 GB temp
    params = empty_params(config)
    for where, shape in param_places(config).items():
        in_layer_norm = any(str(k).startswith("ln_") for k in where)  # layer norms: g about 1, b about 0
        a = rng.standard_normal(shape, dtype=gen_dtype) * gen_dtype(0.1 if in_layer_norm else scale)
        put(params, where, np.ascontiguousarray(1 + a if where[-1] == "g" else a, dtype=dtype))
    return GPT2(config, params)
