"""The tools' plan: the acceptance profile's counts, the choice on a machine's costs, the cache of
those costs in the user's cache directory, and how busy the machine is while they are measured."""

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.decode import generate
from specdec_np.fastpath import ONE_ROW
from specdec_np.gpt2 import GPT2Config, random_params
from specdec_np.methods import METHODS
from specdec_np.plan import Plan, constant
from specdec_np.tools import calibration as cal
from specdec_np.tools import choice, machine
from specdec_np.tools import acceptance
from specdec_np.tools.costmodel import OVERHEADS, pads
from specdec_np.tools.options import describe
from specdec_np.tools.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "weights"))
import make_profile  # noqa: E402  (weights/make_profile.py: the shipped profile's journal and worker processes)

CFG = GPT2Config(n_vocab=64, n_ctx=64, n_embd=16, n_layer=1, n_head=2)  # more than the top-k setting's 50
PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7], [3, 3, 9, 1, 2, 3]]
GRID = [("ar", {}), ("lookup", {"chain": 3}), ("speculative", {"chain": 2}),
        ("staged", {"shape": "fixed", "widths": (2, 1), "guess_len": 1, "guess_rows": 2, "copy_len": 3})]


@pytest.fixture(scope="module")
def pair():
    target = random_params(CFG, seed=1, dtype=np.float64, scale=0.5)
    draft = random_params(CFG, seed=1, dtype=np.float64, scale=0.5)  # the same model: drafts are accepted
    return target, draft, ngram.fit(np.random.default_rng(0).integers(0, CFG.n_vocab, 500), CFG.n_vocab)


@pytest.fixture(scope="module")
def profile(pair):
    target, draft, trigram = pair
    grid = {"greedy": GRID, "sampled": [(m, dict(s, sampled="without") if m == "staged" else s) for m, s in GRID]}
    return acceptance.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, seeds=2, grid=grid)


def curve(per_token, fixed):  # ms of a pass of k tokens: fixed + per_token * k
    return {k: fixed + per_token * k for k in (1, 2, 4, 8, 16, 32)}


def costs(per_token, fixed=1.0):
    c = curve(per_token, fixed)
    return {"curves": {"target": {"warm": c, "cold": c}, "draft": {"warm": curve(0.01, 0.1), "cold": curve(0.01, 0.1)}},
            "overheads": {s: dict.fromkeys(OVERHEADS, 0.0) for s in ("greedy", "sampled")},
            "layout": {"target": 0, "draft": 0}}


def test_profile_counts_what_each_run_did_past_its_prefill(pair):
    target, draft, trigram = pair
    ar = generate(target, PROMPTS[0], 10, "ar", eos=None)
    c = acceptance.counts(ar.stats)
    assert c == {"tokens": 9, "steps": 9, "draft_dists": 0, "ngram_queries": 0, "target": {"cold": {}, "warm": {1: 9}},
                 "draft": {"cold": {}, "warm": {}}}
    spec = generate(target, PROMPTS[1], 10, "speculative", draft, plan=Plan(chain=2), eos=None)
    c = acceptance.counts(spec.stats)
    steps = spec.stats.steps[1:]
    assert c["tokens"] == sum(len(s.tokens) for s in steps) and c["steps"] == len(steps)
    assert c["target"] == {"cold": {3: len(steps)}, "warm": {}}  # the draft ran before every pass
    assert sum(c["draft"]["cold"].values()) == len(steps)  # each step's first draft pass is cold
    assert sum(c["draft"]["warm"].values()) == len(steps)  # a chain of 2: one more pass per step
    assert c["draft_dists"] == 2 * len(steps)  # one distribution per pass: the root's, then its child's
    assert acceptance.counts(spec.stats, skip_first=False)["tokens"] == len(spec.tokens)


def test_the_plan_drafts_only_where_drafting_pays(profile):
    """Blocks nearly free (memory-bound): a drafting plan wins; blocks costing k times a single
    token (compute-bound): plain decoding is the plan, never a slower drafting one."""
    for temperature in (0.0, 1.0):
        cheap = choice.fastest(profile, costs(per_token=0.01), temperature)
        assert cheap.method != "ar" and cheap.speedup >= choice.MARGIN
        dear = choice.fastest(profile, costs(per_token=5.0, fixed=0.0), temperature)
        assert dear.method == "ar" and dear.plan == Plan()
        # One method's best plan is still available when asked for (here slower than plain decoding).
        spec = choice.fastest(profile, costs(per_token=5.0, fixed=0.0), temperature, "speculative")
        assert spec.method == "speculative" and spec.plan.chain == 2 and spec.speedup < 1
    with pytest.raises(ValueError, match="no candidate"):
        choice.fastest(profile, costs(0.01), 0.0, "tree")  # not in this profile
    # Without a draft model or an n-gram the plan is made of what can run.
    assert choice.fastest(profile, costs(0.01), 0.0, has_draft=False).method in ("ar", "lookup")


def test_a_profile_round_trips_through_json(tmp_path, profile):
    acceptance.save(profile, tmp_path / "p.json")
    assert acceptance.load(tmp_path / "p.json") == profile
    with pytest.raises(ValueError, match="not a specdec_np acceptance profile"):
        acceptance.from_json({"format": "something else"})


def test_costs_are_cached_in_the_users_cache_directory(pair, tmp_path, monkeypatch):
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    measured = []

    def fake_measure(*args, **kw):
        measured.append(1)
        return costs(0.01) | {"n": len(measured)}

    monkeypatch.setattr(cal, "measure_costs", fake_measure)
    first, fresh = cal.calibration(target, draft, trigram, PROMPTS)
    assert fresh and first["n"] == 1
    files = list((tmp_path / "cache" / "specdec_np").glob("costs-*.json"))
    assert len(files) == 1 and not list((tmp_path / "cache" / "specdec_np").glob("*.tmp"))
    again, fresh = cal.calibration(target, draft, trigram, PROMPTS)
    assert not fresh and again["n"] == 1 and len(measured) == 1  # later runs start at once
    assert cal.calibration(target, draft, trigram, PROMPTS, recalibrate=True)[0]["n"] == 2
    # Another machine (or BLAS, or model pair) is another key: measured anew, in its own file.
    monkeypatch.setattr(cal, "machine", lambda: {"cpu": "another CPU", "cpus": 64})
    assert cal.calibration(target, draft, trigram, PROMPTS)[1]
    other = random_params(CFG, seed=9, dtype=np.float64)
    assert cal.calibration(target, other, trigram, PROMPTS)[1]
    assert len(list((tmp_path / "cache" / "specdec_np").glob("costs-*.json"))) == 3


def test_measured_costs_have_every_curve_and_overhead(pair, tmp_path):
    target, draft, trigram = pair
    seen = []
    got = cal.measure_costs(target, draft, trigram, PROMPTS, progress=lambda done, total: seen.append((done, total)))
    # Progress counts real units of work (layouts, curve rounds, settings): it only moves forward,
    # its total never changes once known, and it ends exactly at that total.
    assert seen[0] == (0, None) and seen[-1][0] == seen[-1][1]
    assert [d for d, _ in seen] == list(range(len(seen))) and len({t for _, t in seen[2:]}) == 1
    assert set(got["curves"]) == {"target", "draft"}
    assert all(set(c) == {"warm", "cold"} and all(v > 0 for v in c["warm"].values()) for c in got["curves"].values())
    assert set(got["overheads"]) == {"greedy", "sampled"}
    assert all(set(o) == set(OVERHEADS) and min(o.values()) >= 0
               for o in got["overheads"].values())
    # The target's curve is scaled to what its passes cost in the decoding loop, at every size.
    assert set(got["target_scale"]) == {int(k) for k in got["curves"]["target"]["warm"]}
    assert all(v > 0 for v in got["target_scale"].values())
    # The read-rate probe measured with them: a positive, finite rate (GB/s) that the cache check accepts.
    assert 0 < got["read_gbps"] < float("inf") and cal.problem(got, True) == ""


def test_the_core_ignores_cached_costs_and_the_machine_identity(pair, profile, tmp_path, monkeypatch):
    """generate's defaults give the same tokens for a seed whatever costs are cached and whatever
    the machine says it is; the tools' choice does follow the costs (the control)."""
    target, draft, trigram = pair
    kw = dict(method="staged", draft=draft, ngram=trigram, temperature=1.0, top_k=10, seed=7, eos=None)
    before = generate(target, [1, 2, 3, 1, 2], 24, **kw)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for cpu, cost in (("a memory-bound CPU", costs(0.01)), ("a compute-bound CPU", costs(5.0, 0.0))):
        monkeypatch.setattr(cal, "machine", lambda cpu=cpu: {"cpu": cpu, "cpus": 96})
        monkeypatch.setattr(cal, "measure_costs", lambda *a, cost=cost, **k: cost)
        cal.calibration(target, draft, trigram, PROMPTS)
        after = generate(target, [1, 2, 3, 1, 2], 24, **kw)
        assert after.tokens == before.tokens and after.stats.accepted == before.stats.accepted
    assert choice.fastest(profile, costs(0.01), 1.0).method != choice.fastest(profile, costs(5.0, 0.0), 1.0).method


def measure_journalled(pair, grid, journal, jobs=1, **kw):
    """The profile of `grid` on PROMPTS, each candidate journalled in `journal` (weights/make_profile.py)."""
    return acceptance.measure(*pair, PROMPTS, max_new_tokens=12, grid=grid,
                              count_all=make_profile.journalled(journal, jobs), **kw)


def test_an_interrupted_profile_resumes_from_its_journal(pair, profile, tmp_path, monkeypatch):
    grid = {"greedy": GRID[:2]}
    journal = tmp_path / "journal.jsonl"
    first = measure_journalled(pair, grid, journal)
    assert len(journal.read_text().splitlines()) == 2

    def no_decoding(*args, **kw):
        raise AssertionError("a journalled candidate was decoded again")

    with monkeypatch.context() as m:
        m.setattr(acceptance, "generate", no_decoding)
        again = measure_journalled(pair, grid, journal)
    assert again == first and first["settings"]["greedy"] == profile["settings"]["greedy"][:2]
    # A line another version of the code wrote (its counts may lack a field) is counted again.
    lines = journal.read_text().splitlines()
    journal.write_text(lines[0].replace(f'"version": {acceptance.VERSION}', '"version": 0') + "\n" + lines[1] + "\n")
    decoded = []  # (method, plan) of each candidate decoded: generate's 4th and 7th arguments
    monkeypatch.setattr(acceptance, "generate", lambda *a, **k: decoded.append((a[3], a[6])) or generate(*a, **k))
    again = measure_journalled(pair, grid, journal)
    assert again == first and set(decoded) == {(GRID[0][0], Plan(**GRID[0][1]))}
    # A line of other models (another pair left the journal), or of other sizes, is counted again too.
    lines = journal.read_text().splitlines()
    other = next(line for line in lines if f'"method": "{GRID[1][0]}"' in line)
    lines[lines.index(other)] = other.replace(json.loads(other)["job"], "another pair")
    journal.write_text("\n".join(lines) + "\n")
    decoded.clear()
    assert measure_journalled(pair, grid, journal) == first and set(decoded) == {(GRID[1][0], Plan(**GRID[1][1]))}
    decoded.clear()
    measure_journalled(pair, grid, journal, seeds=1)
    assert set(decoded) == {(method, Plan(**shape)) for method, shape in GRID[:2]}


def test_make_profile_says_where_it_writes_and_writes_the_weights_directory(tmp_path, capsys, monkeypatch):
    """weights/make_profile.py (the maintainers' tool that regenerates profile.json) names its destination, the
    weights directory (SPECDEC_NP_WEIGHTS), before measuring; it never falls back to the shipped file, and a
    destination it cannot write, or --jobs 0, fails before measuring."""
    saved, journal = [], tmp_path / "b" / "profile.journal.jsonl"
    monkeypatch.setattr(make_profile, "load_embedded", lambda: ("target", "draft", "ngram", "enc"))
    monkeypatch.setattr(make_profile, "load_head", lambda target: "head")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: [[1, 2]])
    monkeypatch.setattr(acceptance, "measure", lambda *a, **k: journal.write_text("") or {"n": 1})
    monkeypatch.setattr(acceptance, "save", lambda profile, path: saved.append((profile, path)))
    weights = tmp_path / "weights"
    weights.mkdir()
    monkeypatch.setattr(make_profile, "WEIGHTS_DIR", weights)
    assert make_profile.main(["--out", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert saved == [({"n": 1}, weights / "profile.json")]
    assert f"the profile goes to {weights / 'profile.json'}" in out.splitlines()[0]
    assert f"wrote {weights / 'profile.json'}" in out and not journal.exists()
    # A weights directory under a regular file: named, with the variable that moves it, before measuring.
    (tmp_path / "FILE").write_text("x")
    monkeypatch.setattr(make_profile, "WEIGHTS_DIR", tmp_path / "FILE" / "weights")
    monkeypatch.setattr(acceptance, "measure", lambda *a, **k: pytest.fail("measured"))
    for args, needle in (([], r"the profile goes to .*FILE/weights/profile\.json \(the weights directory, "
                              r"\$SPECDEC_NP_WEIGHTS\): .*FILE is a file"), (["--jobs", "0"], "--jobs must be >= 1")):
        with pytest.raises(SystemExit):
            make_profile.main([*args, "--out", str(tmp_path / "b")])
        assert re.search(needle, capsys.readouterr().err)


def test_a_profile_counted_in_worker_processes_is_the_same(pair, profile, tmp_path):
    grid = {"greedy": GRID, "sampled": [(m, dict(s, sampled="without") if m == "staged" else s) for m, s in GRID]}
    journal, seen, env = tmp_path / "journal.jsonl", [], os.environ.get("OPENBLAS_NUM_THREADS")
    got = measure_journalled(pair, grid, journal, jobs=2, seeds=2,
                             progress=lambda done, total: seen.append((done, total)))
    assert got == profile  # in the grid's order, whichever worker finished first
    assert len(journal.read_text().splitlines()) == 8 and seen[-1] == (8, 8)
    assert os.environ.get("OPENBLAS_NUM_THREADS") == env  # the workers' setting, not this process's


def test_costs_measured_while_the_machine_got_busy_are_not_kept(pair, tmp_path, monkeypatch):
    """Timings taken while other processes use the CPU would mislead every later run: not kept, not
    cached, and not measured again in the same process; a quiet machine's are cached and reused.
    Without /proc/stat, the load average decides."""
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: measured.append(1) or costs(0.01) | {"n": len(measured)})

    def others_use(cores):  # snapshots (all CPU s, own CPU s, wall s) over 10 s: own 15 s, others `cores`
        snaps = iter([(100.0, 50.0, 0.0), (100.0 + 15 + 10 * cores, 65.0, 10.0)])
        for module in (cal, machine):  # calibration's snapshot at the start, busy_since's at the end
            monkeypatch.setattr(module, "cpu_times", lambda: next(snaps))

    others_use(1.0)
    for _ in range(2):  # measured once: the second call in the process gives the same answer
        with pytest.raises(cal.Busy, match="other processes used 1.0 .*not kept"):
            cal.calibration(target, draft, trigram, PROMPTS)
    assert not list(tmp_path.rglob("costs-*.json")) and len(measured) == 1
    monkeypatch.setattr(cal, "MEASURED", {})  # a new process
    others_use(machine.BUSY_CORES / 2)
    assert cal.calibration(target, draft, trigram, PROMPTS)[0]["n"] == 2  # measured again: nothing was cached
    got, fresh = cal.calibration(target, draft, trigram, PROMPTS)
    assert not fresh and got["n"] == 2 and len(measured) == 2
    # A window too short to count ticks in says nothing (a cached or fake measurement takes no time).
    snaps = iter([(100.0, 50.0, 0.0), (100.02, 50.0, 0.001)])
    monkeypatch.setattr(machine, "cpu_times", lambda: next(snaps))
    assert machine.busy_since(machine.cpu_times()) == ""
    # No /proc/stat: the load average.
    monkeypatch.setattr(machine, "cpu_times", lambda: None)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 3.0, 0.0, 0.0))
    assert "load" in machine.busy_since(None)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert machine.busy_since(None) == ""


def test_progress_off_a_terminal_writes_whole_lines(capsys):
    """In a log file or CI the indicator is two plain lines, not carriage-return redraws."""
    show = Progress("measuring", tty=False)
    for done in range(1, 5):
        show(done, 4)
    show.end()  # already ended at 4/4: no second closing line
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert lines[0] == "measuring ..." and lines[1].startswith("measuring: done, 4 in ") and len(lines) == 2


def test_progress_on_a_terminal_redraws_one_line(capsys):
    """On a terminal: one line redrawn in place, with the bar and the counts (in the unit given), then
    a closing line; a task of unknown size ends with end()."""
    show = Progress("fetching", unit=lambda n: f"{n} B", tty=True)
    show(0, 8)
    show(8, 8)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "[" + "#" * 30 + "] 8 B/8 B" in err and "fetching: done, 8 B in" in err
    show = Progress("fetching", tty=True)
    show(5)
    assert "\n" not in capsys.readouterr().err
    show.end()
    assert re.search(r"\rfetching: done, 5 in \d+\.\d s *\n$", capsys.readouterr().err)


def test_a_first_use_profile_is_sized_to_this_machine():
    """A pair with no shipped profile is profiled in about PROFILE_SECONDS: the largest size that
    fits, smaller on a slower machine or a bigger pair, never below the smallest."""
    sizes = [choice.profile_size(30, ms)[:2] for ms in (0.01, 3.0, 20.0, 150.0, 1e4)]
    assert sizes[0] == choice.PROFILE_SIZES[0] and sizes[-1] == choice.PROFILE_SIZES[-1]
    assert [choice.PROFILE_SIZES.index(s) for s in sizes] == sorted(choice.PROFILE_SIZES.index(s) for s in sizes)
    for ms in (3.0, 20.0, 150.0):
        n_prompts, tokens, seconds = choice.profile_size(30, ms)
        assert seconds == 30 * n_prompts * tokens * ms / 1000
        assert seconds <= choice.PROFILE_SECONDS or (n_prompts, tokens) == choice.PROFILE_SIZES[-1]
    # The calibration's timed runs shrink the same way: the embedded target's size where a pass is cheap.
    assert cal.timed_run_size(2.5) == (3, 32) and cal.timed_run_size(40.0) == (1, 8)


def test_a_pair_without_a_shipped_profile_is_profiled_once_per_setting(pair, tmp_path, monkeypatch, capsys):
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    runs = []
    monkeypatch.setattr(acceptance, "generate", lambda *a, **k: runs.append((len(a[1]), a[2])) or generate(*a, **k))
    slow = costs(per_token=0.0, fixed=400.0)  # a pass of 400 ms: the smallest profile
    got = choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "greedy", slow)
    n_prompts, tokens = choice.PROFILE_SIZES[-1]
    assert set(got["settings"]) == {"greedy"} and (got["prompts"], got["max_new_tokens"]) == (n_prompts, tokens)
    assert {r[1] for r in runs} == {tokens} and len(runs) == n_prompts * len(got["settings"]["greedy"])
    assert {r["method"] for r in got["settings"]["greedy"]} == {"ar", "lookup", "speculative", "tree", "staged"}
    assert "cached for later runs" in capsys.readouterr().err
    assert choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "greedy", slow) == got
    assert len(runs) == n_prompts * len(got["settings"]["greedy"])  # the second time from the cache
    choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "sampled", slow)  # the other setting: measured
    assert len(runs) > n_prompts * len(got["settings"]["greedy"])
    assert len(list((tmp_path / "specdec_np").glob("profile-*.json"))) == 2


def test_a_busy_machine_measures_nothing_and_says_which_plan_it_uses(pair, profile, tmp_path, monkeypatch, capsys):
    """The load check before measuring sees others using a core or more: nothing is measured or
    cached, one line names the plan (the constant plan, the rule's kind of tree); --recalibrate is an
    error; BLAS gets one thread. Busy while measuring, or too slow: the same fallback."""
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "load", lambda: 1.0)
    threads = machine.blas()["threads"]
    try:
        machine.use_threads(2)
        assert "1.0 of its" in machine.settle_threads() and machine.blas()["threads"] == 1
        assert machine.settle_threads() == ""  # said once: it already has one thread
    finally:
        machine.use_threads(threads)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: pytest.fail("measured on a busy machine"))
    sampled = constant(1.0)
    drawn = {"recursive_wor": "without", "point_mass": None, "recursive": "with"}  # what each rule needs
    cases = [(0.0, "lookup", None, Plan()), (1.0, "ar", None, sampled)] + [
        (1.0, method, rule, dataclasses.replace(sampled, sampled=drawn[rule], rule=rule))
        for method, rule in (("staged", "recursive_wor"), ("tree", "point_mass"), ("tree", "recursive"))]
    for temperature, method, rule, plan in cases:
        asked = method if rule else None
        changes = {"rule": rule} if rule else None
        chosen = choice.choose(target, draft, trigram, None, temperature, (asked,), changes=changes)[asked]
        assert (chosen.method, chosen.plan, chosen.layout) == (method, plan, {})
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "busy (other processes use 1.0" in lines[0] and "not measuring" in lines[0]
        assert f"using {method} with {describe(method, plan)}" in lines[0] and chosen.constant
        assert ("slower than plain decoding" in lines[0]) == (method != "ar")
    with pytest.raises(ValueError, match="--recalibrate: this machine is busy"):
        choice.choose(target, draft, trigram, None, 0.0, recalibrate=True)[None]
    assert not list(tmp_path.rglob("costs-*.json"))
    monkeypatch.setattr(machine, "load", lambda: 0.0)  # quiet as measuring starts, but too slow or busy meanwhile

    def slow(*a, **k):
        raise cal.Busy("measuring took over 30 s: this machine is too busy")
    monkeypatch.setattr(cal, "measure_costs", slow)
    assert choice.choose(target, draft, trigram, None, 0.0)[None].constant.endswith("measuring took over 30 s: this "
                                                                                   "machine is too busy")
    assert "too busy" in capsys.readouterr().err
    monkeypatch.setattr(cal, "MEASURED", {})
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01))
    monkeypatch.setattr(cal, "busy_since", lambda start: "other processes used 1.2 of its 2 cores")
    assert "busy while measuring" in choice.choose(target, draft, trigram, None, 0.0)[None].constant
    assert "busy while measuring" in capsys.readouterr().err and not list(tmp_path.rglob("costs-*.json"))
    monkeypatch.setattr(cal, "MEASURED", {})
    # The control: a quiet measurement gives a measured plan with its layout.
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01) | {"layout": {"target": 4, "draft": 0}})
    monkeypatch.setattr(cal, "busy_since", lambda start: "")
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    chosen = choice.choose(target, draft, trigram, None, 0.0)[None]
    padding = pads(costs(0.01)["curves"])  # the padding tables of the measured cost curves
    assert not chosen.constant and chosen.layout == {"target": 4, "draft": 0} | padding
    laid_target, laid_draft = chosen.models(target, draft)
    assert (laid_target.layout.slab_rows, laid_draft.layout.slab_rows) == (4, 0)
    assert laid_target.params is target.params
    assert (laid_target.layout.padding, laid_draft.layout.padding) == (padding["target_pad"], padding["draft_pad"])


def test_measuring_stops_past_its_time(pair):
    target, draft, trigram = pair
    with pytest.raises(cal.Busy, match="over 0 s"):
        cal.measure_costs(target, draft, trigram, PROMPTS, seconds=0)


def test_the_cost_cache_key_names_the_blas_kernel_and_threads(monkeypatch):
    """The key holds the BLAS threads the process started with, not the one thread a busy run lowers them to."""
    m = machine.machine()
    assert set(m["blas"]) == {"library", "version", "kernel", "threads"} and m["blas"]["threads"] >= 1
    assert m["blas"]["kernel"] in machine.machine_name() and m["blas"]["threads"] == machine.own_threads()
    threads = machine.blas()["threads"]
    try:
        machine.use_threads(threads + 1)
        assert machine.machine() == m  # a thread count set later is not the machine's
        monkeypatch.setattr(machine, "own_threads", lambda: threads + 1)  # a process that started with more
        assert machine.machine()["blas"]["threads"] == threads + 1 and machine.machine() != m
    finally:
        machine.use_threads(threads)


BAND = (machine.BUSY_CORES, 0.9)  # others' cores: from a quarter to below one (issue 53's laptop with a browser)


@pytest.mark.parametrize("load", BAND)
@pytest.mark.parametrize("cached", ["valid", "none", "invalid", "busy key"])
def test_the_busy_band_measures_nothing_and_says_what_it_does(pair, profile, tmp_path, monkeypatch, capsys, load,
                                                              cached):
    """With others using a quarter to one core: a valid quiet cache is used (its key holds the threads the
    process started with, not the one BLAS gets now) and nothing is measured; without one, or with one not
    valid, nothing is measured either (it would not be kept): one line says so and names the plan. The
    control: on a quiet machine a cache that is not valid is measured again and replaced."""
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01))
    monkeypatch.setattr(machine, "own_threads", lambda: 2)
    threads = machine.blas()["threads"]
    try:
        machine.use_threads(2)  # the process's threads while quiet
        if cached != "none":
            cal.calibration(target, draft, trigram, PROMPTS)  # measured quiet, cached
            path = next(tmp_path.rglob("costs-*.json"))
            if cached != "valid":
                path.write_text(json.dumps({} if cached == "invalid" else costs(0.01) | {"busy": "busy"}))
        monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: pytest.fail("measured in the busy band"))
        monkeypatch.setattr(machine, "load", lambda: load)
        capsys.readouterr()
        chosen = choice.choose(target, draft, trigram, None, 0.0)[None]
        lines = capsys.readouterr().err.splitlines()
        assert machine.blas()["threads"] == 1
    finally:
        machine.use_threads(threads)
    busy = f"other processes use {load:.1f} of its"
    if cached == "valid":
        assert not chosen.constant and chosen.layout and len(lines) == 1 and busy in lines[0]
        assert lines[0].endswith("BLAS uses one thread")
        return
    assert chosen.constant and len(lines) == 1 and busy in lines[0] and "not measuring; using lookup" in lines[0]
    assert "measuring them again" not in lines[0] and ("not this machine's costs" in lines[0]) == (cached != "none")
    monkeypatch.setattr(machine, "load", lambda: 0.0)
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01))
    got, how = cal.calibration(target, draft, trigram, PROMPTS)
    assert how == "measured now, cached for later runs" and cal.problem(json.loads(next(tmp_path.rglob(
        "costs-*.json")).read_text()), True) == ""


def test_the_layout_choice_is_one_of_the_measured_sizes(pair, monkeypatch):
    from specdec_np.tools import costcurve
    from specdec_np.tools.costcurve import choose_slab_rows, laid_out

    target, _, _ = pair
    assert choose_slab_rows(target, sizes=(2, 4), repeats=2) in (0, 2, 4)
    assert laid_out(target, target.layout.slab_rows) is target and laid_out(target, 0).layout.slab_rows == 0
    # The one-row product: one of the core's ways, applied as the costs' layout names it (each the other's control),
    # with one BLAS thread (a busy machine's run) as measured with one, else one matrix-vector product.
    assert costcurve.choose_one_row(target, repeats=3) in ONE_ROW
    assert costcurve.choose_gemv_rows(target, sizes=(2, 3), repeats=2) in (1, 2, 3)
    alone = dict(zip(ONE_ROW, ONE_ROW[1:] + ONE_ROW[:1]))  # with one thread another way than with two
    for threads in (2, 1):
        monkeypatch.setattr(costcurve, "blas", lambda threads=threads: {"threads": threads})
        for how in ONE_ROW:
            for measured in ({}, {"target_one_row_one_thread": alone[how]}):
                layout = {"target": 4, "target_one_row": how, "target_gemv_rows": 3} | measured
                laid, _ = costcurve.apply_layout(layout, target, None)
                want = how if threads > 1 else measured.get("target_one_row_one_thread", "gemv")
                assert (laid.layout.slab_rows, laid.layout.one_row) == (4, want)
                assert laid.layout.gemv_rows == 3
                assert laid.prepared["head"].gemv_rows == (3 if laid.layout.one_row == "gemv" else 1)
    # The draft model and an EAGLE head, laid out together, each read their own entries (not the other's).
    from specdec_np import eagle

    _, draft, head = costcurve.apply_layout({"draft": 4, "draft_gemv_rows": 2, "head": 0, "head_gemv_rows": 3}, None,
                                            pair[1], eagle.random_head(target))
    assert [(m.layout.slab_rows, m.layout.gemv_rows) for m in (draft, head)] == [(4, 2), (0, 3)]


@pytest.mark.parametrize("wins,expected", [((2, 3), 3), ((), 1), ((2, 4, 6), 2), ((3, 4), 1), ((2, 3, 4, 6, 8), 8)])
def test_gemv_rows_is_the_largest_block_up_to_which_row_by_row_wins_at_every_size(pair, monkeypatch, wins, expected):
    """choose_gemv_rows' rule on made-up timings (`race`: the model's layout, then row by row): row by row for blocks
    up to the largest size at which it was faster at every size from the smallest; a tie is not a win."""
    from specdec_np.tools import costcurve

    def race(layouts, sizes, *rest):
        assert layouts[1].layout.gemv_rows == max(sizes)  # the second layout multiplies every size row by row
        return {(i, k): 1.0 if i == 0 else (0.9 if k in wins else 1.0) for i in (0, 1) for k in sizes}
    monkeypatch.setattr(costcurve, "race", race)
    assert costcurve.choose_gemv_rows(pair[0]) == expected


def test_bench_rule_pairs_compare_the_token_level_rule_of_each_trees_kind():
    """bench's rule comparisons: a sampled chain's 'chain' against 'block'; a sampled tree's
    token-level rule (verify.default_rule for how its children were drawn) against 'traversal'."""
    import dataclasses

    from specdec_np.tools.bench import rule_pairs

    nan = float("nan")
    rows = {m: choice.Choice(m, Plan(), nan, nan) for m in ("speculative", "tree", "staged")}
    rows["staged"] = choice.Choice("staged", Plan(shape="fixed", widths=(2, 1), sampled="with"), nan, nan)
    pairs = rule_pairs({"top-k": rows})
    got = {k: (a.method, a.plan.rule, b.plan.rule) for k, (a, b) in pairs.items()}
    assert got["chain of 3"] == ("speculative", "chain", "block")
    assert [v for k, v in got.items() if k.startswith("staged")] == [("staged", "recursive", "traversal")]
    assert [v for k, v in got.items() if k.startswith("tree")] == [("tree", "recursive_wor", "traversal")] * 2
    assert all(dataclasses.replace(a.plan, rule=None) == dataclasses.replace(b.plan, rule=None)
               for a, b in pairs.values())


GOOD = costs(0.01)
BAD_COSTS = {"{}": {}, "[]": [], "curves x": GOOD | {"curves": "x"},
             **{f"layout {v!r}": GOOD | {"layout": {"target": v, "draft": 0}} for v in ("abc", -5, 10**9, [])},
             "no sampled overheads": GOOD | {"overheads": {"greedy": GOOD["overheads"]["greedy"]}},
             **{f"curve {v}": GOOD | {"curves": GOOD["curves"] | {"draft": {"warm": curve(0.01, 0.1) | {4: v},
                                                                           "cold": curve(0.01, 0.1)}}}
                for v in (float("nan"), 0.0, -1.0)},
             **{f"read rate {v!r}": GOOD | {"read_gbps": v} for v in (float("nan"), float("inf"), 0.0, "20")},
             **{f"one row {v!r}": GOOD | {"layout": GOOD["layout"] | {"target_one_row": v}} for v in ("blas", 1)},
             **{f"one row, one thread {v!r}": GOOD | {"layout": GOOD["layout"] | {"target_one_row_one_thread": v}}
                for v in ("blas", 1, [])},
             **{f"gemv rows {v!r}": GOOD | {"layout": GOOD["layout"] | {"draft_gemv_rows": v}}
                for v in (0, 5, True, "2")}}


@pytest.mark.parametrize("bad", BAD_COSTS, ids=list(BAD_COSTS))
def test_a_cost_cache_of_the_wrong_shape_is_measured_again(pair, tmp_path, monkeypatch, capsys, bad):
    """A cached file that is not costs `measure_costs` could give is a cache miss: measured again and
    rewritten, said in one line naming the file; the valid file it is replaced with is read (the control)."""
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01))
    cal.calibration(target, draft, trigram, PROMPTS)
    path = next(tmp_path.rglob("costs-*.json"))
    path.write_text(json.dumps(BAD_COSTS[bad]))
    capsys.readouterr()
    got, fresh = cal.calibration(target, draft, trigram, PROMPTS)
    lines = capsys.readouterr().err.splitlines()
    assert fresh and len(lines) == 1 and str(path) in lines[0] and "measuring them again" in lines[0]
    assert cal.problem(json.loads(path.read_text()), True) == "" and cal.problem(BAD_COSTS[bad], True) != ""
    assert not cal.calibration(target, draft, trigram, PROMPTS)[1]


@pytest.mark.parametrize("where", ["XDG_CACHE_HOME a file", "/proc/nonexistent", "cache dir a file",
                                   "costs path a directory", "read-only dir", "disk full"])
def test_a_cache_that_cannot_be_written_is_said_and_the_run_goes_on(pair, tmp_path, monkeypatch, capsys, where):
    """Checked before measuring: one line naming the directory and why, and the progress line says the
    costs are for this run only; they serve this run, measured once (a second plan in the process reuses them)."""
    from specdec_np.tools import cache, writable

    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: measured.append(a[4](1, 1)) or costs(0.01))
    path = cal.cache_path("costs", {})  # a file name in the cache directory, for its directory
    if where == "XDG_CACHE_HOME a file":
        (tmp_path / "f").write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "f"))
    elif where == "/proc/nonexistent":
        monkeypatch.setenv("XDG_CACHE_HOME", "/proc/nonexistent")
    elif where == "cache dir a file":
        path.parent.write_text("")
    elif where == "costs path a directory":
        cal.calibration(target, draft, trigram, PROMPTS)
        costs_path = next(tmp_path.rglob("costs-*.json"))
        costs_path.unlink()
        costs_path.mkdir()
    elif where == "read-only dir":
        def refused(*a, **k):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(writable.tempfile, "TemporaryFile", refused)
    else:
        def full(*a, **k):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(cache, "atomic_file", full)
    capsys.readouterr()
    got, how = cal.calibration(target, draft, trigram, PROMPTS)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("note: ")]
    assert how == "measured now, for this run only" and got == costs(0.01) and len(lines) == 1
    assert f"the cache file {cache.cache_dir()}" in lines[0] and lines[0].endswith("used for this run only")
    # The progress line agrees, except where the disk fills after it (the write's failure is said after it).
    assert ("measuring this machine's costs (for this run only)" in err) == (where != "disk full")
    assert not [p for p in tmp_path.rglob("costs-*.json") if p.is_file()]
    n = len(measured)
    assert cal.calibration(target, draft, trigram, PROMPTS) == (got, "measured earlier in this run, not cached")
    assert len(measured) == n and not capsys.readouterr().err


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    from specdec_np.tools import cache

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert cache.cache_dir() == tmp_path / ".cache" / "specdec_np"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert cache.cache_dir() == tmp_path / "abs" / "specdec_np"


@pytest.mark.parametrize("load", [0.0, 1.0], ids=["quiet", "busy"])
def test_the_plan_for_a_rule_is_one_the_rule_verifies_losslessly(pair, profile, monkeypatch, capsys, load):
    """Whatever the load: the machine's best plan among those the rule verifies losslessly, else the
    constant plan drawn as the rule needs. The control: the plan chosen for no rule is not lossless for it."""
    target, draft, trigram = pair
    monkeypatch.setattr(machine, "load", lambda: load)
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(choice, "calibration", lambda *a, **k: (costs(0.01), False))
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    if load:
        monkeypatch.setattr(choice, "calibration", lambda *a, **k: (_ for _ in ()).throw(cal.Busy("busy")))
    for method in ("speculative", "tree", "staged"):
        for rule in ("point_mass", "recursive", "recursive_wor", "traversal", "chain", "block"):
            if not any(lossless(rule, method, dataclasses.replace(constant(1.0), sampled=s))
                       for s in (None, "with", "without")):
                continue  # refused by the options before anything is measured
            chosen = choice.choose(target, draft, trigram, None, 1.0, (method,), changes={"rule": rule})[method]
            assert chosen.method == method and lossless(rule, method, chosen.plan), (method, rule)
    free = choice.choose(target, draft, trigram, None, 1.0, ("staged",))["staged"]
    assert not lossless("point_mass", "staged", free.plan)


def lossless(rule, method, plan, temperature=1.0) -> bool:
    """Whether `rule` verifies `method`'s trees under `plan` losslessly (Method.lossless, verify's rules)."""
    return METHODS[method].lossless(dataclasses.replace(plan, rule=rule), temperature)


def test_a_tiny_context_is_measured_as_far_as_it_goes(monkeypatch):
    """A model of n_ctx=32: the curves and layouts at the block sizes its context holds after a prefix."""
    from specdec_np.tools.costcurve import choose_slab_rows, loop_curves

    short = random_params(dataclasses.replace(CFG, n_ctx=32), seed=1, dtype=np.float64, scale=0.5)
    curves = loop_curves(short, short, repeats=1)
    assert max(int(k) for k in curves["target"]["warm"]) == 24 and set(curves["draft"]) == {"warm", "cold"}
    assert choose_slab_rows(short, repeats=2) in (0, 2, 4, 8, 12, 16)
    tiny = random_params(dataclasses.replace(CFG, n_ctx=8), seed=1, dtype=np.float64, scale=0.5)
    assert set(loop_curves(tiny, None, repeats=1)["target"]["warm"]) == {1, 2, 3, 4, 5, 6}
    monkeypatch.setattr(cal, "choose_slab_rows", lambda model: 0)
    from specdec_np.tools import costcurve

    monkeypatch.setattr(costcurve, "choose_one_row", lambda model: "slabs")
    got = cal.measure_costs(short, short, None, [list(range(1, 30)) * 3])
    assert cal.problem(json.loads(json.dumps(got)), True) == ""
    # One row slab by slab where slabs lose from 2 rows on: the target keeps slabs for one row.
    # The draft's blocks of a few rows may be multiplied row by row (its one row is a matrix-vector product).
    assert got["layout"].pop("draft_gemv_rows") in (1, *cal.GEMV_SIZES)
    assert got["layout"] == {"target": 1, "draft": 0, "target_one_row": "slabs", "target_one_row_one_thread": "slabs"}
    # The EAGLE head's curve: its own passes after one of its own (warm) or of the target's (cold), as a draft's.
    from specdec_np import eagle

    layout, head = cal.head_costs(short, eagle.random_head(short), {"target": 0})
    # Its layout measured as the target's, kept beside the pair's where the costs take its curve (`with_curve`): its
    # one row a matrix-vector product (then maybe a few rows too), or read from its slabs.
    gemv = layout["head_one_row"] == "gemv"
    ways = {"head_one_row", "head_one_row_one_thread"}
    assert layout.keys() == {"head"} | ways | ({"head_gemv_rows"} if gemv else set())
    assert layout["head"] in ((0, 2, 4, 8, 12, 16) if gemv else (1, 2, 4, 8, 12, 16))
    assert layout["head_one_row"] in ONE_ROW and layout["head_one_row_one_thread"] in ONE_ROW
    assert layout.get("head_gemv_rows", 1) in (1, *cal.GEMV_SIZES)
    with_head = cal.with_curve(got, eagle.random_head(short), (layout, head))
    assert with_head["layout"] == got["layout"] | layout and cal.problem(with_head, True) == ""
    for bad in (-1, 5, True):  # a head's layout out of range: the costs are measured again
        assert cal.problem(with_head | {"layout": with_head["layout"] | {"head_gemv_rows": bad}}, True)
        for way in ("head_one_row", "head_one_row_one_thread"):
            assert cal.problem(with_head | {"layout": with_head["layout"] | {way: str(bad)}}, True)
    assert set(head) == {"warm", "cold"} and head["warm"].keys() == curves["draft"]["warm"].keys()
    assert all(ms > 0 for state in head.values() for ms in state.values())


def blocks(result):  # what each step drafted and verified
    return [(s.tokens, s.target_block, s.draft_blocks) for s in result.stats.steps]


def test_the_constant_plan_is_greedys_and_a_profiled_sampled_shape(pair):
    """constant(0) is Plan(); constant(T > 0) draws its trees from the draft, each method's part a
    candidate of the shipped profile's sampled setting; generate's default is the constant of its temperature."""
    target, draft, trigram = pair
    assert constant(0.0) == Plan() and constant(1.0).sampled == "without" and constant(1.0).shape == "fixed"
    sampled = constant(0.7)
    shipped = acceptance.load(acceptance.PROFILE_FILE)["settings"]["sampled"]
    for method, fields in (("speculative", ("chain",)), ("lookup", ("lookup_chains",)), ("tree", ("sampled", "widths")),
                           ("staged", ("sampled", "widths", "guess_len", "guess_rows", "copy_len"))):
        assert {"method": method, "shape": {f: getattr(sampled, f) for f in fields}} in \
            [{"method": r["method"], "shape": r["shape"]} for r in shipped], method
    kw = dict(method="staged", draft=draft, ngram=trigram, top_k=10, seed=3, eos=None)
    for temperature in (0.0, 1.0):
        kw["top_k"] = 10 if temperature else None
        default = generate(target, PROMPTS[0], 16, temperature=temperature, **kw)
        same = generate(target, PROMPTS[0], 16, plan=constant(temperature), temperature=temperature, **kw)
        assert default.tokens == same.tokens and blocks(default) == blocks(same)
    other = generate(target, PROMPTS[0], 16, plan=Plan(), temperature=1.0, **kw)  # the control: another plan
    assert blocks(other) != blocks(default)


def test_a_profile_without_the_setting_and_a_broken_journal(pair, profile, tmp_path, monkeypatch, capsys):
    """A profile with only the greedy setting: the constant plan at T > 0, said in one line. A journal
    line that is not a record (a write cut short) is counted again, said in one line naming the file."""
    target, draft, trigram = pair
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(choice, "calibration", lambda *a, **k: (costs(0.01), False))
    greedy_only = dict(profile, settings={"greedy": profile["settings"]["greedy"]})
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: greedy_only)
    with pytest.raises(ValueError, match="no sampled setting"):
        choice.fastest(greedy_only, costs(0.01), 1.0)
    chosen = choice.choose(target, draft, trigram, None, 1.0, ("tree",))["tree"]
    lines = capsys.readouterr().err.splitlines()
    assert chosen.plan == constant(1.0) and len(lines) == 1 and "no sampled profile" in lines[0]
    assert not choice.choose(target, draft, trigram, None, 0.0, ("lookup",))["lookup"].constant
    journal = tmp_path / "journal.jsonl"
    grid = {"greedy": GRID[:2]}
    first = measure_journalled(pair, grid, journal)
    lines = journal.read_text().splitlines()
    journal.write_text(lines[0] + "\n" + lines[1][:20] + "\n")
    capsys.readouterr()
    assert measure_journalled(pair, grid, journal) == first
    err = capsys.readouterr().err
    assert str(journal) in err and "counted again" in err


def test_whether_a_rule_goes_with_a_method_does_not_depend_on_the_load(monkeypatch, capsys):
    """The command line, busy and quiet (costs substituted): --method with --rule at T=1 runs either way,
    with a plan the rule verifies losslessly; --recalibrate on a busy machine is an error naming it."""
    from specdec_np.tools.cli import main

    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    args = ["generate", "def f(x):", "--temperature", "1", "--top-k", "50", "--max-new-tokens", "4", "--stats"]
    for load, origin in ((1.0, "the constant plan"), (0.0, "")):
        monkeypatch.setattr(machine, "load", lambda load=load: load)
        monkeypatch.setattr(choice, "calibration", lambda *a, **k: (costs(0.01), False))
        if load:
            monkeypatch.setattr(choice, "calibration", lambda *a, **k: (_ for _ in ()).throw(cal.Busy("busy")))
        for method, rule in (("staged", "point_mass"), ("staged", "recursive_wor"), ("tree", "chain")):
            assert main([*args, "--method", method, "--rule", rule]) == 0, (load, method, rule)
            assert f"method {method}: " in (err := capsys.readouterr().err) and origin in err
    monkeypatch.setattr(machine, "load", lambda: 1.0)
    monkeypatch.setattr(choice, "calibration", cal.calibration)
    assert main([*args, "--method", "staged", "--recalibrate"]) == 2
    assert "--recalibrate: this machine is busy" in capsys.readouterr().err


# ----------------------------------------------------------------------------- eagle: its head's plans (issue 61)

def record(method, shape, tokens, target_k, head_passes):  # a count record of 100 steps, each one cold target pass
    return {"method": method, "shape": shape, "tokens": tokens, "steps": 100, "draft_dists": head_passes,
            "ngram_queries": 0, "target": {"cold": {target_k: 100}, "warm": {}},
            "draft": {"cold": {1: 100}, "warm": {1: head_passes - 100} if head_passes > 100 else {}}}


SHORT, DEEP = {"shape": "fixed", "widths": (1,)}, {"shape": "fixed", "widths": (1, 1, 1, 1)}


def eagle_profile(head="H"):
    """Plain decoding; a tree and eagle, each a short chain (fewer tokens, one drafting pass a step) and a deep one
    (more tokens, four passes): cheap drafting passes make the deep chain the faster, dear ones the short."""
    records = [{"method": "ar", "shape": {}, "tokens": 100, "steps": 100, "draft_dists": 0, "ngram_queries": 0,
                "target": {"cold": {}, "warm": {1: 100}}, "draft": {"cold": {}, "warm": {}}}]
    records += [record(m, SHORT, 150, 2, 100) for m in ("tree", "eagle")]
    records += [record(m, DEEP, 250, 5, 400) for m in ("tree", "eagle")]
    return {"models": "pair", "head": head, "settings": {"greedy": records}}


def with_head_curve(per_pass, key="H"):  # key: the digest of the head the curve was measured for (`priced`)
    c = costs(0.01)
    return c | {"curves": c["curves"] | {"head": {s: curve(0.0, per_pass) for s in ("warm", "cold")}}, "head": key}


def test_eagles_plan_is_priced_on_the_heads_curve():
    """The fastest eagle plan of its records, with the head's curve in the draft's place: a cheap head drafts the deep
    chain, a dear one the short; the draft model's tree (the same counts, priced on the draft's cheap curve) keeps the
    deep chain either way. Without a head curve or without has_head, no eagle record is priced."""
    profile = eagle_profile()
    cheap, dear = with_head_curve(0.01), with_head_curve(5.0)
    assert choice.fastest(profile, cheap, 0.0, ("eagle",), has_head=True).plan == Plan(**DEEP)
    assert choice.fastest(profile, dear, 0.0, ("eagle",), has_head=True).plan == Plan(**SHORT)
    for c in (cheap, dear):
        assert choice.fastest(profile, c, 0.0, ("tree",)).plan == Plan(**DEEP)
        assert choice.fastest(profile, c, 0.0, ("tree", "eagle"), has_head=True).method in ("tree", "eagle")
    for c, has_head in ((cheap, False), (costs(0.01), True)):
        with pytest.raises(ValueError, match="no candidate of"):
            choice.fastest(profile, c, 0.0, ("eagle",), has_head=has_head)


def test_choose_gives_eagle_its_heads_plan_else_the_constant_plan_and_why(pair, monkeypatch):
    """choose prices eagle's records with the head's curve (measured with `with_head` where the costs lack it) when
    the profile's eagle records are that head's; a profile with none, or another head's, leaves eagle the constant
    plan with the reason, for which it runs tree's plan (its draft twin's, `on_twins_tree`), said: what bench, the
    demo and the command line show."""
    from specdec_np import eagle

    target, draft, trigram = pair
    head = eagle.random_head(target)
    profiles = {"now": eagle_profile()}
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profiles["now"])
    monkeypatch.setattr(acceptance, "shipped", lambda: profiles["now"] | {"models": acceptance.pair_key(*pair)})
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(acceptance, "head_key", lambda h: "H" if isinstance(h, eagle.Head) else pytest.fail("not a head"))
    measured = []
    monkeypatch.setattr(cal, "head_curves", lambda t, h, layout: measured.append(h) or {
        s: curve(0.0, per_pass["now"]) for s in ("warm", "cold")})

    def pick(**kw):
        return choice.choose(target, draft, trigram, None, 0.0, ("tree", "eagle"), costs=costs(0.01), **kw)
    per_pass = {"now": 0.01}
    got = pick(head=head)
    assert got["eagle"].method == "eagle" and got["eagle"].plan == Plan(**DEEP) and not got["eagle"].constant
    assert "measured plan" in got["eagle"].reason() and measured == [head]  # the curve the costs lacked
    cal.MEASURED.clear()
    per_pass["now"] = 5.0
    got = pick(head=head)
    assert got["eagle"].plan == Plan(**SHORT) and got["tree"].plan == Plan(**DEEP)
    tree_plan = got["tree"].plan
    for profile, why in ((eagle_profile(head="another"), "holds no eagle plans of this EAGLE head"),
                         ({"models": "pair", "settings": {"greedy": [r for r in eagle_profile()["settings"]["greedy"]
                                                                     if r["method"] != "eagle"]}},
                          "the acceptance profile holds no eagle plans")):
        profiles["now"] = profile
        got = pick(head=head)
        assert got["eagle"].constant.endswith(why + ")") and got["eagle"].method == "eagle"
        assert got["tree"].plan == tree_plan and not got["tree"].constant  # the others as before
        assert got["eagle"].plan == tree_plan and f"tree's plan, {choice.SAME_TREE} (" in got["eagle"].reason()
    assert pick()["eagle"].constant.endswith("(the constant plan: no EAGLE head to measure)")
    # Another pair than the shipped profile's: eagle is not measured (a first-use profile holds no eagle plans).
    monkeypatch.setattr(acceptance, "shipped", lambda: profiles["now"] | {"models": "another pair"})
    got = choice.choose(target, draft, trigram, None, 0.0, ("eagle",), costs=costs(0.01), head=head)["eagle"]
    assert got.constant == f"tree's plan, {choice.SAME_TREE} (the constant plan: the acceptance profile holds no " \
                           "eagle plans)" and got.plan == tree_plan
    profiles["now"] = eagle_profile()
    got = pick(head=head, plan="default")
    assert got["eagle"].constant == f"tree's plan, {choice.SAME_TREE} (the constant plan, as --plan default asks)"
    assert got["eagle"].plan == got["tree"].plan == choice.constant(0.0)
    # The fastest of all methods (the machine plan) is eagle where its head's priced plan is fastest; a dear head, no
    # head or another head's records leave it the draft model's, nothing said.
    def machine(costs, **kw):
        return choice.choose(target, draft, trigram, None, 0.0, (None,), costs=costs, **kw)[None]
    got = machine(with_head_curve(1e-3), head=head)
    assert (got.method, got.plan, got.among, got.constant) == ("eagle", Plan(**DEEP), (), "")
    for kw, why in ((dict(costs=with_head_curve(5.0), head=head), "dear"), (dict(costs=with_head_curve(1e-3)), "none"),
                    (dict(costs=with_head_curve(1e-3), head=head), "another")):
        profiles["now"] = eagle_profile(head="another" if why == "another" else "H")
        got = machine(**kw)
        assert got.method == "tree" and got.plan == Plan(**DEEP) and not got.constant, why
    # A curve kept for another head (costs cached before the head was retrained) is measured again for this one.
    measured.clear(), cal.MEASURED.clear(), per_pass.update(now=1e-3)
    profiles["now"] = eagle_profile()
    assert machine(with_head_curve(5.0, key="an older head"), head=head).method == "eagle" and measured == [head]


def test_make_profile_merges_one_methods_records_into_the_profile(pair, tmp_path, monkeypatch):
    """--methods eagle counts eagle's candidates alone, with the head as its draft, and merges them into the
    existing profile: its other records and fields byte for byte, the head named; the merged file is a profile
    whose eagle records choose reads. A profile of other models is refused before counting."""
    from specdec_np import eagle
    from specdec_np.tools.cache import write_json

    target, draft, trigram = pair
    head = eagle.random_head(target)
    grid = {"greedy": GRID + [("tree", {"shape": "fixed", "widths": (2, 1)})],
            "sampled": [("ar", {}), ("tree", {"sampled": "without", "widths": (2, 1)})]}
    grid = {s: g + [("eagle", shape) for m, shape in g if m == "tree"] for s, g in grid.items()}
    weights = tmp_path / "weights"
    weights.mkdir()
    dest = weights / "profile.json"
    old = acceptance.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, seeds=2, grid=grid)  # no head
    assert not any(r["method"] == "eagle" for rs in old["settings"].values() for r in rs) and "head" not in old
    acceptance.save(old, dest)
    before = json.loads(dest.read_text())
    monkeypatch.setattr(make_profile, "WEIGHTS_DIR", weights)
    monkeypatch.setattr(make_profile, "load_embedded", lambda: (target, draft, trigram, None))
    monkeypatch.setattr(make_profile, "load_head", lambda target: head)
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(acceptance, "candidates", lambda setting, quick=False: grid[setting])
    decoded = []
    monkeypatch.setattr(acceptance, "generate", lambda *a, **k: decoded.append((a[3], a[4])) or generate(*a, **k))
    assert make_profile.main(["--methods", "eagle", "--out", str(tmp_path / "j")]) == 0
    assert decoded and all(m == "eagle" and d is head for m, d in decoded)  # eagle alone, drafted by the head
    after = json.loads(dest.read_text())
    assert after["head"] == acceptance.head_key(head)
    for setting, records in before["settings"].items():
        kept = [r for r in after["settings"][setting] if r["method"] != "eagle"]
        assert kept == records
        assert [r["shape"] for r in after["settings"][setting] if r["method"] == "eagle"] == \
            [json.loads(json.dumps(s)) for m, s in grid[setting] if m == "eagle"]
    expected = dest.parent / "expected.json"  # the old file with the eagle records appended and the head: byte for byte
    write_json(expected, before | {"head": after["head"], "settings": {
        s: rs + [r for r in after["settings"][s] if r["method"] == "eagle"] for s, rs in before["settings"].items()}})
    assert expected.read_text() == dest.read_text()
    merged = acceptance.load(dest)
    eagles = [r for r in merged["settings"]["greedy"] if r["method"] == "eagle"]
    # The head is not the draft: its counts are its own (a control that the head drafted them).
    trees = [r for r in merged["settings"]["greedy"] if r["method"] == "tree"]
    assert eagles and [r["shape"] for r in eagles] == [r["shape"] for r in trees] and eagles != trees
    assert choice.fastest(merged, with_head_curve(0.01), 0.0, ("eagle",), has_head=True).method == "eagle"
    # Other methods merged: the head the eagle records are of is still the one named.
    assert make_profile.merged(after, {"settings": {}, "head": "another"}, ["tree"]) == after
    assert make_profile.merged(after, {"settings": {}, "head": "another"}, ["eagle"])["head"] == "another"
    # Another pair's profile: refused before anything is counted.
    decoded.clear()
    write_json(dest, before | {"models": "another pair"})
    with pytest.raises(SystemExit):
        make_profile.main(["--methods", "eagle", "--out", str(tmp_path / "j")])
    with pytest.raises(SystemExit):
        make_profile.main(["--methods", "eagles", "--out", str(tmp_path / "j")])
    assert not decoded


def test_the_heads_curve_is_measured_once_and_cached_with_the_pairs_costs(pair, tmp_path, monkeypatch):
    """calibration(head=...) adds the EAGLE head's curve to cached costs that lack it, measured once and written to
    their cache file: a new process reads it there; without a head the costs are the pair's as before. A busy
    machine measures no head curve (Busy), and keeps none."""
    from specdec_np import eagle

    target, draft, trigram = pair
    head = eagle.random_head(target)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    pair_costs = {"version": cal.CALIBRATION_VERSION, "machine": cal.machine(), "target_scale": {}} | costs(0.01)
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: pair_costs)
    measured = []
    head_curve = {s: curve(0.0, 0.5) for s in ("warm", "cold")}
    monkeypatch.setattr(cal, "head_curves", lambda t, h, layout: measured.append(h) or head_curve)
    got, _ = cal.calibration(target, draft, trigram, PROMPTS)
    assert "head" not in got["curves"] and not measured
    monkeypatch.setattr(cal, "MEASURED", {})  # a new process
    monkeypatch.setattr(machine, "load", lambda: 3.0)  # busy: nothing measured, the cached costs kept as they are
    with pytest.raises(cal.Busy, match="EAGLE head"):
        cal.calibration(target, draft, trigram, PROMPTS, head=head)
    assert "head" not in json.loads(cal.costs_path(target, draft, trigram).read_text())["curves"] and not measured
    monkeypatch.setattr(machine, "load", lambda: 0.0)
    got, how = cal.calibration(target, draft, trigram, PROMPTS, head=head)
    assert how == "" and got["curves"]["head"] == head_curve and measured == [head]
    monkeypatch.setattr(cal, "MEASURED", {})  # a new process: read from the cache file, not measured again
    got, _ = cal.calibration(target, draft, trigram, PROMPTS, head=head)
    assert json.loads(json.dumps(got["curves"]["head"])) == json.loads(json.dumps(head_curve)) and measured == [head]
    assert cal.problem(got, True) == ""
    got["curves"]["head"]["warm"] = {1: -1.0}  # a cached head curve out of range: not this machine's costs
    assert "curves out of range" in cal.problem(got, True)
