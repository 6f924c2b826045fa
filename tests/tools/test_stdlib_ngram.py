"""Real GPT-2 without hand steps: a target with GPT-2's full vocabulary gets a trigram fitted on
Python's own sources, built once and cached, with no --ngram and nothing downloaded.

The builds here fit a few small standard-library files (SPECDEC_NP_NGRAM_SOURCES, or `files=`),
into a temporary cache directory: the full standard library takes seconds, not needed to test it.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from specdec_np import checkpoint, ngram
from specdec_np.gpt2 import GPT2Config, random_params
from specdec_np.tools import stdlib_ngram

ROOT = Path(__file__).resolve().parents[2]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
FEW = [STDLIB / "bisect.py", STDLIB / "colorsys.py", STDLIB / "keyword.py"]  # small, and in every CPython
GPT2_VOCAB = 50257
SMALL_GPT2 = GPT2Config(n_vocab=GPT2_VOCAB, n_ctx=64, n_embd=16, n_layer=1, n_head=2)  # GPT-2's layout, tiny


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty user cache directory of its own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "specdec_np"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A random target and draft saved in GPT-2's layout, with GPT-2's 50257-token vocabulary."""
    root = tmp_path_factory.mktemp("gpt2-layout")
    checkpoint.save(random_params(SMALL_GPT2, seed=1), root / "target")
    checkpoint.save(random_params(SMALL_GPT2, seed=2), root / "draft")
    return root


def test_the_sources_are_the_standard_librarys_code_without_tests_or_packages(monkeypatch):
    monkeypatch.delenv(stdlib_ngram.SOURCES_ENV, raising=False)
    files = stdlib_ngram.source_files()
    assert len(files) > 100 and files == sorted(files) and STDLIB / "bisect.py" in files
    assert all(f.suffix == ".py" and f.is_relative_to(STDLIB) for f in files)
    assert not any({"test", "tests", "site-packages"} & set(f.relative_to(STDLIB).parts[:-1]) for f in files)
    monkeypatch.setenv(stdlib_ngram.SOURCES_ENV, os.pathsep.join(map(str, FEW)))
    assert stdlib_ngram.source_files() == FEW


def test_built_once_cached_atomically_and_reused(cache, monkeypatch, capsys):
    calls = []
    model = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, progress=lambda done, total: calls.append((done, total)),
                                        files=FEW)
    assert model.n_vocab == GPT2_VOCAB and len(model.tri_tok) > 100
    assert calls[-1] == (len(FEW) + 1, len(FEW) + 1) and len(calls) == len(FEW) + 1  # per file, then the fit
    err = capsys.readouterr().err
    assert f"building a Katz trigram for this tokenizer ({GPT2_VOCAB} tokens) from the 3 .py files" in err
    assert f"cached in {cache}" in err
    [saved] = list(cache.iterdir())  # one file, no temporary left beside it
    assert saved.name.startswith(f"trigram-{GPT2_VOCAB}-") and saved.suffix == ".npz"
    # The same tokens as `ngram fit` would count: each file after an end-of-text token.
    enc_tokens = []
    from specdec_np.tokenizer import get_encoding
    enc = get_encoding(GPT2_VOCAB)
    for f in FEW:
        enc_tokens += [enc.eot_token] + enc.encode_ordinary(f.read_text(encoding="utf-8"))
    assert int(model.counts["uni_count"].sum()) == len(enc_tokens)

    # Reused: no second build, no message.
    monkeypatch.setattr(stdlib_ngram, "build", lambda *a, **k: pytest.fail("built twice"))
    again = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=FEW)
    assert capsys.readouterr().err == "" and np.array_equal(again.tri_tok, model.tri_tok)


def test_the_key_follows_the_tokenizer_and_the_sources(cache, tmp_path):
    a = stdlib_ngram.cache_file(GPT2_VOCAB, FEW)
    assert a == stdlib_ngram.cache_file(GPT2_VOCAB, list(FEW)) and a.parent == cache
    assert stdlib_ngram.cache_file(8193, FEW) != a  # another vocabulary
    assert stdlib_ngram.cache_file(GPT2_VOCAB, FEW[:2]) != a  # other files
    copy = tmp_path / "bisect.py"
    copy.write_text(FEW[0].read_text())
    before = stdlib_ngram.cache_file(GPT2_VOCAB, [copy])
    copy.write_text(FEW[0].read_text() + "\n# changed\n")  # the same file, edited
    assert stdlib_ngram.cache_file(GPT2_VOCAB, [copy]) != before


def test_a_damaged_cache_file_is_built_again(cache, capsys):
    path = stdlib_ngram.cache_file(GPT2_VOCAB, FEW)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"cut short")
    model = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=FEW)
    assert "building a Katz trigram" in capsys.readouterr().err
    assert ngram.load(path).n_vocab == model.n_vocab == GPT2_VOCAB


def test_no_text_to_fit_says_what_to_pass(cache, tmp_path):
    with pytest.raises(ValueError, match="no Python sources .* pass one with --ngram FILE"):
        stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=[])
    (tmp_path / "latin1.py").write_bytes(b"x = '\xe9'\n")  # skipped: not UTF-8
    with pytest.raises(ValueError, match="no text to fit a trigram on: pass one with --ngram FILE"):
        stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=[tmp_path / "latin1.py"])
    assert not list(cache.glob("*.npz"))


def run_generate(args, cache_home):
    env = dict(os.environ, XDG_CACHE_HOME=str(cache_home), NO_COLOR="1")
    env[stdlib_ngram.SOURCES_ENV] = os.pathsep.join(map(str, FEW))
    return subprocess.run([sys.executable, "-m", "specdec_np", "generate", "def f(x):", "--max-new-tokens", "6",
                           *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_a_gpt2_layout_checkpoint_decodes_staged_with_no_ngram_given(checkpoints, tmp_path):
    # The acceptance path: --target DIR --draft DIR --method staged, no --ngram, offline.
    pair = ["--target", str(checkpoints / "target"), "--draft", str(checkpoints / "draft"), "--method", "staged",
            "--plan", "default"]
    first = run_generate(pair + ["--stats"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("def f(x):") and "building a Katz trigram" in first.stderr
    assert "method staged:" in first.stderr
    cached = list((tmp_path / "specdec_np").glob(f"trigram-{GPT2_VOCAB}-*.npz"))
    assert len(cached) == 1
    second = run_generate(pair, tmp_path)  # reused: nothing built, the same text
    assert second.returncode == 0 and "building" not in second.stderr and second.stdout == first.stdout
    # --ngram still overrides it.
    mine = tmp_path / "mine.npz"
    ngram.save(ngram.fit(np.arange(200) % 50, GPT2_VOCAB), mine)
    third = run_generate(pair + ["--ngram", str(mine)], tmp_path / "other-cache")
    assert third.returncode == 0 and "building" not in third.stderr, third.stderr
    assert not (tmp_path / "other-cache").exists()


def test_the_machines_plan_is_chosen_with_the_built_trigram(checkpoints, cache, monkeypatch):
    # Without --method the machine's plan may pick staged: the pair is profiled with the trigram.
    import argparse

    from specdec_np.plan import Plan
    from specdec_np.tools import choice, cli

    monkeypatch.setenv(stdlib_ngram.SOURCES_ENV, os.pathsep.join(map(str, FEW)))
    seen = {}

    def plans_for(target, draft, trigram, enc, temperature, methods, *rest, **kw):
        seen["ngram"] = trigram
        return {m: choice.Choice("staged", Plan(), 1.0, 2.0) for m in methods}

    monkeypatch.setattr(cli, "choose", plans_for)
    parser = argparse.ArgumentParser()
    cli.add_generate_args(parser)
    a = parser.parse_args(["def f(x):", "--target", str(checkpoints / "target"), "--draft", str(checkpoints / "draft")])
    s = cli.setup(a)
    assert s.method == "staged" and s.ngram is seen["ngram"] and s.ngram.n_vocab == GPT2_VOCAB


def test_a_cache_file_that_loads_but_is_not_valid_is_built_again(cache, capsys):
    # B13: a trigram whose bi_len went negative raised IndexError and was never rebuilt.
    path = stdlib_ngram.cache_file(GPT2_VOCAB, FEW)
    path.parent.mkdir(parents=True)
    ngram.save(ngram.fit(np.arange(50) % 7, GPT2_VOCAB), path)
    with np.load(path) as z:
        arrays = dict(z)
    arrays["bi_len"] = -arrays["bi_len"].astype(np.int64)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    model = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=FEW)
    assert "building a Katz trigram" in capsys.readouterr().err
    assert ngram.load(path).n_vocab == model.n_vocab == GPT2_VOCAB


def test_a_cached_trigram_of_another_vocabulary_names_the_cache_file_not_ngram(cache, capsys):
    # No --ngram was given: the message names the cache file, and the trigram is built again.
    path = stdlib_ngram.cache_file(GPT2_VOCAB, FEW)
    path.parent.mkdir(parents=True)
    ngram.save(ngram.fit(np.arange(50) % 7, 8193), path)
    model = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=FEW)
    err = capsys.readouterr().err
    assert f"note: the cached trigram {path} is not valid (its vocabulary is 8193 tokens, not {GPT2_VOCAB})" in err
    assert "--ngram" not in err and ngram.load(path).n_vocab == model.n_vocab == GPT2_VOCAB


@pytest.mark.parametrize("fault", ["directory", "read-only"])
def test_a_cache_that_cannot_be_written_runs_without_it_in_one_line(cache, capsys, monkeypatch, fault):
    # B14: the trigram is built and used; one line names the path and why it is not cached.
    path = stdlib_ngram.cache_file(GPT2_VOCAB, FEW)
    if fault == "directory":
        path.mkdir(parents=True)
    else:  # a read-only cache directory (root writes anywhere: the refusal is substituted)
        def refused(model, to):
            raise PermissionError(13, "Permission denied", str(to))
        monkeypatch.setattr(stdlib_ngram.ngram, "save", refused)
    model = stdlib_ngram.stdlib_trigram(GPT2_VOCAB, files=FEW)
    notes = [line for line in capsys.readouterr().err.splitlines() if "not cached" in line]
    assert model.n_vocab == GPT2_VOCAB and len(notes) == 1 and f"({path}: " in notes[0], notes
