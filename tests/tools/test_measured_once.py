"""Measured once, whoever asks first (issue 70): processes that start together on an empty cost cache take turns on
a lock file beside it (`cache.locked`): one measures, the others wait and read what it cached, or, past the time
measuring may take, run the constant plan and say so in one line; `bench --plan default` runs without costs."""

import contextlib
import fcntl
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.gpt2 import GPT2Config, random_params
from specdec_np.tools import acceptance, bench, choice
from specdec_np.tools import calibration as cal
from specdec_np.tools.costmodel import OVERHEADS

CFG = GPT2Config(n_vocab=30, n_ctx=64, n_embd=16, n_layer=1, n_head=2)
PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7]]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CURVE = {k: 1.0 + 0.01 * k for k in (1, 2, 4, 8)}
COSTS = {"curves": {m: {"warm": CURVE, "cold": CURVE} for m in ("target", "draft")},
         "overheads": {s: dict.fromkeys(OVERHEADS, 0.0) for s in ("greedy", "sampled")},
         "layout": {"target": 0, "draft": 0}}


@pytest.fixture(scope="module")
def pair():
    target = random_params(CFG, seed=1, dtype=np.float64, scale=0.5)
    return target, target, ngram.fit(np.random.default_rng(0).integers(0, 30, 500), 30)


@pytest.fixture
def quiet_empty_cache(tmp_path, monkeypatch):
    """An empty cache directory on a machine the checks see as quiet (the suite itself keeps it busy)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cal, "MEASURED", {})
    monkeypatch.setattr(cal, "busy", lambda: "")
    monkeypatch.setattr(cal, "busy_since", lambda start: "")
    monkeypatch.setattr(cal, "Progress", lambda *a, **k: lambda *a, **k: None)
    return tmp_path


@pytest.mark.parametrize("lock", [True, False])
def test_two_starting_together_measure_once(pair, quiet_empty_cache, monkeypatch, capsys, lock):
    """Two callers on an empty cache, the second starting while the first measures (a stubbed measurement that
    waits until the second is either waiting for the lock or measuring too: no timing): the first measures and
    caches, the second waits, then reads the first's costs from the cache. The control (lock=False: the lock
    taken away) measures twice."""
    measured, second_waits, second_measures, answers = [], threading.Event(), threading.Event(), {}
    real_locked = cal.locked
    if lock:
        monkeypatch.setattr(cal, "locked", lambda path, wait, note: real_locked(path, wait, lambda: (
            second_waits.set(), note())))
    else:
        monkeypatch.setattr(cal, "locked", lambda path, wait, note: contextlib.nullcontext(False))

    def ask(name):
        answers[name] = cal.calibration(*pair, PROMPTS)
    second = threading.Thread(target=ask, args=("second",))

    def measure(*args, **kwargs):
        measured.append(threading.current_thread().name)
        n = len(measured)
        if n == 1:
            second.start()
            while not (second_waits.wait(0.05) or second_measures.is_set()):  # until the second is there
                assert second.is_alive() or "second" in answers
        else:
            second_measures.set()
        return COSTS | {"n": n}

    monkeypatch.setattr(cal, "measure_costs", measure)
    ask("first")
    second.join()
    assert answers["first"] == (COSTS | {"n": 1}, "measured now, cached for later runs")
    if lock:
        assert len(measured) == 1 and answers["second"] == (json.loads(json.dumps(COSTS | {"n": 1})), "")
        assert capsys.readouterr().err.count("another process is measuring this machine's costs: waiting") == 1
    else:
        assert len(measured) == 2 and answers["second"][0]["n"] == 2


def test_past_the_wait_the_constant_plan_says_why_in_one_line(pair, quiet_empty_cache, monkeypatch, capsys):
    """Another process holds the lock (this test, through its own descriptor) past the wait: nothing is measured,
    the constant plan runs, one line says why. The control: the lock released, the same call measures."""
    target, draft, trigram = pair
    monkeypatch.setattr(cal, "measuring_seconds", lambda target: -10.5)  # the wait: already over
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: COSTS)
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    lock = cal.costs_path(target, draft, trigram).with_suffix(".lock")
    lock.parent.mkdir(parents=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        chosen = choice.choose(target, draft, trigram, None, 0.0)[None]
        lines = capsys.readouterr().err.splitlines()
        assert chosen.constant and "another process has been measuring this machine's costs" in chosen.constant
        assert len(lines) == 1 and f"(it holds {lock}): not measuring; using lookup" in lines[0], lines
        assert not cal.costs_path(target, draft, trigram).exists()
    finally:
        os.close(fd)
    monkeypatch.setattr(cal, "MEASURED", {})
    assert cal.calibration(target, draft, trigram, PROMPTS) == (COSTS, "measured now, cached for later runs")


def test_bench_plan_default_runs_on_a_busy_machine_without_costs(tmp_path, monkeypatch, capsys):
    """The constant plan needs no costs: on a busy machine with none cached, `bench --plan default` runs, its
    predicted column "unmeasured". The control: --plan machine on the same machine refuses, as it needs them."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cal, "MEASURED", {})
    monkeypatch.setattr(cal, "busy", lambda: "other processes use 2.0 of its 2 cores")
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: pytest.fail("measured on a busy machine"))
    args = ["--prompts", str(FIXTURES / "prompts.jsonl"), "--limit", "1", "--max-new-tokens", "4", "--settings",
            "greedy", "--out", str(tmp_path / "out")]
    with pytest.raises(ValueError, match="bench needs this machine's costs: this machine is busy"):
        bench.main([*args, "--plan", "machine"])
    assert bench.main([*args, "--plan", "default"]) == 0
    out = capsys.readouterr().out
    assert "costs unmeasured: this machine is busy" in out and "layout: each model's own (unmeasured)" in out
    md = (tmp_path / "out" / "results.md").read_text(encoding="utf-8")
    rows = [line for line in md.splitlines() if line.startswith("| ") and "x (" in line]  # the speed table's rows
    assert rows and all("| unmeasured |" in row for row in rows[1:]), md  # every row but the baseline's
    assert json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))["costs"] is None
