"""Where models come from: the embedded tiny pair + trigram shipped in `specdec_np/weights/`, or real GPT-2.

`load_model("tiny-target")`, `load_model("gpt2-large")` (after `make weights`) or a directory path; the
tokenizer follows from the vocabulary size (`tokenizer.get_encoding`).
"""

from __future__ import annotations

import numpy as np

from . import eagle, ngram
from .checkpoint import load as load_model  # a model by name (embedded tiny-*, a real GPT-2) or by directory
from .files import WEIGHTS_DIR
from .tokenizer import get_encoding

EMBEDDED_TARGET, EMBEDDED_DRAFT, EMBEDDED_HEAD = "tiny-target", "tiny-draft", "tiny-eagle"
EMBEDDED_NGRAM = WEIGHTS_DIR / "tiny-trigram.npz"


def load_ngram(path=None):
    """The Katz trigram at `path`, by default the embedded one (fitted on the training corpus)."""
    return ngram.load(EMBEDDED_NGRAM if path is None else path)


def load_head(path=EMBEDDED_HEAD, target=None):
    """The EAGLE head at `path` (default: the embedded one, trained for the embedded target), bound to `target`
    (default: the embedded target, float32): pass it as `generate`'s draft with method "eagle"."""
    return eagle.load_head(path, load_model(EMBEDDED_TARGET) if target is None else target)


def load_embedded(dtype=np.float32):
    """(target, draft, trigram, encoding) of the embedded default: everything runs offline."""
    target = load_model(EMBEDDED_TARGET, dtype)
    draft = load_model(EMBEDDED_DRAFT, dtype)
    return target, draft, load_ngram(), get_encoding(target.config.n_vocab)
