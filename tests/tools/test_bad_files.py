"""A file that is not what its reader expects (a checkpoint, its config.json, a trigram, the acceptance
profile, the calibration prompts) gets a one-line error naming the file and what is wrong, before any work;
files are never left half-written, also on SIGTERM."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_np import checkpoint, files, ngram
from specdec_np.tokenizer import get_encoding
from specdec_np.tools import acceptance, machine
from specdec_np.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
TARGET = files.SHIPPED_DIR / "tiny-target"
TRIGRAM = files.SHIPPED_DIR / "tiny-trigram.npz"


def one_error_line(capsys, rc, expected_rc=2) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == expected_rc and len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def checkpoint_with(tmp_path, **changes) -> Path:
    """The embedded target's weights with its config.json changed."""
    d = tmp_path / "ck"
    d.mkdir()
    shutil.copy(TARGET / checkpoint.MODEL_FILE, d)
    cfg = json.loads((TARGET / checkpoint.CONFIG_FILE).read_text())
    cfg.update(changes)
    (d / checkpoint.CONFIG_FILE).write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("changes, needle", [
    ({"n_head": 0}, "n_head=0"),  # B11: was a ZeroDivisionError
    ({"n_layer": 10**12}, "n_layer=1000000000000, but"),  # B12: was a minute, then MemoryError
    ({"n_head": -8}, "n_head=-8"),
    ({"layer_norm_epsilon": -1}, "layer_norm_epsilon=-1"),
    ({"layer_norm_epsilon": math.nan}, "NaN is not a finite number"),
    ({"n_layer": "6"}, "n_layer='6'"),
    ({"vocab_size": 8193.7}, "vocab_size=8193.7"),
    ({"n_positions": 0}, "n_positions=0"),
    ({"n_head": 7}, "not divisible by n_head=7"),
    ({"layer_norm_epsilon": 1e308}, "layer_norm_epsilon=1e+308 must be a small positive number, at most 1"),  # inf
])
def test_a_config_json_that_does_not_fit_is_named_with_its_field(tmp_path, capsys, changes, needle):
    d = checkpoint_with(tmp_path, **changes)
    rc = main(["generate", "x", "--target", str(d), "--method", "ar", "--plan", "default"])
    line = one_error_line(capsys, rc)
    assert "config.json" in line and needle in line


@pytest.mark.parametrize("args, env, needle", [
    (["--target", ""], None, "--target is empty"),
    (["--draft", " "], None, "--draft is empty"),
    (["--ngram", "", "--method", "staged"], None, "--ngram is empty"),
    ([], "nonexistent", "SPECDEC_NP_WEIGHTS='{}' does not exist"),
    ([], "", "SPECDEC_NP_WEIGHTS='' is empty"),
    ([], "file", "SPECDEC_NP_WEIGHTS='{}' is a file"),
])
def test_an_empty_option_or_weights_variable_is_named(tmp_path, capsys, monkeypatch, args, env, needle):
    if env is not None:
        value = {"nonexistent": str(tmp_path / "nowhere"), "": "", "file": str(TRIGRAM)}[env]
        monkeypatch.setenv(files.WEIGHTS_ENV, value)
        monkeypatch.setattr(checkpoint, "WEIGHTS_DIR", Path(value))  # as the variable sets it when imported
        needle = needle.format(value)
    rc = main(["generate", "x", "--plan", "default", *args])
    assert needle in one_error_line(capsys, rc)


@pytest.mark.parametrize("name", ["tiny-target", "tiny-draft"])
@pytest.mark.parametrize("lacking", [checkpoint.CONFIG_FILE, checkpoint.MODEL_FILE])
def test_a_weights_directory_whose_checkpoint_lacks_a_file_names_the_file(tmp_path, capsys, monkeypatch, name, lacking):
    for item in files.SHIPPED_DIR.iterdir():  # the shipped weights, `name` without the file `lacking`
        (tmp_path / "w" / item.name).parent.mkdir(exist_ok=True)
        (tmp_path / "w" / item.name).symlink_to(item)
    (tmp_path / "w" / name).unlink()
    (tmp_path / "w" / name).mkdir()
    kept = ({checkpoint.CONFIG_FILE, checkpoint.MODEL_FILE} - {lacking}).pop()
    (tmp_path / "w" / name / kept).symlink_to(files.SHIPPED_DIR / name / kept)
    monkeypatch.setenv(files.WEIGHTS_ENV, str(tmp_path / "w"))
    monkeypatch.setattr(checkpoint, "WEIGHTS_DIR", tmp_path / "w")  # as the variable sets it when imported
    rc = main(["generate", "x", "--plan", "default", "--method", "speculative"])
    missing = tmp_path / "w" / name / lacking
    assert one_error_line(capsys, rc) == (f"error: {missing}: checkpoint '{name}' has no {lacking} (a checkpoint "
                                          "directory needs config.json and model.safetensors)")


@pytest.mark.parametrize("sources, needle", [
    (["/dev/zero"], "SPECDEC_NP_NGRAM_SOURCES: not regular files: /dev/zero is not a regular file (a device)"),
    (["{tmp}/a.py", "{tmp}/b.py"], "not regular files: {tmp}/a.py (No such file or directory), {tmp}/b.py (No such"),
])
def test_ngram_sources_that_are_not_files_are_named(tmp_path, monkeypatch, sources, needle):
    from specdec_np.tools import stdlib_ngram
    monkeypatch.setenv(stdlib_ngram.SOURCES_ENV, os.pathsep.join(s.format(tmp=tmp_path) for s in sources))
    monkeypatch.setattr(stdlib_ngram, "build", lambda *a: pytest.fail("read"))
    with pytest.raises(ValueError) as e:
        stdlib_ngram.stdlib_trigram(50257)
    assert needle.format(tmp=tmp_path) in str(e.value)


# ----------------------------------------------------------------------------- safetensors

def write_raw(path, header: dict, data: bytes) -> Path:
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    return path


@pytest.mark.parametrize("header, data, needle", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(8) + b"garbage",
     "7 bytes after the last tensor's data"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8),
     "tensor 'b' (bytes 4..8) overlaps tensor 'a'"),
    ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8), "leaves bytes 0..4 unused"),
])
def test_a_safetensors_file_whose_ranges_do_not_tile_its_data_is_refused(tmp_path, header, data, needle):
    path = write_raw(tmp_path / "model.safetensors", header, data)
    with pytest.raises(checkpoint.CheckpointError, match="model.safetensors: corrupt file") as e:
        checkpoint.read_header(path)
    assert needle in str(e.value)


def test_wpe_read_from_wtes_bytes_is_refused(tmp_path):
    # The embedded draft's file with wpe pointed at wte's first bytes: shapes fine, data shared.
    src = files.SHIPPED_DIR / "tiny-draft" / checkpoint.MODEL_FILE
    header, start = checkpoint.read_header(src)
    raw = src.read_bytes()
    meta = json.loads(raw[8:start])
    wpe = next(k for k in meta if k.endswith("wpe.weight"))
    wte = next(k for k in meta if k.endswith("wte.weight"))
    size = meta[wpe]["data_offsets"][1] - meta[wpe]["data_offsets"][0]
    meta[wpe]["data_offsets"] = [meta[wte]["data_offsets"][0], meta[wte]["data_offsets"][0] + size]
    path = write_raw(tmp_path / "model.safetensors", meta, raw[start:])
    with pytest.raises(checkpoint.CheckpointError, match="overlaps|unused"):
        checkpoint.read_header(path)


# ----------------------------------------------------------------------------- trigram files

def trigram_arrays():
    with np.load(TRIGRAM) as z:
        return dict(z)


def spoil(name, how):
    def change(a):
        a[name] = how(a[name])
    return change


@pytest.mark.parametrize("change, needle", [
    (spoil("bi_len", lambda x: -x.astype(np.int64)), "bi_len"),  # B13: was an IndexError
    (spoil("bi_len", lambda x: -x), "bi_tok and bi_count"),  # unsigned: wraps around
    (spoil("tri_tok", lambda x: x[:-5]), "tri_tok and tri_count"),
    (spoil("version", lambda x: np.array("x")), "version 'x'"),
    (spoil("tri_tok", lambda x: x.astype(np.int64) + 10**6), "tri_tok holds token id"),
    (spoil("tri_count", lambda x: -x.astype(np.int64)), "tri_count must be"),
    (spoil("bi_count", lambda x: np.zeros_like(x)), "bi_count must be a 1-D array of integers >= 1"),
    (spoil("katz_k", lambda x: np.array(0)), "katz_k must be an integer >= 1"),
    (spoil("tri_tok", lambda x: x.astype(np.float64)), "tri_tok must be a 1-D array of integers"),
    (spoil("tri_ctx", lambda x: x[::-1].copy()), "tri_ctx must be increasing"),
    (spoil("bi_discount", lambda x: x[:2]), "bi_discount must be"),
    (spoil("tri_ctx_count", lambda x: np.ones_like(x)), "tri_ctx_count must be at least"),
])
def test_a_trigram_file_that_is_not_what_fit_writes_is_named(tmp_path, change, needle):
    arrays = trigram_arrays()
    change(arrays)
    path = tmp_path / "spoiled.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match="spoiled.npz") as e:
        ngram.load(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_shipped_trigram_passes_its_own_check():
    ngram.load(TRIGRAM)  # the negative control: the check refuses only what fit could not write


# ----------------------------------------------------------------------------- profile and calibration prompts

@pytest.mark.parametrize("text", ["[]", "", "{not json", '{"format": "specdec_np.profile", "version": 2}',
                                  '{"format": "specdec_np.profile", "version": 2, "settings": {"greedy": [{}], '
                                  '"sampled": []}}'])
def test_a_profile_that_is_not_one_is_named(tmp_path, text):
    path = tmp_path / "profile.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="profile.json: not a valid acceptance profile") as e:
        acceptance.load(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("text, needle", [("", "no prompts"), ("\n\n", "no prompts"),
                                          ('{"prompt": "def f():"}\ngarbage\n', "line 2"),
                                          ('{"prompt": ""}\n', "line 1"), ("[1]\n", "line 1")])
def test_calibration_prompts_that_are_not_are_named(tmp_path, text, needle):
    path = tmp_path / "calibration.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match="calibration.jsonl") as e:
        acceptance.calibration_prompts(get_encoding(8193), path)
    assert needle in str(e.value)


@pytest.mark.parametrize("path", ["/dev/zero", "fifo"])
def test_bench_prompts_that_never_end_are_refused_unread(tmp_path, path):
    if path == "fifo":  # open() would block until something writes to it
        os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="not a regular file .*give a JSONL file"):
        acceptance.read_prompts(tmp_path / path)


def test_profile_and_prompts_are_read_from_the_weights_directory_else_the_shipped_ones(tmp_path, monkeypatch):
    # B15: SPECDEC_NP_WEIGHTS moves them too; a directory without them falls back to the shipped files.
    monkeypatch.setattr(files, "WEIGHTS_DIR", tmp_path)
    assert files.weights_file("profile.json") == files.SHIPPED_DIR / "profile.json"
    (tmp_path / "profile.json").write_text("[]")
    assert files.weights_file("profile.json") == tmp_path / "profile.json"
    with pytest.raises(ValueError, match=str(tmp_path / "profile.json")):
        acceptance.load(files.weights_file("profile.json"))
    assert acceptance.PROFILE_FILE == files.SHIPPED_DIR / "profile.json"  # read once, when the tools load


# ----------------------------------------------------------------------------- SIGTERM

def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    # What `ngram fit --out` (and every cache and page) writes goes through atomic_file.
    script = ("import os, signal, sys; from specdec_np.files import atomic_file\n"
              "with atomic_file(sys.argv[1]) as f:\n"
              "    f.write(b'half')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    f.write(b'never')\n")
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.npz")], cwd=ROOT, timeout=60)
    assert r.returncode == 143 and list(tmp_path.iterdir()) == []


def test_a_bad_weights_variable_is_named_when_only_the_tokenizer_reads_it(tmp_path):
    # The variable is read when specdec_np is imported: a process of its own. The target is a path,
    # so only the tokenizer's BPE files are looked up in the weights directory.
    env = dict(os.environ, SPECDEC_NP_WEIGHTS=str(tmp_path / "nowhere"))
    r = subprocess.run([sys.executable, "-m", "specdec_np", "generate", "x", "--target", str(TARGET), "--plan",
                        "default"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: SPECDEC_NP_WEIGHTS='{tmp_path / 'nowhere'}' does not exist: it must name the weights directory "
        f"(unset it to use {files.SHIPPED_DIR})")


# ----------------------------------------------------------------------------- files that are not regular files
# Issue 58: a directory, a device, a FIFO, a dangling link or a symlink loop in place of a file was "no
# model.safetensors" / "does not exist"; each is now named as what it is, before anything opens it.

KINDS = {"directory": "is a directory", "fifo": "(a fifo)", "device": "(a device)",
         "dangling": "a dangling symlink to", "loop": "(a symlink loop)"}


def make_not_a_file(path: Path, kind: str) -> Path:
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to({"device": Path("/dev/zero"), "dangling": path.parent / "nowhere", "loop": path}[kind])
    return path


def read_checkpoint_with(tmp_path, name):
    for file in (checkpoint.CONFIG_FILE, checkpoint.MODEL_FILE):
        if file != name:
            (tmp_path / file).symlink_to(TARGET / file)
    checkpoint.load(tmp_path)


def read_tokenizer_with(tmp_path, name):
    for file in ("vocab.bpe", "encoder.json"):
        if file != name:
            (tmp_path / file).symlink_to(files.SHIPPED_DIR / file)
    get_encoding(1000, bpe_dir=tmp_path)


READERS = {"config.json": read_checkpoint_with, "model.safetensors": read_checkpoint_with,
           "vocab.bpe": read_tokenizer_with, "encoder.json": read_tokenizer_with,
           "trigram.npz": lambda d, name: ngram.load(d / name)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", READERS)
def test_a_file_that_is_not_a_regular_file_is_named_as_what_it_is(tmp_path, name, kind):
    make_not_a_file(tmp_path / name, kind)
    with pytest.raises((ValueError, OSError)) as e:
        READERS[name](tmp_path, name)
    message = str(e.value)
    assert str(tmp_path / name) in message and KINDS[kind] in message.lower() and "\n" not in message, message


@pytest.mark.parametrize("kind", ["device", "loop", "fifo", "dangling", "directory"])
def test_a_broken_shipped_profile_is_named_not_profiled_again(tmp_path, monkeypatch, kind):
    monkeypatch.setattr(acceptance, "PROFILE_FILE", make_not_a_file(tmp_path / "profile.json", kind))
    with pytest.raises(ValueError, match=f"{tmp_path / 'profile.json'}: not a valid acceptance profile: ") as e:
        acceptance.shipped()
    assert KINDS[kind] in str(e.value).lower()
    monkeypatch.setattr(acceptance, "PROFILE_FILE", tmp_path / "none.json")  # none shipped: profiled on first use
    assert acceptance.shipped() is None


# ----------------------------------------------------------------------------- JSON nested, repeated, not finite

DEEP = "[" * 100_000 + "]" * 100_000


def test_json_nested_100000_levels_is_one_line_in_every_reader(tmp_path):
    from specdec_np.tools import cache, calibration
    (tmp_path / "config.json").write_text(DEEP)
    (tmp_path / "profile.json").write_text(DEEP)
    (tmp_path / "calibration.jsonl").write_text('{"prompt": "x"}\n' + DEEP + "\n")
    write_raw(tmp_path / "model.safetensors", {}, b"")
    (tmp_path / "model.safetensors").write_bytes(len(DEEP).to_bytes(8, "little") + DEEP.encode())
    for read, needle in ((lambda: checkpoint.read_config(tmp_path / "config.json"), "config.json: not a valid"),
                         (lambda: checkpoint.read_header(tmp_path / "model.safetensors"), "corrupt safetensors header"),
                         (lambda: acceptance.load(tmp_path / "profile.json"), "not a valid acceptance profile"),
                         (lambda: acceptance.read_prompts(tmp_path / "calibration.jsonl"), "calibration.jsonl: line 2")):
        with pytest.raises(ValueError, match=needle) as e:
            read()
        assert "nested deeper than 32 levels" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "costs.json").write_text(DEEP)  # a cost cache that cannot be read is measured again
    assert cache.read_json(tmp_path / "costs.json") is None and calibration.problem(None, True)


@pytest.mark.parametrize("text, needle", [('{"a": 1, "a": 2}', "the key 'a' appears twice"),
                                          ('{"n_embd": NaN}', "NaN is not a finite number"),
                                          ('{"n_embd": 1e999}', "1e999 is not a finite number"),
                                          ('{"n_embd": Infinity}', "Infinity is not a finite number")])
def test_json_that_python_would_accept_but_json_does_not_is_named(tmp_path, text, needle):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(checkpoint.CheckpointError, match="config.json: not a valid config.json: " + needle):
        checkpoint.read_config(tmp_path / "config.json")


# ----------------------------------------------------------------------------- safetensors headers

F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("entry, needle", [
    (dict(F32_2, dtype=["F32"]), "unknown dtype ['F32']"),  # was TypeError: unhashable type
    (dict(F32_2, data_offsets=[0.0, 8.0]), "corrupt safetensors header entry for tensor 'a'"),  # floats were taken
    (dict(F32_2, data_offsets=["0", "8"]), "corrupt safetensors header entry for tensor 'a'"),  # strings too
    (dict(F32_2, shape=[True, 2]), "corrupt safetensors header entry for tensor 'a'"),
    (dict(F32_2, extra=1), "corrupt safetensors header entry for tensor 'a'"),
    # 2**32 * 2**32 elements overflow int64 to 0: the 0 bytes of data_offsets [0, 0] passed the byte count
    ({"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]}, "of shape (4294967296, 4294967296) (F32) has 0"),
])
def test_a_safetensors_entry_of_the_wrong_kinds_is_refused(tmp_path, entry, needle):
    data = bytes(entry["data_offsets"][1]) if whole_offsets(entry) else bytes(8)
    path = write_raw(tmp_path / "model.safetensors", {"a": entry}, data)
    with pytest.raises(checkpoint.CheckpointError, match="model.safetensors") as e:
        checkpoint.read_header(path)
    assert needle in str(e.value) and "\n" not in str(e.value)
    checkpoint.read_header(write_raw(tmp_path / "ok.safetensors", {"a": F32_2}, bytes(8)))  # the negative control


def whole_offsets(entry) -> bool:
    return all(type(x) is int for x in entry["data_offsets"])


def test_a_tensor_named_twice_in_a_header_is_refused(tmp_path):
    blob = ('{"a": %s, "a": %s}' % (json.dumps(F32_2), json.dumps(F32_2))).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + bytes(8))  # json.loads kept the last one, silently
    with pytest.raises(checkpoint.CheckpointError, match="the key 'a' appears twice"):
        checkpoint.read_header(path)


def test_a_model_larger_than_memory_is_refused_before_anything_is_allocated(tmp_path):
    # A consistent checkpoint of n_embd 131072 (a sparse file of 412 GB in float16): its size is compared with the
    # memory available, naming both, before its parameters are allocated (was a MemoryError after 19 s).
    config = checkpoint.GPT2Config(n_vocab=257, n_ctx=8, n_embd=131072, n_layer=1, n_head=1)
    shapes = {name: shape for name, (_, shape) in checkpoint.param_shapes(config).items()}
    need = 4 * sum(math.prod(s) for s in shapes.values())
    if machine.available_memory() >= need:
        pytest.skip("this machine has the memory to load it")
    header, at = {}, 0
    for name, shape in shapes.items():
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [at, at + 2 * math.prod(shape)]}
        at += 2 * math.prod(shape)
    write_raw(tmp_path / "model.safetensors", header, b"")
    os.truncate(tmp_path / "model.safetensors", (tmp_path / "model.safetensors").stat().st_size + at)
    (tmp_path / "config.json").write_text(json.dumps(checkpoint.hf_config(config)))
    with pytest.raises(checkpoint.CheckpointError, match=r"model.safetensors: the model \(n_embd=131072, n_layer=1\) "
                                                         rf"needs {need / 1e9:.1f} GB for its parameters, more than "
                                                         r"the [0-9.]+ GB of memory available"):
        machine.load_model(tmp_path)  # the tools' loader (the core reads no machine file)


# ----------------------------------------------------------------------------- profile records and cost caches

def shipped_profile_json() -> dict:
    return json.loads(acceptance.PROFILE_FILE.read_text())


def first_greedy(data, **changes):
    data["settings"]["greedy"][0].update(changes)
    return data


@pytest.mark.parametrize("change, needle", [
    (lambda d: first_greedy(d, speed=1), "greedy record 1: unknown key 'speed'"),  # was TypeError from Plan
    (lambda d: first_greedy(d, shape={"chains": 3}), "greedy record 1: unknown key 'chains'"),
    (lambda d: first_greedy(d, tokens=10**300), "greedy record 1: a count record needs"),  # printed as a speedup
    (lambda d: first_greedy(d, target={"cold": {}, "warm": {"0": 1}}), "greedy record 1: a count record's 'target'"),
    (lambda d: first_greedy(d, target={"cold": {}, "warm": {"1" + "0" * 30: 1}}), "greedy record 1: a count record's"),
    (lambda d: first_greedy(d, method="speculative", shape={"chain": 0}), "greedy record 1: "),  # no Plan
    (lambda d: {**d, "settings": {"greedy": [r for r in d["settings"]["greedy"] if r["method"] != "ar"]}},
     "the greedy setting has no plain-decoding (ar) record"),  # was StopIteration
])
def test_a_profile_record_that_is_not_one_is_named_with_its_setting_and_index(tmp_path, change, needle):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(change(shipped_profile_json())))
    with pytest.raises(ValueError, match=f"{path}: not a valid acceptance profile: ") as e:
        acceptance.load(path)
    assert needle in str(e.value) and "\n" not in str(e.value)
    path.write_text(json.dumps(shipped_profile_json()))
    assert acceptance.load(path)["settings"]  # the negative control: as shipped, it loads


def costs_json() -> dict:
    from specdec_np.tools.costmodel import OVERHEADS
    curve = {"1": 2.0, "2": 2.5, "4": 3.0}
    return {"layout": {"target": 0, "draft": 0},
            "curves": {m: {"warm": dict(curve), "cold": dict(curve)} for m in ("target", "draft")},
            "overheads": {s: {n: 0.1 for n in OVERHEADS} for s in acceptance.SETTINGS}}


@pytest.mark.parametrize("change, part", [
    (lambda c: c["curves"]["target"]["warm"].update({"2": 1e308}), "curves"),  # "predicted infx plain decoding"
    (lambda c: c["curves"]["target"]["warm"].update({"2": 1e-9}), "curves"),
    (lambda c: c["curves"]["draft"].update(warm={"1": 2.0}), "curves"),  # one point
    (lambda c: c["curves"]["target"]["cold"].update({"0": 2.0}), "curves"),  # block size 0
    (lambda c: c["curves"]["target"]["warm"].update({"1" + "0" * 30: 9.0}), "curves"),  # generate looped on it
    (lambda c: c["overheads"]["greedy"].update(step=1e300), "overheads"),
])
def test_a_cost_cache_out_of_range_is_measured_again(change, part):
    from specdec_np.tools import calibration
    costs = costs_json()
    assert calibration.problem(costs, True) == ""  # the negative control
    change(costs)
    assert calibration.problem(json.loads(json.dumps(costs)), True) == f"its {part} out of range"


def test_bench_prompts_over_generates_cap_are_refused_before_tokenizing(tmp_path, monkeypatch):
    # A 30 MB prompt took 1.7 GB to keep 500 tokens; here the cap is lowered to keep the test small.
    monkeypatch.setattr(acceptance, "PROMPT_MAX_BYTES", 1 << 20)
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "short"}) + "\n" + json.dumps({"prompt": "x" * (1 << 20)}) + "\n")
    with pytest.raises(ValueError, match=f"{path}: line 2: the prompt is over 1 MB, more than specdec_np reads"):
        acceptance.read_prompts(path)


def test_every_file_is_read_up_to_a_bound_on_its_size(tmp_path, monkeypatch, capsys):
    """Each reader reads a regular file up to its bound (`files.read_regular`), here lowered to 1 MB to keep the test
    small: a trigram, a prompts file (also once gunzipped: a small .gz that inflates past it), a text `ngram fit`
    reads, each refused in one line naming it. The control: the same files just under the bound are read."""
    import gzip

    from specdec_np import ngram_file
    from specdec_np.tools import cli

    for module, name in ((ngram_file, "MAX_BYTES"), (acceptance, "PROMPTS_MAX_BYTES"), (cli, "TEXT_MAX_BYTES")):
        monkeypatch.setattr(module, name, 1 << 20)
    big, line = tmp_path / "big", json.dumps({"prompt": "x" * 1000}) + "\n"
    (tmp_path / "big.jsonl").write_text(line * ((1 << 20) // len(line) + 1))
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress((tmp_path / "big.jsonl").read_bytes()))
    big.write_bytes(b"x" * ((1 << 20) + 1))
    with pytest.raises(ValueError, match=f"n-gram model file {big} is over 1 MB, more than specdec_np reads"):
        ngram.load(big)
    with pytest.raises(ValueError, match=f"{tmp_path / 'big.jsonl'} is over 1 MB, more than specdec_np reads"):
        acceptance.read_prompts(tmp_path / "big.jsonl")
    with pytest.raises(ValueError, match=f"{tmp_path / 'big.jsonl.gz'} is over 1 MB gunzipped"):
        acceptance.read_prompts(tmp_path / "big.jsonl.gz")
    err = one_error_line(capsys, main(["ngram", "fit", str(big), "--out", str(tmp_path / "t.npz")]))
    assert err == f"error: text file {big} is over 1 MB, more than specdec_np reads of such a file"
    # The control: a byte less is read (and found not to be a trigram, or fitted on).
    big.write_bytes(b"x" * (1 << 20))
    with pytest.raises(ValueError, match=f"{big} is not a specdec_np n-gram model"):
        ngram.load(big)
    (tmp_path / "ok.jsonl").write_text(line * ((1 << 20) // len(line) - 1))
    assert len(acceptance.read_prompts(tmp_path / "ok.jsonl")) == (1 << 20) // len(line) - 1
    assert main(["ngram", "fit", str(big), "--out", str(tmp_path / "t.npz"), "--n-vocab", "300"]) == 0
