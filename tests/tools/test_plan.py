"""The tools' plan: the acceptance profile's counts, the choice on a machine's costs, the cache of
those costs in the user's cache directory, and how busy the machine is while they are measured."""

import os
import re

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.decode import generate
from specdec_np.gpt2 import GPT2Config, random_params
from specdec_np.plan import Plan
from specdec_np.tools import calibration as cal
from specdec_np.tools import choice, machine
from specdec_np.tools import acceptance as profiles
from specdec_np.tools.costmodel import OVERHEADS, pads
from specdec_np.tools.progress import Progress

CFG = GPT2Config(n_vocab=30, n_ctx=64, n_embd=16, n_layer=1, n_head=2)
PROMPTS = [[1, 2, 3, 1, 2], [4, 5, 6, 7], [3, 3, 9, 1, 2, 3]]
GRID = [("ar", {}), ("lookup", {"chain": 3}), ("speculative", {"chain": 2}),
        ("staged", {"shape": "fixed", "widths": (2, 1), "guess_len": 1, "guess_rows": 2, "copy_len": 3})]


@pytest.fixture(scope="module")
def pair():
    target = random_params(CFG, seed=1, dtype=np.float64, scale=0.5)
    draft = random_params(CFG, seed=1, dtype=np.float64, scale=0.5)  # the same model: drafts are accepted
    return target, draft, ngram.fit(np.random.default_rng(0).integers(0, 30, 500), 30)


@pytest.fixture(scope="module")
def profile(pair):
    target, draft, trigram = pair
    grid = {"greedy": GRID, "sampled": [(m, dict(s, sampled="without") if m == "staged" else s) for m, s in GRID]}
    return profiles.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, seeds=2, grid=grid)


def curve(per_token, fixed):  # ms of a pass of k tokens: fixed + per_token * k
    return {k: fixed + per_token * k for k in (1, 2, 4, 8, 16, 32)}


def costs(per_token, fixed=1.0):
    c = curve(per_token, fixed)
    return {"curves": {"target": {"warm": c, "cold": c}, "draft": {"warm": curve(0.01, 0.1), "cold": curve(0.01, 0.1)}},
            "overheads": {s: dict.fromkeys(OVERHEADS, 0.0) for s in ("greedy", "sampled")}}


def test_profile_counts_what_each_run_did_past_its_prefill(pair):
    target, draft, trigram = pair
    ar = generate(target, PROMPTS[0], 10, "ar", eos=None)
    c = profiles.counts(ar.stats)
    assert c == {"tokens": 9, "steps": 9, "draft_dists": 0, "ngram_queries": 0, "target": {"cold": {}, "warm": {1: 9}},
                 "draft": {"cold": {}, "warm": {}}}
    spec = generate(target, PROMPTS[1], 10, "speculative", draft, plan=Plan(chain=2), eos=None)
    c = profiles.counts(spec.stats)
    steps = spec.stats.steps[1:]
    assert c["tokens"] == sum(len(s.tokens) for s in steps) and c["steps"] == len(steps)
    assert c["target"] == {"cold": {3: len(steps)}, "warm": {}}  # the draft ran before every pass
    assert sum(c["draft"]["cold"].values()) == len(steps)  # each step's first draft pass is cold
    assert sum(c["draft"]["warm"].values()) == len(steps)  # a chain of 2: one more pass per step
    assert c["draft_dists"] == 2 * len(steps)  # one distribution per pass: the root's, then its child's
    assert profiles.counts(spec.stats, skip_first=False)["tokens"] == len(spec.tokens)


def test_the_plan_drafts_only_where_drafting_pays(profile):
    """Blocks nearly free (memory-bound): a drafting plan wins; blocks costing k times a single
    token (compute-bound): plain decoding is the plan, never a slower drafting one."""
    for temperature in (0.0, 1.0):
        cheap = choice.choose(profile, costs(per_token=0.01), temperature)
        assert cheap.method != "ar" and cheap.speedup >= choice.MARGIN
        dear = choice.choose(profile, costs(per_token=5.0, fixed=0.0), temperature)
        assert dear.method == "ar" and dear.plan == Plan()
        # One method's best plan is still available when asked for (here slower than plain decoding).
        spec = choice.choose(profile, costs(per_token=5.0, fixed=0.0), temperature, "speculative")
        assert spec.method == "speculative" and spec.plan.chain == 2 and spec.speedup < 1
    with pytest.raises(ValueError, match="no candidate"):
        choice.choose(profile, costs(0.01), 0.0, "tree")  # not in this profile
    # Without a draft model or an n-gram the plan is made of what can run.
    assert choice.choose(profile, costs(0.01), 0.0, has_draft=False).method in ("ar", "lookup")


def test_a_profile_round_trips_through_json(tmp_path, profile):
    profiles.save(profile, tmp_path / "p.json")
    assert profiles.load(tmp_path / "p.json") == profile
    with pytest.raises(ValueError, match="not a specdec_np acceptance profile"):
        profiles.from_json({"format": "something else"})


def test_costs_are_cached_in_the_users_cache_directory(pair, tmp_path, monkeypatch):
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    measured = []

    def fake_measure(*args, **kw):
        measured.append(1)
        return {"version": cal.CALIBRATION_VERSION, "n": len(measured)}

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
    assert choice.choose(profile, costs(0.01), 1.0).method != choice.choose(profile, costs(5.0, 0.0), 1.0).method


def test_an_interrupted_profile_resumes_from_its_journal(pair, profile, tmp_path, monkeypatch):
    target, draft, trigram = pair
    grid = {"greedy": GRID[:2]}
    journal = tmp_path / "journal.jsonl"
    first = profiles.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, grid=grid, journal=journal)
    assert len(journal.read_text().splitlines()) == 2

    def no_decoding(*args, **kw):
        raise AssertionError("a journalled candidate was decoded again")

    with monkeypatch.context() as m:
        m.setattr(profiles, "generate", no_decoding)
        again = profiles.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, grid=grid, journal=journal)
    assert again == first and first["settings"]["greedy"] == profile["settings"]["greedy"][:2]
    # A line another version of the code wrote (its counts may lack a field) is counted again.
    lines = journal.read_text().splitlines()
    journal.write_text(lines[0].replace(f'"version": {profiles.VERSION}', '"version": 0') + "\n" + lines[1] + "\n")
    decoded = []  # (method, plan) of each candidate decoded: generate's 4th and 7th arguments
    monkeypatch.setattr(profiles, "generate", lambda *a, **k: decoded.append((a[3], a[6])) or generate(*a, **k))
    again = profiles.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, grid=grid, journal=journal)
    assert again == first and set(decoded) == {(GRID[0][0], Plan(**GRID[0][1]))}


def test_a_profile_counted_in_worker_processes_is_the_same(pair, profile, tmp_path):
    target, draft, trigram = pair
    grid = {"greedy": GRID, "sampled": [(m, dict(s, sampled="without") if m == "staged" else s) for m, s in GRID]}
    journal, seen, env = tmp_path / "journal.jsonl", [], os.environ.get("OPENBLAS_NUM_THREADS")
    got = profiles.measure(target, draft, trigram, PROMPTS, max_new_tokens=12, seeds=2, grid=grid, journal=journal,
                           jobs=2, progress=lambda done, total: seen.append((done, total)))
    assert got == profile  # in the grid's order, whichever worker finished first
    assert len(journal.read_text().splitlines()) == 8 and seen[-1] == (8, 8)
    assert os.environ.get("OPENBLAS_NUM_THREADS") == env  # the workers' setting, not this process's


def test_costs_measured_on_a_busy_machine_are_used_once_not_cached(pair, tmp_path, monkeypatch, capsys):
    """Timings taken while other processes use the CPU would mislead every later run: they come
    with a note and serve this run only; a quiet machine's are cached and reused. Where the
    system's CPU time is unknown, the load average decides."""
    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    monkeypatch.setattr(cal, "measure_costs",
                        lambda *a, **k: measured.append(1) or {"version": cal.CALIBRATION_VERSION, "n": len(measured)})

    def others_use(cores):  # snapshots (all CPU s, own CPU s, wall s) over 10 s: own 15 s, others `cores`
        snaps = iter([(100.0, 50.0, 0.0), (100.0 + 15 + 10 * cores, 65.0, 10.0)])
        for module in (cal, machine):  # calibration's snapshot at the start, busy_warning's at the end
            monkeypatch.setattr(module, "cpu_times", lambda: next(snaps))

    others_use(1.0)
    got, fresh = cal.calibration(target, draft, trigram, PROMPTS)
    assert fresh and got["n"] == 1 and "other processes used 1.0" in got["busy"]  # marked: no plan is chosen from it
    assert "not cached" in (err := capsys.readouterr().err) and "other processes used 1.0" in err
    others_use(machine.BUSY_CORES / 2)
    assert cal.calibration(target, draft, trigram, PROMPTS)[0]["n"] == 2  # measured again: nothing was cached
    assert capsys.readouterr().err == ""
    assert cal.calibration(target, draft, trigram, PROMPTS) == ({"version": cal.CALIBRATION_VERSION, "n": 2}, False)
    # A window too short to count ticks in says nothing (a cached or fake measurement takes no time).
    snaps = iter([(100.0, 50.0, 0.0), (100.02, 50.0, 0.001)])
    monkeypatch.setattr(machine, "cpu_times", lambda: next(snaps))
    assert machine.busy_warning(machine.cpu_times()) == ""
    # No /proc/stat: the load average.
    monkeypatch.setattr(machine, "cpu_times", lambda: None)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (cores + 3.0, 0.0, 0.0))
    assert "not cached" in machine.busy_warning(None) and "load" in machine.busy_warning(None)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.2, 0.0, 0.0))
    assert machine.busy_warning(None) == ""


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
    monkeypatch.setattr(profiles, "generate", lambda *a, **k: runs.append((len(a[1]), a[2])) or generate(*a, **k))
    slow = costs(per_token=0.0, fixed=400.0)  # a pass of 400 ms: the smallest profile
    got = choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "greedy", slow)
    n_prompts, tokens = choice.PROFILE_SIZES[-1]
    assert set(got["settings"]) == {"greedy"} and (got["prompts"], got["max_new_tokens"]) == (n_prompts, tokens)
    assert {r[1] for r in runs} == {tokens} and len(runs) == n_prompts * len(got["settings"]["greedy"])
    assert {r["method"] for r in got["settings"]["greedy"]} == {"ar", "lookup", "speculative", "tree", "staged"}
    assert "first run only" in capsys.readouterr().err
    assert choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "greedy", slow) == got
    assert len(runs) == n_prompts * len(got["settings"]["greedy"])  # the second time from the cache
    choice.acceptance_profile(target, draft, trigram, PROMPTS * 2, "sampled", slow)  # the other setting: measured
    assert len(runs) > n_prompts * len(got["settings"]["greedy"])
    assert len(list((tmp_path / "specdec_np").glob("profile-*.json"))) == 2


def test_a_busy_machine_gets_the_fallback_plan_and_one_blas_thread(pair, profile, tmp_path, monkeypatch, capsys):
    """Busy when the tools start: BLAS gets one thread; busy while measuring (or too slow to finish):
    no plan is chosen from those timings, the machine's choice is prompt lookup (greedy) or plain
    decoding (sampling), said in one line, and nothing is cached."""
    from specdec_np.tools import blas

    target, draft, trigram = pair
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "busy_now", lambda seconds=0.1: "other processes use 1.0 of its 2 cores")
    monkeypatch.setattr(machine, "_settled", None)  # not yet looked at in this process
    threads = blas.blas()["threads"]
    try:
        assert "1.0 of its 2 cores" in machine.settle_threads() and blas.blas()["threads"] == 1
        monkeypatch.setattr(machine, "busy_now", lambda seconds=0.1: "")
        assert "1.0 of its 2 cores" in machine.settle_threads()  # looked at once per process
    finally:
        blas.use_threads(threads)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(profiles, "calibration_prompts", lambda enc: PROMPTS)
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01))
    monkeypatch.setattr(cal, "busy_warning", lambda start: "note: this machine was busy (others used 1.0)")
    for temperature, method in ((0.0, "lookup"), (1.0, "ar")):
        chosen = choice.plan_for(target, draft, trigram, None, temperature)
        assert (chosen.method, chosen.plan, chosen.layout) == (method, Plan(), {})
        assert chosen.origin.startswith("not measured") and "busy" in capsys.readouterr().err
        assert choice.plan_for(target, draft, trigram, None, temperature, method="tree").method == "tree"
    assert not list(tmp_path.rglob("costs-*.json"))

    def slow(*a, **k):
        raise cal.Busy("measuring took over 30 s")
    monkeypatch.setattr(cal, "measure_costs", slow)
    assert choice.plan_for(target, draft, trigram, None, 0.0).origin == \
        "not measured: the machine was busy"
    assert "too busy to measure" in capsys.readouterr().err
    # The control: a quiet measurement gives a measured plan with its layout.
    monkeypatch.setattr(cal, "measure_costs", lambda *a, **k: costs(0.01) | {"layout": {"target": 4, "draft": 0}})
    monkeypatch.setattr(cal, "busy_warning", lambda start: "")
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    chosen = choice.plan_for(target, draft, trigram, None, 0.0)
    padding = pads(costs(0.01)["curves"])  # the padding tables of the measured cost curves
    assert chosen.origin.startswith("this machine's") and chosen.layout == {"target": 4, "draft": 0} | padding
    laid_target, laid_draft = chosen.models(target, draft)
    assert (laid_target.slab_rows, laid_draft.slab_rows) == (4, 0) and laid_target.params is target.params
    assert (laid_target.padding, laid_draft.padding) == (padding["target_pad"], padding["draft_pad"])


def test_measuring_stops_past_its_time(pair):
    target, draft, trigram = pair
    with pytest.raises(cal.Busy, match="over 0 s"):
        cal.measure_costs(target, draft, trigram, PROMPTS, seconds=0)


def test_the_cost_cache_key_names_the_blas_kernel_and_threads():
    from specdec_np.tools import blas

    m = machine.machine()
    assert set(m["blas"]) == {"library", "version", "kernel", "threads"} and m["blas"]["threads"] >= 1
    assert m["blas"]["kernel"] in machine.machine_name()
    threads = blas.blas()["threads"]
    try:
        blas.use_threads(1)
        one = machine.machine()
    finally:
        blas.use_threads(threads)
    assert one["blas"]["threads"] == 1 and (threads == 1 or one != machine.machine())


def test_the_layout_choice_is_one_of_the_measured_sizes(pair):
    from specdec_np.tools.costcurve import choose_slab_rows, laid_out

    target, _, _ = pair
    assert choose_slab_rows(target, sizes=(2, 4), repeats=2) in (0, 2, 4)
    assert laid_out(target, target.slab_rows) is target and laid_out(target, 0).slab_rows == 0


def test_bench_rule_pairs_compare_the_token_level_rule_of_each_trees_kind():
    """bench's rule comparisons: a sampled chain's 'chain' against 'block'; a sampled tree's
    token-level rule (verify.LOSSLESS's default for how its children were drawn) against 'traversal'."""
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
    assert all(dataclasses.replace(a.plan, rule=None) == dataclasses.replace(b.plan, rule=None) for a, b in pairs.values())
