"""Bad input gets a one-line error naming the argument, and the statistics follow from what was emitted."""

import dataclasses
import errno
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import models_for
from specdec_np import eagle, ngram
from specdec_np.decode import generate
from specdec_np.fastpath import laid_out
from specdec_np.gpt2 import GPT2, GPT2Config, map_params, random_params
from specdec_np.methods import METHODS
from specdec_np.plan import Plan
from specdec_np.tools import download
from specdec_np.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
CFG = GPT2Config(n_vocab=24, n_ctx=40, n_embd=16, n_layer=1, n_head=2)


@pytest.fixture(scope="module")
def models():
    target = random_params(CFG, seed=5, dtype=np.float64, scale=0.5)
    noise = np.random.default_rng(1)
    draft = GPT2(CFG, map_params(lambda a: a + noise.normal(0, 0.05, a.shape), target.params))
    # The trigram sees the target's own repetitive text, so stage 2's guesses and copies happen.
    trigram = ngram.fit(np.tile(np.arange(6), 50), CFG.n_vocab)
    return target, draft, trigram


def cli(capsys, *args):
    """`python -m specdec_np ARGS` run in this process, from the repository root, as (returncode, stdout, stderr):
    the same handler as the process's (whose start the tests below need not pay for)."""
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(list(args))
    except SystemExit as e:
        code = e.code
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


@pytest.mark.parametrize("args, needle", [
    (["--method", "tree", "--widths", "100,100"], "10100 tokens per step (--widths 100,100)"),
    (["--method", "tree", "--budget", "5000"], "5000 tokens per step (--budget 5000)"),
    (["--method", "speculative", "--depth", "600"], "600 tokens per step (--depth 600)"),
    (["--depth", "0"], "--depth must be an integer >= 1"), (["--depth", "-1"], "--depth must be an integer >= 1"),
    (["--budget", "0"], "--budget must be an integer >= 1"), (["--budget", "-5"], "--budget must be an integer >= 1"),
    (["--seed", "-1"], "--seed must be >= 0"), (["--top-k", "0"], "--top-k 0 must be an integer >= 1"),
    (["--top-p", "0", "--temperature", "1"], "--top-p 0.0 must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature -1.0 must be"),
    (["--copy-len", "2000"], "--copy-len 2000) exceed"),
    (["--ngram", "weights/README.md"], "is not a specdec_np n-gram model"),
    (["--target", "no/such/dir"], "no checkpoint directory"),
])
def test_generate_rejects_bad_options_in_one_line(args, needle, capsys):
    r = cli(capsys, "generate", "x", "--plan", "default", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "pickle" not in lines[0]


def test_a_target_without_a_known_draft_asks_for_one(tmp_path, capsys):
    from specdec_np import checkpoint

    checkpoint.save(random_params(GPT2Config(n_vocab=8193, n_ctx=32, n_embd=8, n_layer=1, n_head=2)), tmp_path / "mine")
    r = cli(capsys, "generate", "x", "--plan", "default", "--method", "tree", "--target", str(tmp_path / "mine"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no default draft model for --target" in lines[0], r.stderr
    assert "--draft" in lines[0]
    r = cli(capsys, "generate", "x", "--plan", "default", "--method", "ar", "--target", str(tmp_path / "mine"),
            "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr  # plain decoding needs no draft


def test_prompt_that_is_not_utf8_is_refused_from_stdin_and_file(tmp_path, capsys, monkeypatch):
    bad = b"def f():\n    return '\xff\xfe'\n"
    (tmp_path / "bad.py").write_bytes(bad)
    for args, stdin in ((["-"], bad), (["--file", str(tmp_path / "bad.py")], None)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin or b"")))
        r = cli(capsys, "generate", *args, "--plan", "default")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "is not UTF-8 text" in lines[0], r.stderr


def test_a_prompt_file_that_cannot_be_read_is_named_in_one_line(tmp_path, capsys):
    for path, reason in ((tmp_path / "missing.py", "No such file"), (tmp_path, "Is a directory")):
        r = cli(capsys, "generate", "--file", str(path), "--plan", "default")
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert lines[0].startswith(f"error: --file {path}: ") and reason in lines[0]


def test_the_embedded_target_by_path_gets_the_embedded_draft_and_the_context_end_is_said(capsys):
    r = cli(capsys, "generate", "def f(x):", "--target", "specdec_np/weights/tiny-target", "--plan", "default",
            "--max-new-tokens", "4")
    assert r.returncode == 0 and r.stdout.startswith("def f(x):"), r.stderr
    r = cli(capsys, "generate", "x", "--method", "ar", "--plan", "default", "--max-new-tokens", "600")
    assert r.returncode == 0 and "end of the target's context (512 tokens)" in r.stderr


@pytest.mark.parametrize("kw, error, needle", [
    (dict(prompt="def f(x):"), TypeError, "token ids, not text"),
    (dict(prompt=[1.5]), TypeError, "integer token ids"),
    (dict(prompt=[1, True]), TypeError, "integer token ids, got True"),
    (dict(prompt=[1, None]), TypeError, "integer token ids, got None"),
    (dict(max_new_tokens=None), ValueError, "max_new_tokens"),
    (dict(seed="abc"), ValueError, "seed"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(plan={"budget": 3}), TypeError, "plan must be a plan.Plan"),
    (dict(method="tree", plan=Plan(widths=(100, 100), sampled="with")), ValueError,
     r"up to 10100 tokens per step \(widths=100,100\) exceed the target's context \(n_ctx=40\)"),
    (dict(method="staged", plan=Plan(copy_len=100)), ValueError, "copy_len=100"),
    (dict(prompt=None), TypeError, "prompt must be a list of token ids, got NoneType None"),
    (dict(prompt=5), TypeError, "prompt must be a list of token ids, got int 5"),
    (dict(method="tree", draft="tiny-draft"), TypeError, r"draft must be a loaded gpt2.GPT2 \(e.g. models.load_model"),
    (dict(draft="tiny-draft"), TypeError, "draft must be a loaded gpt2.GPT2"),  # wrong even where unused
    (dict(method="staged", ngram="weights/tiny-trigram.npz"), TypeError,
     r"ngram must be a loaded ngram.Trigram \(e.g. models.load_ngram\(path\)\), got str"),
    (dict(eos=-25), ValueError, r"eos must be a token id in 0..23 \(or -1 for the last.*None \(no end-of-text stop\), "
                                r"got -25"),
    (dict(eos="x"), ValueError, "eos must be a token id in 0..23.*got 'x'"),
    (dict(eos=24), ValueError, "eos must be a token id in 0..23.*got 24"),
    (dict(eos=True), ValueError, "eos must be a token id"),
])
def test_api_rejects_bad_arguments_naming_them(models, kw, error, needle):
    target, draft, trigram = models
    args = dict(prompt=[1, 2], max_new_tokens=4, method="ar", **models_for(kw.get("method", "ar"), draft, trigram)) | kw
    with pytest.raises(error, match=needle):
        generate(target, **args)


@pytest.mark.parametrize("kw, error, needle", [
    # B16: a depth or a guess length past the context is refused before its cache is allocated.
    (dict(method="tree", plan=Plan(depth=10**6)), ValueError, r"plan: depth=1000000 is deeper than the target's "
                                                              r"context \(n_ctx=40\)"),
    (dict(method="staged", plan=Plan(depth=10**6)), ValueError, "plan: depth=1000000"),
    (dict(method="ngram", plan=Plan(depth=41)), ValueError, "plan: depth=41"),
    (dict(method="staged", plan=Plan(guess_len=10**6)), ValueError, "plan: guess_len=1000000 is deeper"),
    # B17: what rand must be.
    (dict(temperature=1.0, rand=np.random.default_rng(0)), TypeError, r"rand must be a sampling.Rand .*got Generator"),
    (dict(temperature=1.0, rand=object()), TypeError, "rand must be a sampling.Rand .*got object"),
    # A dict or a set is not a token sequence; options that change nothing; keep_trees a bool.
    (dict(prompt={1: 2}), TypeError, "prompt must be a sequence of token ids .*not a dict"),
    (dict(prompt={1, 2}), TypeError, "not a set"),
    (dict(top_k=5), ValueError, "top_k changes nothing at temperature 0"),
    (dict(top_p=0.9), ValueError, "top_p changes nothing at temperature 0"),
    (dict(keep_trees="yes"), TypeError, "keep_trees must be True or False, got str 'yes'"),
    # A speculative chain is drawn with replacement whatever sampled says: the rule's error names that kind.
    (dict(method="speculative", temperature=1.0, plan=Plan(sampled="without", rule="recursive_wor")), ValueError,
     "rule 'recursive_wor' is not lossless on a with_replacement tree: it assumes siblings drawn from q without"),
])
def test_api_refuses_sizes_rand_and_silent_arguments_before_any_work(models, kw, error, needle, monkeypatch):
    target, draft, trigram = models
    monkeypatch.setattr("specdec_np.decode.new_cache", lambda *a, **k: pytest.fail("allocated before the check"))
    args = dict(prompt=[1, 2], max_new_tokens=4, method="ar", **models_for(kw.get("method", "ar"), draft, trigram)) | kw
    with pytest.raises(error, match=needle) as e:
        generate(target, **args)
    assert "\n" not in str(e.value)


def test_accepted_counterparts_of_the_refused_arguments_decode(models):
    """The controls: a depth at the context, a Rand over a Generator, a tuple prompt, a with-replacement rule
    on a speculative chain asked 'without', and a subnormal temperature all decode (no warning)."""
    target, draft, trigram = models
    from specdec_np.sampling import Rand
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate(target, [1, 2], 4, "tree", draft, plan=Plan(depth=40))
        generate(target, (1, 2), 4, "speculative", draft, temperature=1.0, rand=Rand(np.random.default_rng(0)),
                 plan=Plan(sampled="without", rule="recursive"))
        generate(target, [1, 2], 4, "ar", temperature=5e-324, top_k=3, keep_trees=True)


def test_api_rejects_a_target_that_is_not_a_model(models):
    with pytest.raises(TypeError, match=r"target must be a loaded gpt2.GPT2 \(e.g. "
                                        r"models.load_model\('tiny-target'\)\), got str 'tiny-target'"):
        generate("tiny-target", [1, 2], 4)


@pytest.mark.parametrize("pad", [(1.5,), (1, 2.0001), ("4",), 3, (0,), (True,), (2, 1), (100000,), (2, 41)])
def test_a_models_padding_must_be_block_sizes_within_its_context(models, pad):
    target, _, _ = models
    with pytest.raises(ValueError, match=r"padding: padding\[k - 1\] must be an integer from k to n_ctx=40"):
        laid_out(target, padding=pad)
    assert laid_out(target, padding=[np.int64(2), 2, 4]).layout.padding == (2, 2, 4)


def test_eos_in_range_stops_and_never_does_not(models):
    target, _, _ = models
    free = generate(target, [1, 2], 20, eos=None)
    assert free.stop_reason == "max_new_tokens" and len(free.tokens) == 20
    eos = free.tokens[3]
    res = generate(target, [1, 2], 20, eos=np.int64(eos))
    assert res.stop_reason == "eos" and res.tokens == free.tokens[:free.tokens.index(eos) + 1]


def test_a_draft_whose_context_the_prompt_fills_is_named_before_any_work(models):
    target, draft, trigram = models
    short = GPT2(dataclasses.replace(CFG, n_ctx=8), {**draft.params, "wpe": draft.params["wpe"][:8]})  # 8 positions
    for method in ("speculative", "tree", "staged"):
        with pytest.raises(ValueError, match=r"the prompt has 8 tokens: the draft's context \(n_ctx=8\) must hold "
                                             "more"):
            generate(target, list(range(8)), 4, method, **models_for(method, short, trigram))
    # A prompt that fits, decoding past the end of the draft's context: the draft stops drafting
    # (one-token trees) and the target goes on, with the same tokens as plain decoding.
    for method in ("speculative", "tree", "staged"):
        res = generate(target, list(range(6)), 12, method, eos=None, **models_for(method, short, trigram))
        assert res.tokens == generate(target, list(range(6)), 12, eos=None).tokens
        assert res.stats.steps[-1].draft_blocks == []


def test_a_trigram_for_another_vocabulary_is_refused_before_any_work(models):
    target, draft, _ = models
    other = ngram.fit(np.arange(100) % 30, 30)
    for method in ("staged", "ngram"):
        with pytest.raises(ValueError,
                           match=r"ngram: the trigram's vocabulary \(30 tokens\) is not the target's \(24\)"):
            generate(target, [1, 2], 4, method, **models_for(method, draft, other))


def test_a_failed_download_leaves_nothing_and_names_every_model(tmp_path, capsys):
    # A hub that is not there: every model fails, no directory is left, and all are named.
    code = download.main(["gpt2", "distilgpt2", "--dest", str(tmp_path), "--base-url", "http://127.0.0.1:9",
                          "--retries", "0"])
    err = capsys.readouterr().err
    assert code == 1 and "not fetched: gpt2, distilgpt2" in err
    assert list(tmp_path.iterdir()) == []


@given(method=st.sampled_from(list(METHODS)), temperature=st.sampled_from([0.0, 1.0]), n=st.integers(0, 30),
       prompt=st.lists(st.integers(0, CFG.n_vocab - 1), min_size=1, max_size=8), eos=st.sampled_from([None, 3, 5]),
       copy_len=st.sampled_from([0, 4]), seed=st.integers(0, 3))
@settings(max_examples=60)
def test_statistics_follow_from_the_emitted_tokens(models, method, temperature, n, prompt, eos, copy_len, seed):
    """Every figure is computed from what was emitted, also when the last step was cut at
    max_new_tokens or at end-of-text."""
    target, draft, trigram = models
    draft = eagle.random_head(target) if method == "eagle" else draft  # eagle drafts with a head of the target
    res = generate(target, prompt, n, method, plan=Plan(budget=5, depth=3, chain=3, copy_len=copy_len),
                   temperature=temperature, seed=seed, eos=eos, **models_for(method, draft, trigram))
    s = res.stats
    assert sum(s.accepted) == len(res.tokens) == len(s.source)
    assert s.tokens_per_pass * s.target_passes == pytest.approx(len(res.tokens))
    assert [x for step in s.steps for x in step.tokens] == res.tokens
    assert s.target_bytes == s.target_passes * target.weight_bytes
    if res.tokens:
        want = (s.target_passes * target.weight_bytes + s.draft_passes * s.draft_weight_bytes) \
            / (len(res.tokens) * target.weight_bytes)
        assert s.weight_traffic == pytest.approx(want)
    assert res.stop_reason == ("eos" if eos in res.tokens else "max_new_tokens" if len(res.tokens) == n else "context")
    if eos in res.tokens:
        assert res.tokens.index(eos) == len(res.tokens) - 1


def test_the_greedy_rule_is_refused_when_sampling(small):
    """Keeping the argmax is lossless only at temperature 0."""
    with pytest.raises(ValueError, match="rule 'greedy'"):
        generate(small.target, [1, 2], 4, "speculative", small.draft, plan=Plan(rule="greedy"), temperature=1.0)
    assert len(generate(small.target, [1, 2], 4, "speculative", small.draft, plan=Plan(rule="greedy")).tokens) == 4


@pytest.mark.parametrize("closed, rc, out_has, err_has", [
    (">&-", 2, None, "error: standard output is closed"),  # B10: was an AttributeError traceback
    ("2>&-", 0, "x", None),  # the statistics are not written into the completion
])
def test_a_closed_standard_stream_gets_a_clean_exit(closed, rc, out_has, err_has):
    import shlex
    cmd = (f"{shlex.quote(sys.executable)} -m specdec_np generate x --plan default --method ar --max-new-tokens 4 "
           f"--stats {closed}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, cwd=ROOT, timeout=300)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == rc, err
    assert "Traceback" not in err and "method ar" not in out  # the statistics never reach standard output
    if err_has:
        assert len(err.strip().splitlines()) == 1 and err_has in err
    if out_has:
        assert out.startswith(out_has) and err == ""


# ----------------------------------------------------------------------------- unbounded reads, names, streams

def one_line(capsys, rc, expected_rc=2) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == expected_rc and len(err) == 1, err
    return err[0]


class Endless(io.RawIOBase):
    """A stream that never ends (`cat /dev/zero | ...`)."""
    def readable(self):
        return True

    def readinto(self, b):
        b[:] = bytes(len(b))
        return len(b)


@pytest.mark.parametrize("kind, needle", [
    ("/dev/zero", "--file /dev/zero is not a regular file (a device): give a file, or pipe"),
    ("fifo", "is not a regular file (a FIFO"),  # open() would block until something writes to it
    ("20 MB", "prompt.py is over 16 MB"),
    ("stdin", "standard input: the prompt is over 16 MB"),
    ("20 kB", "the prompt has 20000 bytes, so at least 625 tokens (a token is at most 32 bytes): the target's context "
              "(n_ctx=512) must hold more"),
])
def test_a_prompt_is_read_and_tokenized_only_as_far_as_the_context_needs(kind, needle, tmp_path, monkeypatch, capsys):
    from specdec_np.tools import cli
    path = tmp_path / "prompt.py"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "stdin":
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(Endless())))
    elif kind != "/dev/zero":
        path.write_bytes(b"x" * (20 << 20 if kind == "20 MB" else 20000))
    monkeypatch.setattr(cli, "encode", lambda *a: pytest.fail("tokenized"))
    before = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("blocked"))
    signal.alarm(60)
    try:
        rc = main(["generate", *(["-"] if kind == "stdin" else ["--file", kind if kind[0] == "/" else str(path)]),
                   "--plan", "default"])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert needle in one_line(capsys, rc)


@pytest.mark.parametrize("option", ["--target", "--draft", "--ngram"])
def test_a_name_too_long_for_the_file_system_is_named_by_its_option(option, capsys, monkeypatch):
    rc = main(["generate", "x", "--plan", "default", "--method", "staged", option, "a" * 6000])
    assert one_line(capsys, rc) == f"error: {option} {'a' * 60}... (6000 characters): File name too long"

    from specdec_np.tools import cli
    loader = "load_ngram" if option == "--ngram" else "load_model"
    real = getattr(cli, loader)

    def unreadable(path, *a, **k):  # root reads anything: simulated
        if path != "ck":
            return real(path, *a, **k)
        raise PermissionError(errno.EACCES, "Permission denied", f"{path}/model.safetensors")

    monkeypatch.setattr(cli, loader, unreadable)
    rc = main(["generate", "x", "--plan", "default", "--method", "staged", option, "ck"])
    assert one_line(capsys, rc) == f"error: {option} ck: Permission denied (ck/model.safetensors)"


def test_a_draft_of_another_vocabulary_is_named(tmp_path, capsys):
    from specdec_np import checkpoint
    checkpoint.save(random_params(GPT2Config(n_vocab=50257, n_ctx=32, n_embd=8, n_layer=1, n_head=2)), tmp_path / "d")
    rc = main(["generate", "x", "--plan", "default", "--method", "tree", "--draft", str(tmp_path / "d")])
    assert one_line(capsys, rc) == (f"error: --draft {tmp_path / 'd'}: its vocabulary (50257 tokens) is not the "
                                    "target's (8193, --target tiny-target): the two must share a tokenizer")


class Full(io.RawIOBase):
    """`> /dev/full`."""
    def writable(self):
        return True

    def write(self, b):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("stdout, out, err", [
    ("ascii", b"? = 1", "note: standard output's encoding (ascii) cannot show some characters: they are written as "
                        "'?' (PYTHONIOENCODING=utf-8 shows them)"),
    ("utf-8", "\xe9 = 1".encode(), None),  # the control: nothing replaced, nothing said
    ("full", None, "error: cannot write to standard output: No space left on device"),
], ids=["ascii", "utf-8", "full"])
def test_standard_output_that_cannot_take_the_text_is_named(stdout, out, err, monkeypatch, capsys):
    raw = Full() if stdout == "full" else io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8" if stdout == "full" else stdout))
    rc = main(["generate", "\xe9 = 1", "--method", "ar", "--plan", "default", "--max-new-tokens", "2"])
    assert rc == (2 if out is None else 0) and capsys.readouterr().err.strip().splitlines() == ([err] if err else [])
    if out is not None:
        sys.stdout.flush()
        assert raw.getvalue().startswith(out)


def test_the_demo_with_standard_output_closed_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", None)
    assert one_line(capsys, main(["demo", "--max-new-tokens", "4"])) == (
        "error: standard output is closed: the demo has nowhere to go (redirect it, e.g. > out.txt)")


def test_a_full_disk_under_standard_output_is_one_line_also_at_exit():
    import shlex
    r = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m specdec_np generate x --plan default "
                                      "--method ar --max-new-tokens 4 > /dev/full"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stderr == "error: cannot write to standard output: No space left on device\n"


INTERRUPT = {"importing": '''
import os, signal, sys
class Interrupt:  # Ctrl-C as NumPy starts to load
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, Interrupt())
''', "exiting": '''
import atexit, os, signal, time
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))  # Ctrl-C as Python exits
'''}


@pytest.mark.parametrize("when, rc, err", [("importing", 130, "interrupted\n"), ("exiting", 0, "")])
def test_ctrl_c_while_python_loads_or_exits_is_no_traceback(when, rc, err, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT[when])
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    (tmp_path / "a.py").write_text("def f(x):\n    return x\n")
    r = subprocess.run([sys.executable, "-m", "specdec_np", "ngram", "fit", str(tmp_path / "a.py"), "--out",
                        str(tmp_path / "t.npz"), "--n-vocab", "8193"], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert r.returncode == rc and r.stderr == err, r.stderr
    assert (tmp_path / "t.npz").exists() == (when == "exiting")
