"""Feature-level drafting (EAGLE, Li et al. 2024, arXiv 2401.15077; EAGLE-2's dynamic tree, 2406.16858): a small
head that drafts from the target's own features (its top hidden state after ln_f, `gpt2.hidden`: what its tied LM
head reads, as in EAGLE's code, on the fixed scale the regression needs) instead of a separate draft model.

At token t_j the head fuses the feature f_(j-1) [D] with t_j's embedding (the target's wte + wpe) by "fc" [2D -> d]
into its own width d, narrower than the target's D (a pass reads fewer bytes than the draft model's), runs one
GPT-2 block of width d (ln_1 kept, which EAGLE drops) with its own KV cache over the pairs, and projects back by
"out" [d -> D]: its guess of f_j, read by the target's head as q for the token after t_j, and by a child in a tree.
Its checkpoint holds fc, the block, out and optionally EAGLE-3's reduced draft vocabulary (arXiv 2503.01840), a 0/1
row "vocab" [V]: q is the target's head on those N rows only (-inf elsewhere; any q is lossless).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import checkpoint
from .checkpoint import CONFIG_FILE, MODEL_FILE, CheckpointError
from .drafting import Drafter
from .fastpath import Layout, by_one_row, prepare
from .gpt2 import (GPT2, GPT2Config, attention_bias, empty_params, iter_params, linear, map_params, random_params,
                   transformer_block)
from .record import NO_RECORD
from .tree import DRAFT, block
from .values import whole

HEAD_KIND = "eagle-head"  # config.json's "specdec_np" entry of a head's checkpoint
MODEL_TYPE = "specdec_np_eagle"  # its "model_type": not a GPT-2 (no embeddings of its own)


@dataclass(frozen=True, eq=False)
class Head:
    """An EAGLE head: its own layers, the target's embeddings, its tokens, its passes' layout (`fastpath.Layout`)."""

    config: GPT2Config  # its block's: width d, its heads, n_layer=1, the target's n_vocab and n_ctx (its KV cache)
    wte: np.ndarray  # [V, D] the target's token embeddings (the same array): its input, and its LM head
    wpe: np.ndarray  # [n_ctx, D] the target's position embeddings (the same array)
    fc: dict  # the fusion {"w": [2D, d], "b": [d]}
    block: dict  # one GPT-2 block of width d (gpt2.py's layout)
    out: dict  # the projection to the feature {"w": [d, D], "b": [D]}
    vocab: np.ndarray | None = None  # [V]: 1 for the tokens it may draft, 0 elsewhere (EAGLE-3); None: all
    layout: Layout = Layout()

    dtype = property(lambda self: self.wte.dtype)
    n_feature = property(lambda self: self.wte.shape[1])  # D: the width of the target's features it reads
    ids = functools.cached_property(lambda self: np.flatnonzero(self.vocab))  # [N] the tokens it may draft

    @functools.cached_property
    def prepared(self) -> dict:
        """Its layers as `head_pass` reads them (`fastpath.prepare`), and q's "head" [d, N] and "bias" [N]: the target's
        tied head on its N rows folded into out, out(h) @ rows.T = h @ (out.w @ rows.T) + out.b @ rows.T exactly."""
        rows = self.wte if self.vocab is None else self.wte[self.ids]  # [V or N, D]
        own = by_one_row(prepare({"fc": self.fc, "block": self.block, "out": self.out}, self.layout.slab_rows,
                                 self.weight_bytes, head=self.out["w"] @ rows.T), self.layout)
        return own | {"bias": self.out["b"] @ rows.T}

    n_params = property(lambda self: sum(a.size for a in iter_params([self.fc, self.block, self.out])))  # its own

    @property
    def weight_bytes(self) -> int:
        """Bytes a pass and its q read: fc, the block, out, wpe, vocab, and q's folded head [d, N] and bias [N]."""
        n = len(self.wte) if self.vocab is None else self.ids.size  # N
        own = sum(a.nbytes for a in iter_params([self.fc, self.block, self.out])) + getattr(self.vocab, "nbytes", 0)
        return own + self.wpe.nbytes + (self.config.n_embd + 1) * n * self.dtype.itemsize


def bind(target: GPT2, n_head: int, fc: dict, block_params: dict, out: dict, vocab=None) -> Head:
    """The head of `target`: fc {"w": [2D, d], "b"}, one GPT-2 block (d wide, `n_head` heads), out {"w": [d, D], "b"}
    in the target's dtype; `vocab` [V] (1 for the tokens it may draft, 0 elsewhere: EAGLE-3's), or None for all."""
    fc, block_params, out = map_params(lambda a: np.ascontiguousarray(a, dtype=target.dtype), [fc, block_params, out])
    vocab = None if vocab is None else np.ascontiguousarray(vocab, dtype=target.dtype)
    config = dataclasses.replace(target.config, n_layer=1, n_embd=fc["w"].shape[1], n_head=n_head)
    return Head(config, target.params["wte"], target.params["wpe"], fc, block_params, out, vocab)


def random_head(target: GPT2, seed=0, scale=0.02, vocab_size: int | None = None, width: int | None = None) -> Head:
    """A random head of `target` (GPT-2's init scale, fc's and out's larger), `width` wide (None: half the target's)
    with the target's head size, drafting from `vocab_size` random tokens (None: all): for tests."""
    c, rng = target.config, np.random.default_rng(seed)
    D, V, d = c.n_embd, c.n_vocab, c.n_embd // 2 if width is None else width
    if vocab_size is not None and not (whole(vocab_size, 1) and vocab_size <= V):
        raise ValueError(f"vocab_size={vocab_size!r} must be an integer from 1 to the target's {V} tokens, or None")
    own = dataclasses.replace(c, n_layer=1, n_embd=d, n_head=max(1, d // c.head_dim))
    one_block = random_params(own, seed, np.float64, scale).params["blocks"][0]
    fc = {"w": rng.standard_normal((2 * D, d)) * (5 * scale), "b": rng.standard_normal(d) * scale}
    out = {"w": rng.standard_normal((d, D)) * (5 * scale), "b": rng.standard_normal(D) * scale}
    vocab = None if vocab_size is None else np.isin(np.arange(V), rng.choice(V, vocab_size, replace=False))
    return bind(target, own.n_head, fc, one_block, out, vocab)


def head_pass(head: Head, features, tokens, positions, cache, mask):  # [n, D], [n], [n] -> [n, d]
    """Its block over n (feature, token) pairs after its cache (a chain or a tree: `mask` [n, cache + n]): h."""
    c, p = head.config, head.prepared
    e = head.wte[tokens] + head.wpe[positions]  # the tokens' embeddings, as the target's input [n, D]
    x = linear(np.concatenate([e, features], axis=-1), **p["fc"])  # [n, 2D] -> [n, d]
    x = transformer_block(x, p["block"], c.n_head, cache, 0, attention_bias(mask, head.dtype), c.layer_norm_epsilon)
    cache.length += len(tokens)
    return x


def head_features(head: Head, h):  # [n, d] -> [n, D]: its guesses out(h) of each token's own feature (a child's input)
    return linear(h, **head.prepared["out"])


def head_logits(head: Head, h):  # [n, d] -> [n, V]
    """The target's tied head on the guesses out(h), folded (`Head.prepared`); with a reduced vocabulary -inf outside
    its tokens (q = 0 there: never drafted)."""
    logits = h @ head.prepared["head"] + head.prepared["bias"]  # [n, V or N]
    if head.vocab is None:
        return logits
    full = np.full((len(h), head.config.n_vocab), -np.inf, dtype=h.dtype)  # [n, V]
    full[:, head.ids] = logits
    return full


class FeatureDrafter(Drafter):
    """The EAGLE head as a drafting.Drafter: the target's feature of every committed token (`commit`), its own KV cache
    over the pairs (f_(j-1), t_j), slot j - 1. A step's first pass feeds the pairs its cache lacks, the root's last;
    later ones tree nodes on their parents' guesses. Verified, only pairs of target features stay (as in EAGLE)."""

    def __init__(self, head: Head, temperature=0.0, top_k=None, top_p=None, rows: int = 256, recorder=NO_RECORD):
        super().__init__(head, temperature, top_k, top_p, rows, recorder)
        self.features = np.zeros((head.config.n_ctx, head.n_feature), dtype=head.dtype)  # [n_ctx, D]
        self.n_features, self.root = 0, 0  # the target's features known: of tokens 0..n_features-1

    def ready(self, seq) -> bool:
        """Whether the target has scored every token before seq's last (not before the first step's pass)."""
        return 1 <= len(seq) - 1 <= self.n_features

    def begin(self, seq, max_depth: int) -> None:
        """Start a step after the committed `seq` (`ready(seq)`); the tree will be at most `max_depth` deep."""
        super().begin(seq, max_depth)
        self.cache.truncate(min(self.cache.length, self.root - 1))  # the root's pair is always fed anew
        self.guess = {}  # path key -> guessed feature

    def draft_pass(self, keys) -> None:
        """One head pass over the nodes `keys` (after the catch-up pairs on the step's first pass). Pair j - 1 holds
        token j: `tree.block` lays out seq[1:]'s slots and masks; a pair's position is its token's."""
        first, start = len(self.tokens), self.cache.length
        self.feed(keys)
        tokens, positions, mask, n_c = block(self.seq[1:], start, self.tokens, self.parents, first)
        fed = [self.features[start:start + n_c]]  # catch-up pairs: the target's features
        fed += [self.features[self.root - 1:self.root] if not k else self.guess[k[:-1]][None] for k in keys]
        h = head_pass(self.model, np.concatenate(fed), tokens, positions + 1, self.cache, mask)[n_c:]  # [m, d]
        self.guess.update(zip(keys, head_features(self.model, h)))
        self.logits.update(zip(keys, head_logits(self.model, h)))
        self.block_sizes.append(len(tokens))
        self.recorder.draft_pass(keys, [DRAFT] * len(keys), len(tokens))

    def commit(self, accepted_keys, features=None, start: int = 0) -> None:
        """Keep the target's `features` [m, D] of the tokens at slots start..start+m-1 (those its cache
        kept this step), and in the head's cache only the pairs made of target features (up to the root's)."""
        if features is not None:
            self.features[start:start + len(features)] = features
            self.n_features = start + len(features)
        self.cache.truncate(min(self.cache.length, self.root))


# ----------------------------------------------------------------------------- checkpoint
def head_places(config, n_feature: int) -> dict:
    """safetensors name -> (where, shape): fc [2D, d], out [d, D] (D: `n_feature`), the block under HF GPT-2's names."""
    D, d = n_feature, config.n_embd
    shapes = {"fc.weight": (("fc", "w"), (2 * D, d)), "fc.bias": (("fc", "b"), (d,)),
              "out.weight": (("out", "w"), (d, D)), "out.bias": (("out", "b"), (D,))}
    hf = checkpoint.param_shapes(dataclasses.replace(config, n_layer=1))
    return shapes | {name: entry for name, entry in hf.items() if name.startswith("h.0.")}


def save_head(head: Head, path_dir, dtype=np.float16) -> Path:
    """Its own weights as model.safetensors + config.json (its n_embd, n_head, and the target's width it reads)."""
    own = {"fc": head.fc, "blocks": [head.block], "out": head.out, "vocab": head.vocab}
    places = head_places(head.config, head.n_feature)
    places.update({} if head.vocab is None else {"vocab": (("vocab",), head.vocab.shape)})  # a 0/1 row [V]
    # Not a GPT2LMHeadModel (no embeddings of its own): named so that no GPT-2 loader takes it for one.
    extra = {"architectures": ["SpecdecNpEagleHead"], "model_type": MODEL_TYPE, "specdec_np": HEAD_KIND,
             "target_n_embd": head.n_feature}
    return checkpoint.write_checkpoint(path_dir, own, places, head.config, dtype, extra)


def load_head(path, target: GPT2) -> Head:
    """The head saved at `path` (a directory, or a name such as "tiny-eagle"), bound to `target`."""
    path = checkpoint.resolve(path)
    cfg = checkpoint.read_config_json(path / CONFIG_FILE)
    if cfg.get("specdec_np") != HEAD_KIND:
        raise CheckpointError(f"{path}: not an EAGLE head (its config.json lacks \"specdec_np\": \"{HEAD_KIND}\")")
    if cfg.get("model_type") != MODEL_TYPE:
        raise CheckpointError(f"{path}: not an EAGLE head (its config.json's model_type is "
                              f"{str(cfg.get('model_type'))[:50]!r}, not \"{MODEL_TYPE}\")")
    config = checkpoint.read_config(path / CONFIG_FILE, cfg)
    if config.n_layer != 1:
        raise CheckpointError(f"{path / CONFIG_FILE}: n_layer={config.n_layer}, but an EAGLE head has one block")
    for field, value in {"n_vocab": config.n_vocab, "n_ctx": config.n_ctx, "n_embd": cfg.get("target_n_embd")}.items():
        if value != (want := getattr(target.config, field)):
            raise CheckpointError(f"{path}: the head of a target with {field}={value}, not {want}")
    file = path / MODEL_FILE
    header, data_start = checkpoint.read_header(file)
    places = head_places(config, target.config.n_embd)
    if set(header) - {"vocab"} != set(places):
        raise CheckpointError(f"{file}: an EAGLE head holds the tensors {', '.join(places)} (and optionally vocab); "
                              f"this file holds {', '.join(header)}")
    places.update({"vocab": (("vocab",), (config.n_vocab,))} if "vocab" in header else {})
    own = {"fc": {}, "blocks": empty_params(config)["blocks"], "out": {}}  # to fill at `places`
    checkpoint.read_tensors(file, header, data_start, {key: key for key in places}, places, own, target.dtype)
    vocab = own.get("vocab")
    if vocab is not None and not (np.isin(vocab, (0, 1)).all() and vocab.any()):
        raise CheckpointError(f"{file}: tensor 'vocab' must hold only 0 and 1, and at least one 1")
    return bind(target, config.n_head, own["fc"], own["blocks"][0], own["out"], vocab)
