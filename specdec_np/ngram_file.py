"""The n-gram model's file: the counts `ngram.fit` makes in one compressed .npz, beside a format tag, a version,
n_vocab, katz_k and min_count. `read` takes nothing on trust: at most MAX_BYTES (`files.read_regular`), each
array's size checked from its .npy header before it is decompressed, then every array checked to be what fit
writes; a ValueError names the file and the array.
"""

from __future__ import annotations

import io
import math
import zipfile
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from .files import atomic_file, read_regular

FORMAT = "specdec_np.ngram"
VERSION = 1
MAX_BYTES = 1 << 30  # the shipped trigram is 7.5 MB

# The count arrays (per order: histories, their counts, continuations per history, tokens, their counts, discounts).
SAVED = ("uni_count", *(f"{order}_{x}" for order in ("bi", "tri")
                        for x in ("ctx", "ctx_count", "len", "tok", "count", "discount", "abs_discount")))
META = {"n_vocab": 1, "katz_k": 1, "min_count": 1}  # each integer scalar's least value
LEAST = {"uni_count": 0, "ctx": 0, "ctx_count": 1, "len": 1, "tok": 0, "count": 1}  # a history was seen at least once


def write(path, counts: dict, **meta: int) -> None:
    """The counts and `meta` (n_vocab, katz_k, min_count) as one compressed .npz, atomically."""
    with atomic_file(path) as f:
        np.savez_compressed(f, format=np.array(FORMAT), version=np.array(VERSION),
                            **{k: np.array(v) for k, v in meta.items()}, **counts)


def read(path) -> tuple[dict, dict]:
    """(META's values, the SAVED arrays) of a file `write` wrote; a ValueError naming `path` if it is not one."""
    path = Path(path)
    try:
        data = read_regular(path, f"n-gram model file {path}", MAX_BYTES)
    except IsADirectoryError:
        raise FileNotFoundError(f"n-gram model file {path} is a directory") from None
    except FileNotFoundError as e:
        raise FileNotFoundError(f"n-gram model file {path} does not exist ({e.strerror})") from None
    try:
        arrays = read_arrays(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:  # not an .npz of plain arrays
        raise ValueError(f"{path} is not a specdec_np n-gram model ({str(e)[:200]})") from None
    tag, version = arrays.get("format", np.array("")), arrays.get("version")
    if tag.shape != () or tag.item() != FORMAT:
        raise ValueError(f"{path} is not a specdec_np n-gram model: no '{FORMAT}' format tag")
    if missing := [name for name in ("version", *META, *SAVED) if name not in arrays]:
        raise ValueError(f"{path} is missing arrays {missing}")
    if version.shape != () or version.dtype.kind not in "iu" or int(version) != VERSION:
        raise ValueError(f"{path} is n-gram format version {version.tolist()!r}, this code reads {VERSION}")
    try:
        return check(arrays)
    except ValueError as e:
        raise ValueError(f"{path}: not a valid n-gram model: {e}") from None


def read_arrays(file) -> dict:
    """The arrays of the .npz `file`, each refused from its .npy header before it is decompressed if it holds more
    than such a model does: a scalar one entry, uni_count (read first) 2**20, any other array uni_count's sum (a
    model of N tokens has fewer n-grams): a member of a few MB that would inflate to GBs is never inflated."""
    arrays = {}
    with zipfile.ZipFile(file) as z:
        members = {name.removesuffix(".npy"): name for name in z.namelist()}
        if bad := [name for name in members.values() if not name.endswith(".npy")]:
            raise ValueError(f"its member {bad[0]!r} is not a .npy array")
        for name in ("format", "version", *META, *SAVED):
            if name in members:
                with z.open(members[name]) as f:
                    version = npy.read_magic(f)
                    shape, _, dtype = (npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0)(f)
                tokens = int(arrays["uni_count"].sum(dtype=np.int64)) if "uni_count" in arrays else 0
                most = 1 if name not in SAVED else 2**20 if name == "uni_count" else max(tokens, 64)  # 64: discounts
                if dtype.hasobject or math.prod(shape) > most or dtype.itemsize > 256:
                    raise ValueError(f"{name}'s header declares {math.prod(shape)} entries of {dtype}, more than such "
                                     f"a model holds (at most {most})")
                with z.open(members[name]) as f:
                    arrays[name] = npy.read_array(f, allow_pickle=False)
                if name == "uni_count" and not arrays[name].any():  # said here: every later member would be "too long"
                    raise ValueError("uni_count is all zeros: a model fitted on no tokens")
    return arrays


def check(arrays: dict) -> tuple[dict, dict]:
    """(META's values, the SAVED arrays), or a ValueError naming the array that is not what fit writes (integers of
    its shapes and ranges, histories sorted, discounts in [0, 1])."""
    meta = {}
    for name, least in META.items():
        if (a := arrays[name]).shape != () or a.dtype.kind not in "iu" or int(a) < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {a.tolist()!r}")
        meta[name] = int(a)
    V, k = meta["n_vocab"], meta["katz_k"]
    if V > 2**20:
        raise ValueError(f"n_vocab={V} must be at most {2**20}")
    counts = {name: arrays[name] for name in SAVED}
    for name, a in counts.items():
        field = name.split("_", 1)[1] if name != "uni_count" else name
        if field in ("discount", "abs_discount"):
            shape = (k + 2,) if field == "discount" else ()
            if a.shape != shape or a.dtype.kind != "f" or not np.all((a >= 0) & (a <= 1)):
                raise ValueError(f"{name} must be {shape or 'one'} float(s) in [0, 1]")
        elif a.ndim != 1 or a.dtype.kind not in "iu" or (a.size and int(a.min()) < LEAST[field]):
            raise ValueError(f"{name} must be a 1-D array of integers >= {LEAST[field]}")
    if counts["uni_count"].shape != (V,):
        raise ValueError(f"uni_count has shape {counts['uni_count'].shape}, expected ({V},)")
    for order, histories in (("bi", V), ("tri", V * V)):
        ctx, ctx_count, lens, tok, count = (counts[f"{order}_{x}"] for x in ("ctx", "ctx_count", "len", "tok", "count"))
        if not len(ctx) == len(ctx_count) == len(lens):
            raise ValueError(f"{order}_ctx, {order}_ctx_count and {order}_len must have one entry per history")
        if len(tok) != len(count) or len(tok) != int(lens.sum(dtype=np.int64)):
            raise ValueError(f"{order}_tok and {order}_count must have {order}_len's sum of entries")
        if ctx.size and (int(ctx.max()) >= histories or np.any(np.diff(ctx.astype(np.int64)) <= 0)):
            raise ValueError(f"{order}_ctx must be increasing history keys below {histories}")
        if tok.size and int(tok.max()) >= V:
            raise ValueError(f"{order}_tok holds token id {int(tok.max())}, outside the vocabulary 0..{V - 1}")
        starts = np.cumsum(lens, dtype=np.int64) - lens.astype(np.int64)  # [C] each history's first entry
        if ctx.size and np.any(ctx_count < np.add.reduceat(count.astype(np.int64), starts)):
            raise ValueError(f"{order}_ctx_count must be at least the sum of its history's {order}_count")
    return meta, counts
