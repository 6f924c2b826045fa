"""Loading and saving HF GPT-2 checkpoints: round trips, both key layouts, and every bad input.

Files under test are mostly written with the `safetensors` library itself (an independent writer),
with tensor names spelled out here rather than taken from the module under test.
"""

import json
import struct

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from specdec_np import checkpoint as ck
from specdec_np.gpt2 import GPT2Config, iter_params, map_params, random_params

CONFIG = GPT2Config(n_vocab=37, n_ctx=11, n_embd=8, n_layer=2, n_head=2, layer_norm_epsilon=1e-4)


@pytest.fixture(scope="module")
def model():
    return random_params(CONFIG, seed=3)


def hf_tensors(model, prefix=""):
    """The model as HF GPT-2 tensors, names written out by hand (float32)."""
    p, out = model.params, {}
    out[prefix + "wte.weight"], out[prefix + "wpe.weight"] = p["wte"], p["wpe"]
    out[prefix + "ln_f.weight"], out[prefix + "ln_f.bias"] = p["ln_f"]["g"], p["ln_f"]["b"]
    for i, b in enumerate(p["blocks"]):
        h = f"{prefix}h.{i}."
        for ln in ("ln_1", "ln_2"):
            out[h + ln + ".weight"], out[h + ln + ".bias"] = b[ln]["g"], b[ln]["b"]
        for mod, sub in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
            out[f"{h}{mod}.{sub}.weight"], out[f"{h}{mod}.{sub}.bias"] = b[mod][sub]["w"], b[mod][sub]["b"]
    return {k: np.array(v, dtype=np.float32, order="C") for k, v in out.items()}  # C-order copies: tests mutate them


def hf_config(config=CONFIG, **overrides):
    cfg = {"model_type": "gpt2", "vocab_size": config.n_vocab, "n_positions": config.n_ctx, "n_embd": config.n_embd,
           "n_layer": config.n_layer, "n_head": config.n_head, "layer_norm_epsilon": config.layer_norm_epsilon}
    cfg.update(overrides)
    return cfg


def write_dir(path, tensors, config=None):
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf_config() if config is None else config))
    return path


def assert_refused(path, tensors, match, config=None):
    """Write a checkpoint dir; loading it raises a CheckpointError whose message matches `match`."""
    write_dir(path, tensors, config)
    with pytest.raises(ck.CheckpointError, match=match):
        ck.load(path)


def assert_params_equal(a, b):
    for x, y in zip(iter_params(a.params), iter_params(b.params), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def bf16_reference(x):
    """Round float32 to the nearest bfloat16 in exact float64 arithmetic, ties to even mantissa."""
    x = np.asarray(x, dtype=np.float32)
    lo_bits = x.view(np.uint32) & np.uint32(0xFFFF0000)  # truncation toward zero
    hi_bits = lo_bits + np.uint32(0x10000)  # next bf16 away from zero
    lo, hi = lo_bits.view(np.float32).astype(np.float64), hi_bits.view(np.float32).astype(np.float64)
    d_lo, d_hi = np.abs(x - lo), np.abs(hi - x)
    lo_even = ((lo_bits >> 16) & 1) == 0
    pick_lo = (d_lo < d_hi) | ((d_lo == d_hi) & lo_even)
    return np.where(pick_lo, lo, hi).astype(np.float32)


# ----------------------------------------------------------------------------- round trips

def test_roundtrip_fp32_is_exact(model, tmp_path):
    ck.save(model, tmp_path, dtype=np.float32)
    loaded = ck.load(tmp_path)
    assert loaded.config == CONFIG
    assert_params_equal(loaded, model)


def test_roundtrip_fp16_is_rounding_to_fp16(model, tmp_path):
    ck.save(model, tmp_path)  # float16 is the default
    assert_params_equal(ck.load(tmp_path), model.astype(np.float16).astype(np.float32))


def test_roundtrip_bf16_is_rounding_to_bf16(model, tmp_path):
    ck.save(model, tmp_path, dtype="bfloat16")
    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:  # only reads the header here
        assert f.metadata() == {"format": "pt"}
    header, _ = ck.read_header(tmp_path / "model.safetensors")
    assert {e["dtype"] for e in header.values()} == {"BF16"}
    expected = type(model)(CONFIG, map_params(bf16_reference, model.params))
    assert_params_equal(ck.load(tmp_path), expected)


def test_load_float64(model, tmp_path):
    ck.save(model, tmp_path, dtype=np.float32)
    assert_params_equal(ck.load(tmp_path, dtype=np.float64), model.astype(np.float64))
    with pytest.raises(ValueError, match="dtype"):
        ck.load(tmp_path, dtype=np.float16)


def test_bf16_rounding_matches_exact_reference():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, s, 2000) for s in (1e-30, 1e-3, 1, 1e3, 1e30)]).astype(np.float32)
    # exact ties (1 + half a bf16 ulp, etc.) and values just either side of a tie
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130 * (1 + 2**-8), 1.5 + 2**-8], np.float32)
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    x = np.concatenate([x, ties, near, np.float32([0.0, -0.0, 1e-45, 65504.0])])
    np.testing.assert_array_equal(ck.bf16_to_f32(ck.f32_to_bf16(x)), bf16_reference(x))
    assert ck.bf16_to_f32(ck.f32_to_bf16(np.float32([1 + 2**-8])))[0] == 1.0  # tie to even: down
    assert ck.bf16_to_f32(ck.f32_to_bf16(np.float32([1 + 3 * 2**-8])))[0] == 1 + 2**-6  # tie to even: up
    assert np.isnan(ck.bf16_to_f32(ck.f32_to_bf16(np.float32([np.nan]))))[0]


def test_bf16_widening_is_exact_for_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32)
    sign, exp, frac = bits >> 15, (bits >> 7) & 0xFF, (bits & 0x7F).astype(np.float64)
    value = np.where(exp == 0, frac / 128 * 2.0**-126, (1 + frac / 128) * 2.0 ** (exp.astype(np.float64) - 127))
    value = np.where(sign == 1, -value, value)
    finite = exp != 0xFF
    np.testing.assert_array_equal(ck.bf16_to_f32(bits[finite].astype(np.uint16)).astype(np.float64), value[finite])


def test_saved_files_are_hf_gpt2(model, tmp_path):
    ck.save(model, tmp_path, dtype=np.float32, extra_config={"note": "tiny"})
    tensors = load_file(str(tmp_path / "model.safetensors"))  # the reference reader accepts our file
    expected = hf_tensors(model)
    assert set(tensors) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(tensors[k], expected[k])
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    assert (cfg["vocab_size"], cfg["n_positions"], cfg["n_ctx"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"]) == (
        37, 11, 11, 8, 2, 2)
    assert cfg["bos_token_id"] == cfg["eos_token_id"] == 36
    assert cfg["activation_function"] == "gelu_new" and cfg["layer_norm_epsilon"] == 1e-4
    assert cfg["note"] == "tiny"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]  # no temp files


def test_save_errors_leave_nothing(model, tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        ck.save(model, tmp_path, dtype=np.int32)
    big = type(model)(CONFIG, map_params(lambda a: a.copy(), model.params))
    big.params["blocks"][1]["mlp"]["c_fc"]["w"][0, 0] = 1e6  # beyond float16's range
    with pytest.raises(ValueError, match=r"h\.1\.mlp\.c_fc\.weight"):
        ck.save(big, tmp_path, dtype=np.float16)
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- layouts

@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_both_key_layouts(model, tmp_path, prefix):
    write_dir(tmp_path, hf_tensors(model, prefix))
    assert_params_equal(ck.load(tmp_path), model)


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_tied_lm_head_present_is_checked_and_ignored(model, tmp_path, prefix):
    tensors = hf_tensors(model, prefix)
    tensors["lm_head.weight"] = tensors[prefix + "wte.weight"].copy()
    write_dir(tmp_path, tensors)
    assert_params_equal(ck.load(tmp_path), model)

    tensors["lm_head.weight"][3, 4] += 1.0  # an untied head: a different model
    assert_refused(tmp_path, tensors, r"model\.safetensors: tensor 'lm_head\.weight' differs from wte")

    tensors["lm_head.weight"] = tensors["lm_head.weight"][:-1]
    assert_refused(tmp_path, tensors, r"model\.safetensors: tensor 'lm_head\.weight' has shape \(36, 8\)")


def test_attention_buffers_are_ignored(model, tmp_path):
    tensors = hf_tensors(model, "transformer.")
    tril = np.tril(np.ones((11, 11)))[None, None]
    tensors["transformer.h.0.attn.bias"] = tril.astype(np.float32)  # old transformers: float mask
    tensors["transformer.h.1.attn.bias"] = tril.astype(bool)  # newer: a bool mask
    tensors["transformer.h.0.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    tensors["transformer.h.1.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    write_dir(tmp_path, tensors)
    assert_params_equal(ck.load(tmp_path), model)


def test_fp16_file_from_reference_writer(model, tmp_path):
    write_dir(tmp_path, {k: v.astype(np.float16) for k, v in hf_tensors(model).items()})
    assert_params_equal(ck.load(tmp_path), model.astype(np.float16).astype(np.float32))


# ----------------------------------------------------------------------------- bad input

def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        ck.load(tmp_path / "nowhere")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="config.json"):
        ck.load(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "config.json").write_text(json.dumps(hf_config()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        ck.load(tmp_path)


def test_missing_tensor(model, tmp_path):
    tensors = hf_tensors(model)
    del tensors["h.1.mlp.c_fc.bias"]
    assert_refused(tmp_path, tensors, r"model\.safetensors: missing tensor 'h\.1\.mlp\.c_fc\.bias'")


def test_unexpected_tensor(model, tmp_path):
    tensors = hf_tensors(model)
    tensors["h.0.attn.c_attn.extra"] = np.zeros(3, np.float32)
    assert_refused(tmp_path, tensors, r"model\.safetensors: unexpected tensor 'h\.0\.attn\.c_attn\.extra'")


def test_more_layers_than_config(model, tmp_path):
    assert_refused(tmp_path, hf_tensors(model), r"config\.json: n_layer=1, but .*model\.safetensors holds 2 blocks",
                   hf_config(n_layer=1))
    assert_refused(tmp_path, hf_tensors(model), r"config\.json: n_layer=3, but .*holds 2 blocks", hf_config(n_layer=3))
    tensors = hf_tensors(model)
    tensors["h.5.ln_1.weight"] = tensors.pop("h.1.ln_1.weight")
    assert_refused(tmp_path, tensors, r"n_layer=2, but .* holds 3 blocks")


def test_config_of_another_size_fails_before_allocating(model, tmp_path):
    """B12: n_layer 10**12 is refused from the tensor names, naming config.json, before any
    structure of that size is built (this would otherwise run out of memory)."""
    assert_refused(tmp_path, hf_tensors(model), r"config\.json: n_layer=1000000000000, but", hf_config(n_layer=10**12))


def test_wrong_shape(model, tmp_path):
    tensors = hf_tensors(model)
    tensors["h.0.attn.c_attn.weight"] = np.ascontiguousarray(tensors["h.0.attn.c_attn.weight"].T)
    assert_refused(tmp_path, tensors,
                   r"model\.safetensors: tensor 'h\.0\.attn\.c_attn\.weight' has shape \(24, 8\), expected \(8, 24\)")


def test_config_tensor_mismatch(model, tmp_path):
    assert_refused(tmp_path, hf_tensors(model), r"'wte\.weight' has shape \(37, 8\).*vocab_size=50257",
                   hf_config(vocab_size=50257))
    assert_refused(tmp_path, hf_tensors(model), r"'wpe\.weight'.*n_positions=1024", hf_config(n_positions=1024))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights(model, tmp_path, bad):
    tensors = hf_tensors(model)
    tensors["h.1.ln_2.bias"][5] = bad
    assert_refused(tmp_path, tensors, r"model\.safetensors: tensor 'h\.1\.ln_2\.bias' has non-finite")


def test_non_float_tensor(model, tmp_path):
    tensors = hf_tensors(model)
    tensors["ln_f.bias"] = np.zeros(8, dtype=np.int64)
    assert_refused(tmp_path, tensors, r"'ln_f\.bias' has dtype I64")


def raw_file(model, tmp_path):
    """A valid checkpoint dir; -> (file path, header dict, header length, file bytes)."""
    write_dir(tmp_path, hf_tensors(model))
    file = tmp_path / "model.safetensors"
    data = file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return file, json.loads(data[8:8 + n]), n, data


def rewrite(file, header, data, n):
    blob = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(blob)) + blob + data[8 + n:])


def test_truncated_file(model, tmp_path):
    file, header, n, data = raw_file(model, tmp_path)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    file.write_bytes(data[:-10])
    with pytest.raises(ck.CheckpointError, match=rf"model\.safetensors: truncated .*tensor '{last}'"):
        ck.load(tmp_path)
    file.write_bytes(data[:8 + n // 2])  # cut inside the header
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: truncated .*header"):
        ck.load(tmp_path)
    file.write_bytes(data[:5])
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: truncated"):
        ck.load(tmp_path)


def test_corrupt_header(model, tmp_path):
    file, header, n, data = raw_file(model, tmp_path)
    file.write_bytes(struct.pack("<Q", 9) + b"{not json" + data[8 + n:])
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: corrupt safetensors header: not JSON"):
        ck.load(tmp_path)

    h = json.loads(json.dumps(header))
    begin, end = h["wpe.weight"]["data_offsets"]
    h["wpe.weight"]["data_offsets"] = [begin, len(data)]  # beyond the data buffer
    rewrite(file, h, data, n)
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: truncated or corrupt .*'wpe\.weight'"):
        ck.load(tmp_path)

    h = json.loads(json.dumps(header))
    h["wpe.weight"]["shape"] = [11, 7]  # byte range no longer matches the shape
    rewrite(file, h, data, n)
    with pytest.raises(ck.CheckpointError, match=r"model\.safetensors: corrupt file: tensor 'wpe\.weight'"):
        ck.load(tmp_path)

    h = json.loads(json.dumps(header))
    h["wpe.weight"]["dtype"] = "F12"
    rewrite(file, h, data, n)
    with pytest.raises(ck.CheckpointError, match=r"'wpe\.weight' has unknown dtype"):
        ck.load(tmp_path)


def test_bad_config(model, tmp_path):
    write_dir(tmp_path, hf_tensors(model))
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ck.CheckpointError, match=r"config\.json: not a valid config\.json"):
        ck.load(tmp_path)
    for bad, match in [({"activation_function": "gelu"}, "activation_function 'gelu'"),
                       ({"n_inner": 7}, "n_inner=7"), ({"n_embd": None}, "missing 'n_embd'")]:
        (tmp_path / "config.json").write_text(json.dumps(hf_config(**bad)))
        with pytest.raises(ck.CheckpointError, match=rf"config\.json: {match}"):
            ck.load(tmp_path)


def test_errors_are_value_errors():
    assert issubclass(ck.CheckpointError, ValueError)


# ----------------------------------------------------------------------------- resolve

def test_resolve(model, tmp_path, monkeypatch):
    monkeypatch.setattr(ck, "WEIGHTS_DIR", tmp_path)
    assert ck.resolve(tmp_path) == tmp_path
    with pytest.raises(FileNotFoundError, match=r"make weights MODELS=gpt2-xl.*python -m specdec_np weights gpt2-xl"):
        ck.resolve("gpt2-xl")
    with pytest.raises(FileNotFoundError, match="not a known model name"):
        ck.resolve("gpt5")
    ck.save(model, tmp_path / "distilgpt2", dtype=np.float32)
    assert ck.resolve("distilgpt2") == tmp_path / "distilgpt2"
    assert_params_equal(ck.load("distilgpt2"), model)
