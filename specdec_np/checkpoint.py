"""GPT-2 checkpoints in Hugging Face's layout: a directory with `model.safetensors` + `config.json`.

We read safetensors ourselves (an 8-byte little-endian header length, a JSON header of each tensor's dtype, shape
and byte range, then the raw bytes): NumPy has no bfloat16, and a corrupt file fails naming the tensor and the
file. HF's GPT-2 stores linear weights as Conv1D, [n_in, n_out], gpt2.py's orientation: nothing is transposed.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import re
from pathlib import Path

import numpy as np

from .files import WEIGHTS_DIR, WEIGHTS_ENV, atomic_file, check_regular, check_weights_dir, parse_json, read_regular
from .gpt2 import GPT2, GPT2Config, check_hyperparameter, empty_params, param_places, put
from .values import whole

MODEL_FILE, CONFIG_FILE = "model.safetensors", "config.json"
NEEDS = f"a checkpoint directory needs {CONFIG_FILE} and {MODEL_FILE}"

HUB_REPOS = {"distilgpt2": "distilbert/distilgpt2", "gpt2": "openai-community/gpt2",
             "gpt2-medium": "openai-community/gpt2-medium", "gpt2-large": "openai-community/gpt2-large",
             "gpt2-xl": "openai-community/gpt2-xl"}

# safetensors dtype -> NumPy dtype of the stored bytes (BF16 is read as raw uint16 bits).
ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# Bytes per element of every safetensors dtype (to check the byte ranges of any tensor, e.g. BOOL buffers).
ST_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
SAVE_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# GPT2Config's fields -> the config.json keys that hold them (HF's names, then OpenAI's hparams.json names).
CONFIG_KEYS = {"n_vocab": ("vocab_size", "n_vocab"), "n_ctx": ("n_positions", "n_ctx"), "n_embd": ("n_embd",),
               "n_layer": ("n_layer",), "n_head": ("n_head",), "layer_norm_epsilon": ("layer_norm_epsilon",)}

# Not parameters: old transformers' causal-mask buffers, and the LM head, tied to `wte` (checked, then dropped).
BUFFER_RE = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
BLOCK_RE = re.compile(r"h\.(\d+)\.")  # a tensor of block i
LM_HEAD = "lm_head.weight"


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as a GPT-2: the message names the file and the tensor."""


# ----------------------------------------------------------------------------- bfloat16
def bf16_to_f32(bits):  # uint16 [...] -> float32 [...]
    """bfloat16 is the top half of a float32: widening is exact."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):  # float32 [...] -> uint16 [...]
    """Round float32 to bfloat16 bits, to nearest with ties to even (NaN stays a quiet NaN)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to nearest, ties to even;
    # a carry into the exponent is the correct result (up to inf for the largest values).
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


# ----------------------------------------------------------------------------- safetensors
def read_header(path) -> tuple[dict, int]:
    """The JSON header of a safetensors file (tensor name -> entry) and where its data begins, every entry checked
    against the file (dtype, whole numbers, a byte range of its shape's size tiling the data): a truncated download
    is caught without reading the data."""
    path = check_regular(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")  # the header's length
        if size < 8 or 8 + n > size:
            raise CheckpointError(f"{path}: truncated or corrupt safetensors file: its header (8 + {n} bytes) "
                                  f"does not fit in the file's {size} bytes")
        if n > 100 << 20:  # the format's own limit: a header is read whole
            raise CheckpointError(f"{path}: corrupt safetensors file: a header of {n} bytes, over 100 MB")
        try:
            header = parse_json(f.read(n), f"{path}: corrupt safetensors header")
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for name, entry in header.items():
        if not (isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}
                and isinstance(entry["shape"], list) and all(whole(x, 0) for x in entry["shape"])
                and isinstance(entry["data_offsets"], list) and len(entry["data_offsets"]) == 2
                and all(whole(x, 0) for x in entry["data_offsets"])):
            raise CheckpointError(f"{path}: corrupt safetensors header entry for tensor '{name}' (needs dtype, shape "
                                  f"and data_offsets, whole numbers >= 0): {str(entry)[:200]}")
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in ST_SIZES:
            raise CheckpointError(f"{path}: corrupt file: tensor '{name}' has unknown dtype {str(dtype)[:50]}")
        if not 0 <= begin <= end <= data_len:
            raise CheckpointError(f"{path}: truncated or corrupt file: tensor '{name}' occupies bytes "
                                  f"{begin}..{end} of a data buffer of {data_len} bytes")
        if end - begin != ST_SIZES[dtype] * math.prod(shape):  # Python's integers: no overflow
            raise CheckpointError(f"{path}: corrupt file: tensor '{name}' of shape {tuple(shape)} ({dtype}) "
                                  f"has {end - begin} bytes")
        entry["shape"], entry["data_offsets"] = tuple(shape), (begin, end)
    # The format's rule: the tensors' byte ranges tile the data buffer, no overlap, no hole, nothing after.
    at, previous = 0, None
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        begin, end = entry["data_offsets"]
        if begin != at:
            problem = f"overlaps tensor '{previous}'" if begin < at else f"leaves bytes {at}..{begin} unused before it"
            raise CheckpointError(f"{path}: corrupt file: tensor '{name}' (bytes {begin}..{end}) {problem}")
        at, previous = end, name
    if at != data_len:
        raise CheckpointError(f"{path}: corrupt file: {data_len - at} bytes after the last tensor's data")
    return header, 8 + n


def read_tensor(f, path, name, entry, data_start, dtype):
    """One tensor of an open safetensors file, widened to `dtype` (float32 or float64)."""
    if entry["dtype"] not in ST_DTYPES:
        raise CheckpointError(f"{path}: tensor '{name}' has dtype {entry['dtype']}; supported: {', '.join(ST_DTYPES)}")
    begin, end = entry["data_offsets"]
    f.seek(data_start + begin)
    raw = np.frombuffer(f.read(end - begin), dtype=ST_DTYPES[entry["dtype"]])
    a = (bf16_to_f32(raw) if entry["dtype"] == "BF16" else raw).astype(dtype).reshape(entry["shape"])
    if not np.isfinite(a).all():
        raise CheckpointError(f"{path}: tensor '{name}' has non-finite values (nan or inf)")
    return a


def write_safetensors(path, tensors: dict) -> None:
    """Write `name -> (safetensors dtype, array of its stored bytes)` atomically (bf16 as uint16 bits)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0  # the metadata transformers' loader expects
    for name, (st_dtype, a) in tensors.items():
        header[name] = {"dtype": st_dtype, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad so the data starts 8-byte aligned, as safetensors does
    with atomic_file(path) as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for st_dtype, a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype=ST_DTYPES[st_dtype]).tobytes())


# ----------------------------------------------------------------------------- config
def read_config_json(path) -> dict:
    """A `config.json` as a dict (a JSON object, at most 1 MB), or an error naming the file."""
    path = Path(path)
    try:
        cfg = parse_json(read_regular(path, limit=1 << 20), f"{path}: not a valid config.json")
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: not a valid config.json (not a JSON object)")
    except OSError as e:  # missing, a dangling link, a directory, unreadable
        raise type(e)(f"{path}: {e.strerror or e} ({NEEDS})") from None
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return cfg


def read_config(path, cfg: dict | None = None) -> GPT2Config:
    """GPT2Config from a HF `config.json` (or OpenAI's `hparams.json` names; `cfg`: the file already read); what this
    forward pass does not compute is refused."""
    cfg = read_config_json(path) if cfg is None else cfg
    fields = {}
    try:  # each field from the first of its keys present, checked under the name the file uses
        for field, keys in CONFIG_KEYS.items():
            key = next((k for k in keys if cfg.get(k) is not None), None)
            if key is None and field != "layer_norm_epsilon":
                raise ValueError(f"missing '{keys[0]}'")
            fields[field] = 1e-5 if key is None else cfg[key]
            check_hyperparameter(field, fields[field], key)
        config = GPT2Config(**fields)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    # Variants of GPT-2 that this forward pass does not compute: refuse rather than be wrong.
    act = cfg.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError(f"{path}: activation_function '{act}' is not supported (GPT-2's tanh GELU, 'gelu_new')")
    if cfg.get("n_inner") not in (None, 4 * config.n_embd):
        raise CheckpointError(f"{path}: n_inner={cfg['n_inner']} is not supported (must be 4 * n_embd)")
    if cfg.get("scale_attn_by_inverse_layer_idx") or cfg.get("scale_attn_weights") is False:
        raise CheckpointError(f"{path}: non-standard attention scaling is not supported")
    if cfg.get("tie_word_embeddings") is False:
        raise CheckpointError(f"{path}: an untied LM head (tie_word_embeddings=false) is not supported")
    return config


def hf_config(config: GPT2Config, dtype_name: str = "float32", extra: dict | None = None) -> dict:
    """A `config.json` that transformers' GPT2LMHeadModel loads as this model."""
    eot = config.n_vocab - 1  # <|endoftext|> is the last id, in full GPT-2 and in the tiny vocabularies
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config.n_vocab,
            "n_positions": config.n_ctx, "n_ctx": config.n_ctx, "n_embd": config.n_embd, "n_layer": config.n_layer,
            "n_head": config.n_head, "n_inner": None, "layer_norm_epsilon": config.layer_norm_epsilon,
            "activation_function": "gelu_new", "attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1,
            "initializer_range": 0.02, "scale_attn_weights": True, "tie_word_embeddings": True, "use_cache": True,
            "bos_token_id": eot, "eos_token_id": eot, "torch_dtype": dtype_name, **(extra or {})}


# ----------------------------------------------------------------------------- load / save
def param_shapes(config: GPT2Config) -> dict:
    """HF tensor name (no `transformer.` prefix) -> (where in params, shape), in the order of the params
    (`gpt2.param_places`): ("blocks", 0, "attn", "c_attn", "w") is "h.0.attn.c_attn.weight"."""
    leaf = {"g": "weight", "w": "weight", "b": "bias"}

    def hf_name(where):
        *module, last = ["h" if k == "blocks" else str(k) for k in where]
        return ".".join(module + [leaf[last]]) if last in leaf else f"{last}.weight"  # wte, wpe: "wte.weight"
    return {hf_name(where): (where, shape) for where, shape in param_places(config).items()}


def match_tensors(file, header: dict, config: GPT2Config) -> dict:
    """HF name -> key in the file (GPT2LMHeadModel's `transformer.h.0...` or GPT2Model's `h.0...`), names and
    shapes checked, the mask buffers ignored, a `lm_head.weight` of wte's shape allowed (reads no data)."""
    names = {}
    for key in header:
        name = key.removeprefix("transformer.")
        if name in names:
            raise CheckpointError(f"{file}: tensor '{name}' appears twice ('{names[name]}' and '{key}')")
        names[name] = key
    # The block count first, from the names alone: a config.json that does not belong to this file
    # (n_layer 10**12) must fail here, before anything of its size is built.
    blocks = {int(m[1]) for name in names if (m := BLOCK_RE.match(name))}
    if config.n_layer != len(blocks):
        raise CheckpointError(f"{Path(file).parent / CONFIG_FILE}: n_layer={config.n_layer}, but {file} holds "
                              f"{len(blocks)} blocks")
    expected = param_shapes(config)
    if missing := [n for n in expected if n not in names]:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{file}: missing tensor '{missing[0]}'{more}")
    if unexpected := [k for n, k in names.items() if n not in expected and n != LM_HEAD and not BUFFER_RE.fullmatch(n)]:
        raise CheckpointError(f"{file}: unexpected tensor '{unexpected[0]}' for a GPT-2 with n_layer={config.n_layer}")
    wte_shape = expected["wte.weight"][1]
    for name, (_, shape) in [*expected.items(), *([(LM_HEAD, (None, wte_shape))] if LM_HEAD in names else [])]:
        got = header[names[name]]["shape"]
        if got != shape:
            sizes = f"vocab_size={config.n_vocab}, n_positions={config.n_ctx}, n_embd={config.n_embd}"
            raise CheckpointError(f"{file}: tensor '{names[name]}' has shape {got}, expected {shape} from "
                                  f"{CONFIG_FILE} ({sizes})")
    return names


def read_tensors(file, header: dict, data_start: int, names: dict, places: dict, params: dict, dtype) -> dict:
    """`params` with the tensors `names[name]` put at their `places` {name: (where, shape)}, shapes checked (None:
    any), widened to `dtype` and finite (`read_tensor`): how a model's and an EAGLE head's weights are read."""
    for name, (_, shape) in places.items():
        if shape is not None and header[names[name]]["shape"] != shape:
            raise CheckpointError(f"{file}: tensor '{names[name]}' has shape {header[names[name]]['shape']}, "
                                  f"expected {shape}")
    with open(file, "rb") as f:
        for name, (where, _) in places.items():
            put(params, where, read_tensor(f, file, names[name], header[names[name]], data_start, dtype))
    return params


def load(path, dtype=np.float32, check=None) -> GPT2:
    """A HF GPT-2 checkpoint (fp32/fp16/bf16; a directory or a name `resolve` knows) as a GPT2 of `dtype`.
    `check(file, config, itemsize)` runs once the file matches its config, before the model is allocated (the
    tools check the machine's memory there)."""
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"load: dtype must be float32 or float64, not {np.dtype(dtype)}")
    path = resolve(path)
    config = read_config(path / CONFIG_FILE)
    file = path / MODEL_FILE
    try:
        header, data_start = read_header(file)
    except OSError as e:
        raise type(e)(f"{file}: {e.strerror or e} ({NEEDS})") from None
    names = match_tensors(file, header, config)
    if check is not None:
        check(file, config, np.dtype(dtype).itemsize)
    places = param_shapes(config) | ({LM_HEAD: (("lm_head",), None)} if LM_HEAD in names else {})
    params = read_tensors(file, header, data_start, names, places, empty_params(config), dtype)
    head = params.pop("lm_head", None)
    if head is not None and not np.array_equal(head, params["wte"]):  # GPT-2 ties the head to wte
        raise CheckpointError(f"{file}: tensor '{names[LM_HEAD]}' differs from wte: an untied LM head is not supported")
    return GPT2(config, params)


def save(model: GPT2, path_dir, dtype=np.float16, extra_config: dict | None = None) -> Path:
    """Write `model` as a HF GPT-2 checkpoint (keys `h.0.attn.c_attn.weight`, ..., like the gpt2 repo) of
    float16 (default), float32, float64 or "bfloat16" (round to nearest even), each file atomically."""
    return write_checkpoint(path_dir, model.params, param_shapes(model.config), model.config, dtype, extra_config)


def write_checkpoint(path_dir, params: dict, places: dict, config: GPT2Config, dtype, extra_config=None) -> Path:
    """model.safetensors of `params` at `places` {name: (where, shape)}, each finite in `dtype`, and config.json of
    `config` (plus `extra_config`): the one writer of models and EAGLE heads."""
    name = "bfloat16" if dtype in ("bfloat16", "bf16") else np.dtype(dtype).name
    if name not in SAVE_DTYPES:
        raise ValueError(f"save: dtype must be one of {', '.join(SAVE_DTYPES)}, not {dtype!r}")
    path_dir = Path(path_dir)
    path_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for key, (where, shape) in places.items():
        a = np.asarray(functools.reduce(operator.getitem, where, params))
        if a.shape != shape:
            raise ValueError(f"save: parameter {key} has shape {a.shape}, expected {shape}")
        with np.errstate(over="ignore"):  # out of range becomes inf, refused just below
            stored = f32_to_bf16(a) if name == "bfloat16" else a.astype(name)
        wide = bf16_to_f32(stored) if name == "bfloat16" else stored
        if not np.isfinite(wide).all():
            raise ValueError(f"save: parameter {key} is not finite in {name} (nan, inf or out of range)")
        tensors[key] = (SAVE_DTYPES[name], stored)
    write_safetensors(path_dir / MODEL_FILE, tensors)
    with atomic_file(path_dir / CONFIG_FILE, "w") as f:
        json.dump(hf_config(config, name, extra_config), f, indent=2)
        f.write("\n")
    return path_dir


def resolve(name_or_path) -> Path:
    """A checkpoint directory: a path to one, or the name of a model in the weights directory (`files.WEIGHTS_DIR`)."""
    name = str(name_or_path)
    if not name.strip():
        raise FileNotFoundError(f"an empty checkpoint name {name!r}: give a model name ({', '.join(HUB_REPOS)}, "
                                "tiny-target) or a checkpoint directory")
    p = Path(name_or_path)
    if p.is_dir():
        return p
    local = check_weights_dir(WEIGHTS_DIR) / name
    lacks = [local / f for f in (CONFIG_FILE, MODEL_FILE) if not os.path.lexists(local / f)]  # broken: named by load
    if os.sep not in name and "/" not in name and not lacks:
        return local
    if name in HUB_REPOS:
        raise FileNotFoundError(f"checkpoint '{name}' is not downloaded (no {lacks[0]}): run "
                                f"`make weights MODELS={name}` (or `python -m specdec_np weights {name}`)")
    if os.sep not in name and "/" not in name and local.is_dir():  # e.g. tiny-target/ lacking a file
        raise FileNotFoundError(f"{lacks[0]}: checkpoint '{name}' has no {lacks[0].name} (a checkpoint directory "
                                f"needs {CONFIG_FILE} and {MODEL_FILE})")
    where = f"{WEIGHTS_ENV}={os.environ[WEIGHTS_ENV]}" if WEIGHTS_ENV in os.environ else WEIGHTS_DIR
    raise FileNotFoundError(f"no checkpoint directory '{name}' (here or in {where}), and not a known model name "
                            f"({', '.join(HUB_REPOS)})")
