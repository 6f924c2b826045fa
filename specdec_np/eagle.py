"""Feature-level drafting (EAGLE, Li et al. 2024, arXiv 2401.15077; EAGLE-2's dynamic tree, 2406.16858):
a small head that drafts from the target's own features instead of a separate draft model.

The feature is the target's top-layer hidden state *after* its final layer norm: exactly what its
tied language-model head reads (`gpt2.forward(..., features=True)`). EAGLE's code does the same: the
feature is its LLaMA targets' `model.model(...)` output, already normed, and its head's output goes
straight into the target's `lm_head`, with no norm of its own. A normed feature is also on a fixed
scale, which the regression loss that trains the head needs.

The head, at the position of token t_j, reads the feature f_(j-1) (computed by the target at the token
before) and the embedding of t_j (the target's own wte + wpe: GPT-2 has no rotary positions), fuses
them with one linear layer [2d -> d] and runs one GPT-2 block (its ln_1 kept, which EAGLE's first
layer drops) with its own KV cache over the pairs. Its output is its guess of f_j, which the target's
tied head turns into q for the token after t_j. Deeper in a tree there is no target feature yet: a
node reads its parent's guess. A head is a `gpt2.GPT2` of one block whose params add "fc" (the
fusion) and share the target's wte, wpe and ln_f arrays (q costs the head a product by wte.T, as the
target's own head costs it; the tools time a head's passes as `head_pass` and that product):

    params = {"fc": {"w": [2d, d], "b": [d]}, "blocks": [one GPT-2 block], "wte", "wpe", "ln_f": the target's}

Its checkpoint holds only fc and the block (`save_head`, `load_head`: safetensors + config.json, fp16),
and optionally EAGLE-3's reduced draft vocabulary (arXiv 2503.01840): a 0/1 row "vocab" [V] of the tokens
the head may draft. q is then the target's head on those N rows only (-inf elsewhere), so its product
reads N rows of wte instead of V: the rules never need q > 0 where p > 0, so any q is lossless.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
from pathlib import Path

import numpy as np

from . import checkpoint
from .drafting import ModelDrafter
from .files import atomic_file, read_json
from .gpt2 import (GPT2, attention_bias, empty_params, linear, map_params, new_cache, param_shapes, random_params,
                   transformer_block)
from .record import NO_RECORD
from .tree import DRAFT, block

HEAD_KIND = "eagle-head"  # config.json's "specdec_np" entry of a head's checkpoint


def bind(target: GPT2, fc: dict, block_params: dict, vocab=None) -> GPT2:
    """The head of `target` with fusion `fc` {"w", "b"} and one GPT-2 block, cast to the target's dtype;
    `vocab` [V] (1 for the tokens it may draft, 0 elsewhere), EAGLE-3's reduced draft vocabulary, or None for all."""
    own = {"fc": fc, "blocks": [block_params]}
    if vocab is not None:
        ids = np.flatnonzero(vocab)  # [N]
        # Its q is the target's head restricted to these rows: the product reads N rows of wte, not V.
        own.update(vocab=vocab, vocab_head={"w": target.params["wte"][ids].T, "b": np.zeros(len(ids))})
    own = map_params(lambda a: np.ascontiguousarray(a, dtype=target.dtype), own)
    shared = {k: target.params[k] for k in ("wte", "wpe", "ln_f")}
    return GPT2(dataclasses.replace(target.config, n_layer=1), {**shared, **own})


def random_head(target: GPT2, seed: int = 0, scale: float = 0.02, vocab_size: int | None = None) -> GPT2:
    """A head of `target` with random weights (GPT-2's init scale; the fusion's larger, so that the
    feature matters), drafting from `vocab_size` random tokens (None: all): for tests."""
    d, V, rng = target.config.n_embd, target.config.n_vocab, np.random.default_rng(seed)
    one_block = random_params(dataclasses.replace(target.config, n_layer=1), seed, np.float64, scale)
    fc = {"w": rng.standard_normal((2 * d, d)) * (5 * scale), "b": rng.standard_normal(d) * scale}
    vocab = None if vocab_size is None else np.isin(np.arange(V), rng.choice(V, vocab_size, replace=False))
    return bind(target, fc, one_block.params["blocks"][0], vocab)


def head_pass(head: GPT2, features, tokens, positions, cache, mask):  # [n, d], [n], [n] -> [n, d]
    """The head over n (feature, token) pairs appended after its cache (a chain or a tree, as `mask`
    [n, cache + n] says): its guess of each token's own feature."""
    c, p = head.config, head.prepared
    e = p["wte"][tokens] + p["wpe"][positions]  # the tokens' embeddings, as the target's input [n, d]
    x = linear(np.concatenate([e, features], axis=-1), **p["fc"])  # [n, 2d] -> [n, d]
    x = transformer_block(x, p["blocks"][0], c.n_head, cache, 0, attention_bias(mask, head.dtype),
                          c.layer_norm_epsilon)
    cache.length += len(tokens)
    return x


def head_logits(head: GPT2, features):  # [n, d] -> [n, V]
    """The target's tied head on the head's guessed features (they are already on the normed side); with a
    reduced vocabulary, its rows of those tokens, and -inf elsewhere (q = 0: never drafted; any q is lossless)."""
    p = head.prepared
    if "vocab" not in p:
        return features @ p["head"]
    ids = p.get("vocab_ids")
    if ids is None:  # the vocabulary's token ids, found once per head (its prepared params are made once)
        ids = p["vocab_ids"] = np.flatnonzero(p["vocab"])  # [N]
    logits = np.full((len(features), head.config.n_vocab), -np.inf, dtype=features.dtype)  # [n, V]
    logits[:, ids] = linear(features, **p["vocab_head"])  # [n, N]
    return logits


class FeatureDrafter:
    """The EAGLE head answering the tree builders' `dist_fn` queries (the interface of
    drafting.ModelDrafter: `begin`, `dist_fn`, `commit`, this step's costs).

    It keeps the target's feature of every committed token (`commit` hands over those the target's
    cache kept) and its own KV cache over the pairs (f_(j-1), t_j), slot j - 1. A step's first pass
    feeds the pairs its cache lacks, the root's last (the step's first guess, from the last accepted
    feature and the target's token); later passes feed tree nodes on their parents' guessed features.
    After verification only the pairs made of the target's features stay: the accepted nodes are fed
    again next step with their true features, as EAGLE does.
    """

    def __init__(self, head: GPT2, temperature=0.0, top_k=None, top_p=None, rows: int = 256, recorder=NO_RECORD):
        self.model, self.recorder = head, recorder
        # As for the draft model: at temperature 0 the head ranks alternatives by softmax(logits).
        self.settings = (1.0, None, None) if temperature == 0 else (temperature, top_k, top_p)
        self.cache = new_cache(head, rows)
        self.features = np.zeros((head.config.n_ctx, head.config.n_embd), dtype=head.dtype)  # [n_ctx, d]
        self.n_features, self.root = 0, 0  # the target's features known: of tokens 0..n_features-1
        self.block_sizes, self.dists, self.ngram_queries, self.guessed = [], 0, 0, {}

    def ready(self, seq) -> bool:
        """Whether the target has scored every token before seq's last (not before the first step's pass)."""
        return 1 <= len(seq) - 1 <= self.n_features

    def begin(self, seq, max_depth: int) -> None:
        """Start a step after the committed `seq` (`ready(seq)`); the tree will be at most `max_depth` deep."""
        self.seq, self.root = [int(t) for t in seq], len(seq) - 1
        self.cache.truncate(min(self.cache.length, self.root - 1))  # the root's pair is always fed anew
        self.tokens, self.parents, self.index = [], [], {}  # the nodes fed this step; path key -> node
        self.guess, self.logits, self.dist = {}, {}, {}  # path key -> guessed feature, logits, q
        self.block_sizes, self.dists = [], 0

    dist_fn = ModelDrafter.dist_fn  # q on demand as the draft model's: a `draft_pass` for the keys not fed yet

    def draft_pass(self, keys) -> None:
        """One head pass over the nodes `keys` (their parents fed already), after the catch-up pairs on
        the step's first pass. The head's sequence is seq[1:] (pair j - 1 holds token j), so `tree.block`
        lays out slots and masks; a pair's position is its token's."""
        first, start = len(self.tokens), self.cache.length
        for k in keys:
            self.index[k] = len(self.tokens)
            self.tokens.append(k[-1] if k else self.seq[-1])
            self.parents.append(self.index[k[:-1]] if k else -1)
        tokens, positions, mask, n_c = block(self.seq[1:], start, self.tokens, self.parents, first)
        fed = [self.features[start:start + n_c]]  # catch-up pairs: the target's features
        fed += [self.features[self.root - 1:self.root] if not k else self.guess[k[:-1]][None] for k in keys]
        guess = head_pass(self.model, np.concatenate(fed), tokens, positions + 1, self.cache, mask)  # [m, d]
        self.guess.update(zip(keys, guess[n_c:]))
        self.logits.update(zip(keys, head_logits(self.model, guess[n_c:])))
        self.block_sizes.append(len(tokens))
        self.recorder.draft_pass(keys, [DRAFT] * len(keys), len(tokens))

    def commit(self, accepted_keys, features=None, start: int = 0) -> None:
        """Keep the target's `features` [m, d] of the tokens at slots start..start+m-1 (those its cache
        kept this step), and in the head's cache only the pairs made of target features (up to the root's)."""
        if features is not None:
            self.features[start:start + len(features)] = features
            self.n_features = start + len(features)
        self.cache.truncate(min(self.cache.length, self.root))


# ----------------------------------------------------------------------------- checkpoint
def head_shapes(config) -> dict:
    """safetensors name -> (where in the head's params, shape): the fusion, then block 0 under HF GPT-2's names."""
    d = config.n_embd
    shapes = {"fc.weight": (("fc", "w"), (2 * d, d)), "fc.bias": (("fc", "b"), (d,))}
    shapes.update({name: entry for name, entry in param_shapes(config).items() if name.startswith("h.0.")})
    return shapes


def save_head(head: GPT2, path_dir, dtype=np.float16) -> Path:
    """Write the head's own weights (fc and its block, not the target's) as model.safetensors + config.json."""
    path_dir, name = Path(path_dir), np.dtype(dtype).name
    path_dir.mkdir(parents=True, exist_ok=True)
    tensors = {key: (checkpoint.SAVE_DTYPES[name], np.asarray(functools.reduce(operator.getitem, where, head.params),
                                                                dtype=dtype))
               for key, (where, _) in head_shapes(head.config).items()}
    if "vocab" in head.params:  # the reduced vocabulary, as a 0/1 row over the target's tokens
        tensors["vocab"] = (checkpoint.SAVE_DTYPES[name], head.params["vocab"].astype(dtype))
    checkpoint.write_safetensors(path_dir / checkpoint.MODEL_FILE, tensors)
    with atomic_file(path_dir / checkpoint.CONFIG_FILE, "w") as f:
        # Not a GPT2LMHeadModel (no embeddings of its own): named so that no GPT-2 loader takes it for one.
        extra = {"architectures": ["SpecdecNpEagleHead"], "model_type": "specdec_np_eagle", "specdec_np": HEAD_KIND}
        json.dump(checkpoint.hf_config(head.config, name, extra), f, indent=2)
        f.write("\n")
    return path_dir


def load_head(path, target: GPT2) -> GPT2:
    """The head saved at `path` (a directory, or a name in the weights directory such as "tiny-eagle"), bound to
    `target`."""
    path = checkpoint.resolve(path)
    config = checkpoint.read_config(path / checkpoint.CONFIG_FILE)
    if read_json(path / checkpoint.CONFIG_FILE).get("specdec_np") != HEAD_KIND:
        raise checkpoint.CheckpointError(f"{path}: not an EAGLE head (its config.json lacks \"specdec_np\": "
                                         f"\"{HEAD_KIND}\")")
    for field in ("n_vocab", "n_ctx", "n_embd", "n_head"):
        if getattr(config, field) != getattr(target.config, field):
            raise checkpoint.CheckpointError(f"{path}: the head of a target with {field}={getattr(config, field)}, "
                                             f"not {getattr(target.config, field)}")
    file = path / checkpoint.MODEL_FILE
    header, data_start = checkpoint.read_header(file)
    shapes = head_shapes(config)
    if set(header) - {"vocab"} != set(shapes):
        raise checkpoint.CheckpointError(f"{file}: an EAGLE head holds the tensors {', '.join(shapes)} (and "
                                         f"optionally vocab); this file holds {', '.join(header)}")
    shapes.update({"vocab": (("vocab",), (config.n_vocab,))} if "vocab" in header else {})
    params = {"fc": {}, "blocks": empty_params(dataclasses.replace(config, n_layer=1))["blocks"]}
    with open(file, "rb") as f:
        for key, (where, shape) in shapes.items():
            if header[key]["shape"] != shape:
                raise checkpoint.CheckpointError(f"{file}: tensor '{key}' has shape {header[key]['shape']}, "
                                                 f"expected {shape}")
            parent = functools.reduce(operator.getitem, where[:-1], params)
            parent[where[-1]] = checkpoint.read_tensor(f, file, key, header[key], data_start, target.dtype)
    vocab = params.get("vocab")
    if vocab is not None and not (np.isin(vocab, (0, 1)).all() and vocab.any()):
        raise checkpoint.CheckpointError(f"{file}: tensor 'vocab' must hold only 0 and 1, and at least one 1")
    return bind(target, params["fc"], params["blocks"][0], vocab)
