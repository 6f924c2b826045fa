"""Feature-level drafting (EAGLE, Li et al. 2024, arXiv 2401.15077; EAGLE-2's dynamic tree, 2406.16858):
a small head that drafts from the target's own features instead of a separate draft model.

The feature is the target's top-layer hidden state *after* its final layer norm (`gpt2.hidden`), exactly what
its tied LM head reads (`gpt2.lm_head`). EAGLE's code does the same (its head's output goes straight into the
target's `lm_head`, with no norm of its own), and a normed feature is on the fixed scale its regression loss needs.

At the position of token t_j the head fuses the feature f_(j-1) with the embedding of t_j (the target's own
wte + wpe: GPT-2 has no rotary positions) by one linear layer "fc" [2d -> d], then runs one GPT-2 block (its
ln_1 kept, which EAGLE's first layer drops) with its own KV cache over the pairs: its guess of f_j, which the
target's head turns into q for the token after t_j. Deeper in a tree a node reads its parent's guess.

Its checkpoint holds only fc and the block (`save_head`, `load_head`, through checkpoint.py), and optionally
EAGLE-3's reduced draft vocabulary (arXiv 2503.01840): a 0/1 row "vocab" [V] of the tokens the head may draft.
q is then the target's head on those N rows only (-inf elsewhere), reading N rows of wte instead of V: the
rules never need q > 0 where p > 0, so any q is lossless.
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
from .fastpath import Layout, prepare
from .gpt2 import (GPT2, GPT2Config, attention_bias, empty_params, iter_params, linear, map_params, random_params,
                   transformer_block)
from .record import NO_RECORD
from .tree import DRAFT, block
from .values import whole

HEAD_KIND = "eagle-head"  # config.json's "specdec_np" entry of a head's checkpoint
MODEL_TYPE = "specdec_np_eagle"  # its "model_type": not a GPT-2 (no embeddings of its own)


@dataclass(frozen=True, eq=False)
class Head:
    """An EAGLE head of a target: its fusion and block, the target's embeddings it shares, the tokens it may draft,
    and how its passes are computed (`fastpath.Layout`, as a model's: only their speed)."""

    config: GPT2Config  # the target's, with n_layer=1 (its KV cache: `gpt2.new_cache(head, rows)`)
    wte: np.ndarray  # [V, d] the target's token embeddings (the same array): its input, and its LM head
    wpe: np.ndarray  # [n_ctx, d] the target's position embeddings (the same array)
    fc: dict  # the fusion {"w": [2d, d], "b": [d]}
    block: dict  # one GPT-2 block (gpt2.py's layout)
    vocab: np.ndarray | None = None  # [V]: 1 for the tokens it may draft, 0 elsewhere (EAGLE-3); None: all
    layout: Layout = Layout()

    dtype = property(lambda self: self.wte.dtype)
    ids = functools.cached_property(lambda self: np.flatnonzero(self.vocab))  # [N] the tokens it may draft

    @functools.cached_property
    def prepared(self) -> dict:
        """Its layers as `head_pass` reads them (`fastpath.prepare`); "head": wte.T, or its N rows' (vocab)."""
        rows = self.wte if self.vocab is None else self.wte[self.ids]  # [V or N, d]
        return prepare({"fc": self.fc, "block": self.block}, self.layout.slab_rows, self.weight_bytes, head=rows.T)

    @property
    def n_params(self) -> int:
        """Its own parameters: the fusion and the block (not the target's embeddings it shares)."""
        return sum(a.size for a in iter_params([self.fc, self.block]))

    @property
    def weight_bytes(self) -> int:
        """Bytes a pass and its q read: fc, the block, wpe and the LM head's rows (wte, or N rows and vocab)."""
        head = self.wte.nbytes if self.vocab is None else self.ids.size * self.wte[0].nbytes + self.vocab.nbytes
        return sum(a.nbytes for a in iter_params([self.fc, self.block])) + self.wpe.nbytes + head


def bind(target: GPT2, fc: dict, block_params: dict, vocab=None) -> Head:
    """The head of `target` with fusion `fc` {"w", "b"} and one GPT-2 block, cast to the target's dtype;
    `vocab` [V] (1 for the tokens it may draft, 0 elsewhere), EAGLE-3's reduced draft vocabulary, or None for all."""
    fc, block_params = map_params(lambda a: np.ascontiguousarray(a, dtype=target.dtype), [fc, block_params])
    vocab = None if vocab is None else np.ascontiguousarray(vocab, dtype=target.dtype)
    return Head(dataclasses.replace(target.config, n_layer=1), target.params["wte"], target.params["wpe"], fc,
                block_params, vocab)


def random_head(target: GPT2, seed: int = 0, scale: float = 0.02, vocab_size: int | None = None) -> Head:
    """A head of `target` with random weights (GPT-2's init scale; the fusion's larger, so that the
    feature matters), drafting from `vocab_size` random tokens (None: all): for tests."""
    d, V, rng = target.config.n_embd, target.config.n_vocab, np.random.default_rng(seed)
    if vocab_size is not None and not (whole(vocab_size, 1) and vocab_size <= V):
        raise ValueError(f"vocab_size={vocab_size!r} must be an integer from 1 to the target's {V} tokens, or None "
                         "(every token)")
    one_block = random_params(dataclasses.replace(target.config, n_layer=1), seed, np.float64, scale)
    fc = {"w": rng.standard_normal((2 * d, d)) * (5 * scale), "b": rng.standard_normal(d) * scale}
    vocab = None if vocab_size is None else np.isin(np.arange(V), rng.choice(V, vocab_size, replace=False))
    return bind(target, fc, one_block.params["blocks"][0], vocab)


def head_pass(head: Head, features, tokens, positions, cache, mask):  # [n, d], [n], [n] -> [n, d]
    """The head over n (feature, token) pairs appended after its cache (a chain or a tree, as `mask`
    [n, cache + n] says): its guess of each token's own feature."""
    c, p = head.config, head.prepared
    e = head.wte[tokens] + head.wpe[positions]  # the tokens' embeddings, as the target's input [n, d]
    x = linear(np.concatenate([e, features], axis=-1), **p["fc"])  # [n, 2d] -> [n, d]
    x = transformer_block(x, p["block"], c.n_head, cache, 0, attention_bias(mask, head.dtype), c.layer_norm_epsilon)
    cache.length += len(tokens)
    return x


def head_logits(head: Head, features):  # [n, d] -> [n, V]
    """The target's tied head on the head's guessed features (they are already on the normed side); with a
    reduced vocabulary, its rows of those tokens, and -inf elsewhere (q = 0: never drafted; any q is lossless)."""
    logits = features @ head.prepared["head"]  # [n, V or N]
    if head.vocab is None:
        return logits
    full = np.full((len(features), head.config.n_vocab), -np.inf, dtype=features.dtype)  # [n, V]
    full[:, head.ids] = logits
    return full


class FeatureDrafter(Drafter):
    """The EAGLE head as a drafting.Drafter. It keeps the target's feature of every committed token (`commit`)
    and its own KV cache over the pairs (f_(j-1), t_j), slot j - 1. A step's first pass feeds the pairs its cache
    lacks, the root's last; later passes feed tree nodes on their parents' guessed features. After verification
    only the pairs of target features stay: accepted nodes are fed again with their true features, as in EAGLE."""

    def __init__(self, head: Head, temperature=0.0, top_k=None, top_p=None, rows: int = 256, recorder=NO_RECORD):
        super().__init__(head, temperature, top_k, top_p, rows, recorder)
        self.features = np.zeros((head.config.n_ctx, head.config.n_embd), dtype=head.dtype)  # [n_ctx, d]
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
def head_places(config) -> dict:
    """safetensors name -> (where in {"fc": fc, "blocks": [block]}, shape): the fusion, then its block under HF
    GPT-2's names (checkpoint.param_shapes)."""
    d = config.n_embd
    shapes = {"fc.weight": (("fc", "w"), (2 * d, d)), "fc.bias": (("fc", "b"), (d,))}
    hf = checkpoint.param_shapes(dataclasses.replace(config, n_layer=1))
    return shapes | {name: entry for name, entry in hf.items() if name.startswith("h.0.")}


def save_head(head: Head, path_dir, dtype=np.float16) -> Path:
    """Write the head's own weights (fc and its block, not the target's) as model.safetensors + config.json."""
    own, places = {"fc": head.fc, "blocks": [head.block], "vocab": head.vocab}, head_places(head.config)
    places.update({} if head.vocab is None else {"vocab": (("vocab",), head.vocab.shape)})  # a 0/1 row [V]
    # Not a GPT2LMHeadModel (no embeddings of its own): named so that no GPT-2 loader takes it for one.
    extra = {"architectures": ["SpecdecNpEagleHead"], "model_type": MODEL_TYPE, "specdec_np": HEAD_KIND}
    return checkpoint.write_checkpoint(path_dir, own, places, head.config, dtype, extra)


def load_head(path, target: GPT2) -> Head:
    """The head saved at `path` (a directory, or a name in the weights directory such as "tiny-eagle"), bound to
    `target`."""
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
    for field in ("n_vocab", "n_ctx", "n_embd", "n_head"):
        if getattr(config, field) != getattr(target.config, field):
            raise CheckpointError(f"{path}: the head of a target with {field}={getattr(config, field)}, "
                                  f"not {getattr(target.config, field)}")
    file = path / MODEL_FILE
    header, data_start = checkpoint.read_header(file)
    places = head_places(config)
    if set(header) - {"vocab"} != set(places):
        raise CheckpointError(f"{file}: an EAGLE head holds the tensors {', '.join(places)} (and optionally vocab); "
                              f"this file holds {', '.join(header)}")
    places.update({"vocab": (("vocab",), (config.n_vocab,))} if "vocab" in header else {})
    own = {"fc": {}, "blocks": empty_params(config)["blocks"]}  # to fill at `places`
    checkpoint.read_tensors(file, header, data_start, {key: key for key in places}, places, own, target.dtype)
    vocab = own.get("vocab")
    if vocab is not None and not (np.isin(vocab, (0, 1)).all() and vocab.any()):
        raise CheckpointError(f"{file}: tensor 'vocab' must hold only 0 and 1, and at least one 1")
    return bind(target, own["fc"], own["blocks"][0], vocab)
