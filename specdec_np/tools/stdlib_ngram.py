"""A Katz trigram for a GPT-2 vocabulary with no trigram shipped, built once from Python's own sources.

Stage 2 needs a trigram over the target's vocabulary: fitted in seconds on the code every machine running this has,
the standard library's `.py` files (no tests or packages), on first use; cached (`cache.py`). `--ngram FILE` overrides.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
from pathlib import Path

import numpy as np

from .. import ngram, ngram_file
from ..files import check_regular, read_text
from ..tokenizer import BPE_FILES, get_encoding
from .cache import cache_path

VERSION = 1  # of how the trigram is built: a change rebuilds every cached one
SOURCE_MAX_BYTES = 1 << 24  # a larger source is skipped (Python 3.11's largest, pydoc_data/topics.py: 0.8 MB)
# Files (os.pathsep-separated) to fit on instead of the standard library: tests build from a few.
SOURCES_ENV = "SPECDEC_NP_NGRAM_SOURCES"
SKIPPED_DIRS = {"test", "tests", "site-packages", "dist-packages", "__pycache__"}
YOUR_OWN = "pass one with --ngram FILE (`python -m specdec_np ngram fit FILES --out FILE` fits one)"


def source_files() -> list[Path]:
    """The standard library's .py files, sorted (or the files SPECDEC_NP_NGRAM_SOURCES names)."""
    if os.environ.get(SOURCES_ENV):
        return [Path(name) for name in os.environ[SOURCES_ENV].split(os.pathsep) if name]
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(f for f in root.rglob("*.py") if f.is_file() and not SKIPPED_DIRS & set(f.relative_to(root).parts))


def not_regular(path) -> str:
    """"" if `path` is a regular file, else it and why not (`check_regular`)."""
    try:
        check_regular(path)
    except OSError as e:
        return f"{path} ({e.strerror or e})"
    except ValueError as e:
        return str(e)
    return ""


def cache_file(n_vocab: int, files) -> Path:
    """Where the trigram for `n_vocab` fitted on `files` is cached (a file's size and mtime stand for its text)."""
    stats = [(str(f), *((f.stat().st_size, f.stat().st_mtime_ns) if f.is_file() else ())) for f in files]
    key = {"version": VERSION, "ngram_format": ngram_file.VERSION, "n_vocab": n_vocab, "tokenizer": BPE_FILES,
           "python": f"{platform.python_implementation()} {platform.python_version()}",
           "files": hashlib.sha256(json.dumps(stats).encode()).hexdigest()}
    return cache_path(f"trigram-{n_vocab}", key).with_suffix(".npz")


def build(n_vocab: int, files, progress=lambda done, total: None) -> ngram.Trigram:
    """A Katz trigram on the files' GPT-2 tokens, each after an end-of-text token (unreadable files skipped)."""
    enc, tokens = get_encoding(n_vocab), []
    for i, path in enumerate(files):
        with contextlib.suppress(OSError, ValueError):  # a literal "<|endoftext|>" in a source is text here
            tokens += [enc.eot_token, *enc.encode_ordinary(read_text(path, limit=SOURCE_MAX_BYTES))]
        progress(i + 1, len(files) + 1)
    if len(tokens) < 3:
        raise ValueError(f"no text to fit a trigram on: {YOUR_OWN}")
    model = ngram.fit(np.array(tokens, dtype=np.int64), n_vocab)
    progress(len(files) + 1, len(files) + 1)
    return model


def stdlib_trigram(n_vocab: int, progress=lambda done, total: None, files=None) -> ngram.Trigram:
    """The cached trigram for `n_vocab` fitted on `files` (default: `source_files()`), built on first use (said)."""
    origin = "the given files" if files is not None else SOURCES_ENV if os.environ.get(SOURCES_ENV) else \
        f"Python {platform.python_version()}'s standard library"
    files = source_files() if files is None else [Path(f) for f in files]
    if bad := [why for f in files if (why := not_regular(f))]:  # reading a device (/dev/zero) would never end
        raise ValueError(f"{origin}: not regular files: {', '.join(bad[:3])}"
                         + (f" and {len(bad) - 3} more" if len(bad) > 3 else ""))
    path = cache_file(n_vocab, files)
    if path.is_file():
        try:
            model = ngram.load(path)
            if model.n_vocab == n_vocab:
                return model
            why = f"its vocabulary is {model.n_vocab} tokens, not {n_vocab}"
        except Exception as e:  # cut short, corrupted or not valid in any way: a cache is built again
            why = str(e)
        sys.stderr.write(f"note: the cached trigram {path} is not valid ({why}): building it again\n")
    if not files:
        raise ValueError(f"no Python sources in {sysconfig.get_paths()['stdlib']} to fit a trigram on: {YOUR_OWN}")
    megabytes = sum(f.stat().st_size for f in files if f.is_file()) / 1e6
    seconds = 5 * math.ceil(megabytes / 10)  # 2 MB a second (a quiet core does more), to the next 5 s
    sys.stderr.write(f"building a Katz trigram for this tokenizer ({n_vocab} tokens) from the {len(files)} .py files "
                     f"of {origin} ({megabytes:.1f} MB), once: about {max(seconds, 5)} s; cached in {path.parent}\n")
    model = build(n_vocab, files, progress)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ngram.save(model, path)  # atomically: a temporary file renamed into place
    except OSError as e:  # a cache that cannot be written: this run goes on without it
        sys.stderr.write(f"note: the trigram is not cached ({path}: {e.strerror or e}): the next run builds it again\n")
    return model
