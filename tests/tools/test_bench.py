"""bench: its rule comparisons and its reading of prompts."""

import json
from pathlib import Path

import pytest

from specdec_np.decode import generate
from specdec_np.tools import bench
from specdec_np.tools.choice import SAME_TREE

from helpers import head_race_profile, pass_curve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_bench_rules_rows(tmp_path, monkeypatch):
    """`bench --rows rules`: each comparison runs the token-level rule and the new one on the same shapes (priced on
    made-up costs: what is checked here is the rows, not this machine's figures)."""
    made_up_costs(monkeypatch)
    prompts = FIXTURES / "prompts.jsonl"
    with pytest.raises(ValueError, match="top-k"):
        bench.main(["--prompts", str(prompts), "--rows", "rules", "--settings", "greedy"])
    assert bench.main(["--prompts", str(prompts), "--limit", "1", "--max-new-tokens", "8", "--rows", "rules",
                       "--settings", "top-k", "--plan", "default", "--out", str(tmp_path)]) == 0
    rules = json.loads((tmp_path / "results.json").read_text())["rules"]
    assert {"chain of 3", "chain of 8"} <= set(rules) and len(rules) >= 4
    for name, r in rules.items():
        assert list(r["rules"]) == (["chain", "block"] if name.startswith("chain") else ["recursive_wor", "traversal"])
        for ratio, low, high in (r["gain_tokens_per_target_pass"], r["gain_tokens_per_s"]):
            assert low <= ratio <= high
    assert "verification rules side by side" in (tmp_path / "results.md").read_text()


def no_measuring(*args, **kwargs):
    raise AssertionError("measured before the check")


def one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


@pytest.mark.parametrize("out, needle", [
    ("/proc/x", "--out /proc/x: cannot write in /proc"),
    ("FILE/sub", "--out {tmp}/FILE/sub: {tmp}/FILE is a file"),
    ("FILE", "--out {tmp}/FILE: {tmp}/FILE is a file"),
])
def test_an_out_that_cannot_be_written_is_named_before_any_measuring(tmp_path, capsys, monkeypatch, out, needle):
    """Issue 45: `--out` under /proc or under a regular file is one line naming --out, not a bare errno."""
    from specdec_np.tools.cli import main

    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    monkeypatch.setattr(bench, "calibration", no_measuring)
    (tmp_path / "FILE").write_text("x")
    out = out if out.startswith("/") else str(tmp_path / out)
    assert main(["bench", "--prompts", str(FIXTURES / "prompts.jsonl"), "--out", out]) == 2
    assert needle.format(tmp=tmp_path) in one_error_line(capsys)


@pytest.mark.parametrize("args, needle", [(["--settings", "greedy,beam"], "--settings greedy,beam: choose from"),
                                          (["--rows", "all", "--settings", "greedy"],
                                           "--rows all applies to top-k only: add top-k to --settings"),
                                          (["--results", "/proc/results.md"], "--results /proc/results.md: cannot "
                                                                              "write in /proc")])
def test_bench_options_named_in_their_errors(capsys, monkeypatch, args, needle):
    from specdec_np.tools.cli import main

    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    assert main(["bench", *args]) == 2
    assert needle in one_error_line(capsys)


@pytest.mark.parametrize("args, needle", [
    (["--settings", "greedy", "--seeds", "2"], "--seeds 2 applies to top-k only: add top-k to --settings"),
    (["--settings", "greedy,greedy"], "--settings greedy,greedy: choose from greedy, top-k, each once"),
    (["--out", ""], "--out is empty: give a directory name"),
    (["--out", " "], "--out is empty: give a directory name"),
    (["--results", ""], "--results is empty: give a file name"),
    (["--curves", "--limit", "3", "--plot"], "--curves only measures and prints the cost curves: --prompts, --limit, "
                                             "--plot would change nothing"),
])
@pytest.mark.parametrize("load", [0.0, 1.0], ids=["quiet", "busy"])
def test_bench_refuses_what_it_would_ignore_and_checks_options_before_the_load(capsys, monkeypatch, args, needle,
                                                                               load):
    """Issue 53: options that would do nothing are one-line errors, on a busy machine too (options first)."""
    from specdec_np.tools import machine
    from specdec_np.tools.cli import main

    monkeypatch.setattr(machine, "load", lambda: load)
    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    assert main(["bench", "--prompts", str(FIXTURES / "prompts.jsonl"), *args]) == 2
    assert needle in one_error_line(capsys)


def cannot_write(monkeypatch):
    """A clone (and working directory) where nothing can be written: root may write anywhere, so simulated."""
    from specdec_np.tools import writable

    def refused(*a, dir=None, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(writable.tempfile, "TemporaryFile", refused)


@pytest.mark.parametrize("command, args, needle", [
    ("bench", ["--settings", "greedy,greedy"], "--settings greedy,greedy"),
    ("bench", ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    ("bench", ["--prompts", "missing.jsonl"], "--prompts missing.jsonl"),
    ("bench", ["--prompts", str(FIXTURES / "prompts.jsonl")], "--out out/bench: cannot write in "),
    ("trace", ["--top-k", "0", "--temperature", "1"], "--top-k 0 must be an integer >= 1"),
    ("trace", ["--method", "tree", "--copy-len", "3"], "--copy-len does nothing"),
    ("trace", [], "--out trace.html: cannot write in .: Permission denied"),
])
def test_in_a_clone_that_cannot_be_written_the_options_are_checked_first(capsys, monkeypatch, command, args, needle):
    """Issue 53: bench's and trace's default --out lie in the clone; where it cannot be written, an option's
    own error comes first, and the default --out is a one-line error naming it, before any work."""
    from specdec_np.tools import cli

    cannot_write(monkeypatch)
    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    monkeypatch.setattr(cli, "load_model", no_measuring)
    prompt = ["def f(x):", "--plan", "default"] if command == "trace" else []
    assert cli.main([command, *prompt, *args]) == 2
    assert needle in one_error_line(capsys)


FAKE_COSTS = {"curves": {m: {s: {k: 0.1 * k for k in (1, 2, 4, 8)} for s in ("warm", "cold")}
                         for m in ("target", "draft")},
              "overheads": {s: {"step": 0.1, "draft_step": 0.1, "draft_dist": 0.01, "ngram_query": 0.01}
                            for s in ("greedy", "sampled")}, "layout": {"target": 0, "draft": 0}, "read_gbps": 20.0}


def made_up_costs(monkeypatch):
    """This machine's cost curves, and the EAGLE head's, made up: never measured (each would run the embedded
    target's passes for seconds)."""
    from specdec_np.tools import calibration

    monkeypatch.setattr(calibration, "measure_costs", lambda *a, **k: FAKE_COSTS)
    monkeypatch.setattr(bench, "head_costs", lambda *a, **k: ({}, {s: {k: 0.05 * k for k in (1, 2, 4, 8)}
                                                                   for s in ("warm", "cold")}))


def test_bench_says_whether_its_costs_were_cached(tmp_path, capsys, monkeypatch):
    """Issue 53: "(costs measured now)" says what happened to them: cached for later runs, or for this run
    only (a cache that cannot be written, or measured while others took the CPU)."""
    from specdec_np.tools import calibration

    made_up_costs(monkeypatch)
    (tmp_path / "FILE").write_text("")
    for cache, says in (("FILE", "measured now, for this run only"), ("cache", "measured now, cached for later runs")):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / cache))
        assert bench.main(["--curves"]) == 0
        out = capsys.readouterr().out
        assert f"(costs {says})\n" in out
        # Plain decoding's roofline: the target's weights over its 0.1 ms one-token pass, against the probe.
        assert "\nroofline: plain decoding's one-token pass reads the target's 70.2 MB of weights in 0.10 ms, " \
               "701.6 GB/s, 3508% of the 20.0 GB/s NumPy reads here\n" in out
    monkeypatch.setattr(calibration, "busy_since", lambda start: "other processes used 0.5 of its 2 cores")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "FILE"))
    assert bench.main(["--curves"]) == 0
    assert "(costs measured now, for this run only: this machine was busy while measuring" in capsys.readouterr().out


def test_curves_alone_and_with_recalibrate_pass_the_option_checks(monkeypatch):
    """The control of the --curves check above: --curves, with --recalibrate or an option at its default,
    reaches the models (here a stand-in that stops it) instead of an error."""
    monkeypatch.setattr(bench, "load_embedded", no_measuring)
    for args in (["--curves"], ["--curves", "--recalibrate"], ["--curves", "--rows", "methods"]):
        with pytest.raises(AssertionError, match="measured before the check"):
            bench.main(args)


def test_bench_reports_stage_2s_guesses_and_its_copies_apart(tmp_path, monkeypatch):
    """Issue 59: staged with and without copies are rows of their own, and each row's tokens are split by where
    they came from: stage 2's guesses the draft kept (the paper's stage 2) apart from its copies sent to the
    target with no draft pass (prompt lookup's idea). Greedy, the constant plan, made-up costs."""
    from specdec_np.record import PARTS
    made_up_costs(monkeypatch)
    assert bench.main(["--prompts", str(FIXTURES / "prompts.jsonl"), "--limit", "1", "--max-new-tokens", "48",
                       "--settings", "greedy", "--plan", "default", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    rows, plans = res["summary"]["greedy"], res["plans"]["greedy"]
    parts = {m: r["tokens_by_part"] for m, r in rows.items()}
    assert all(list(p) == list(PARTS) and sum(p.values()) == rows[m]["tokens"] for m, p in parts.items())
    assert "copies of 12" in plans["staged"]["plan"] and "no copies" in plans["staged_drafts"]["plan"]
    assert parts["staged"]["copied"] > 0 and parts["staged_drafts"]["copied"] == 0  # the row without copies has none
    assert parts["staged_drafts"]["ngram_guess"] + parts["staged_drafts"]["copy_guess"] > 0  # its stage 2 guessed
    assert parts["lookup"]["copied"] == rows["lookup"]["tokens"] - parts["lookup"]["target"]  # all copies, no guess
    assert parts["tree"]["draft"] == rows["tree"]["tokens"] - parts["tree"]["target"]  # no stage 2 at all
    md = (tmp_path / "results.md").read_text()
    assert "| method | % of tokens from: the draft | stage 2's guesses: trigram | stage 2's guesses: copies | " \
           "copies sent to the target | the target |" in md
    for m, p in parts.items():  # each row's cells are its own counts, as shares of its tokens
        cells = " | ".join(f"{100 * p[k] / rows[m]['tokens']:.0f}" for k in PARTS)
        assert f"| {bench.NAMES[m]} | {cells} |" in md
    assert "| staged, no copies |" in md


def test_results_json_and_md_change_together(tmp_path, monkeypatch, capsys):
    """results.json and results.md are a pair: a run stopped between writing the two (SIGTERM is SystemExit
    143 there) leaves the previous pair and no temporary file; a file-size limit (or a full disk) is one
    line naming --out and the file; a whole run replaces both."""
    import errno

    from specdec_np import files
    from specdec_np.tools.cli import main

    made_up_costs(monkeypatch)
    (tmp_path / "results.json").write_text('{"old": 1}\n')
    (tmp_path / "results.md").write_text("old table\n")
    args = ["--prompts", str(FIXTURES / "prompts.jsonl"), "--limit", "1", "--max-new-tokens", "4", "--settings",
            "greedy", "--plan", "default", "--out", str(tmp_path)]
    real, stop = files.tempfile.mkstemp, {}

    def stopped(dir, prefix, suffix):  # the second file: SIGTERM, or `ulimit -f` (an error naming no file)
        if prefix.startswith("results.md") and stop:
            raise stop["with"]
        return real(dir=dir, prefix=prefix, suffix=suffix)

    monkeypatch.setattr(files.tempfile, "mkstemp", stopped)
    for stop["with"] in (SystemExit(143), OSError(errno.EFBIG, "File too large")):
        if isinstance(stop["with"], SystemExit):
            with pytest.raises(SystemExit):
                bench.main(args)
        else:
            capsys.readouterr()
            assert main(["bench", *args]) == 2
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert err == f"error: --out {tmp_path}: cannot write {tmp_path / 'results.md'}: File too large"
        assert (tmp_path / "results.json").read_text() == '{"old": 1}\n'
        assert (tmp_path / "results.md").read_text() == "old table\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    stop.clear()
    assert bench.main(args) == 0
    assert "summary" in json.loads((tmp_path / "results.json").read_text())
    assert "| staged |" in (tmp_path / "results.md").read_text()
    roofline = json.loads((tmp_path / "results.json").read_text())["roofline"]
    assert roofline.startswith("roofline: ") and (tmp_path / "results.md").read_text().startswith(roofline + ".\n")


def test_a_ctrl_c_while_the_results_are_renamed_waits_for_the_last(tmp_path, monkeypatch):
    """Ctrl-C (and SIGTERM) are held while the pair is renamed: a SIGINT that comes after the first rename acts
    once both files are new. Negative control: the same signal with nothing held stops between the two."""
    import contextlib
    import os
    import signal

    from specdec_np import files

    def write_together(texts):
        with files.atomic_files(texts, "w") as out:
            for f, text in zip(out, texts.values()):
                f.write(text)

    real = os.replace

    def interrupted(src, dst):
        real(src, dst)
        if dst.name == "results.json":
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(files.os, "replace", interrupted)
    texts = {tmp_path / "results.json": "new json\n", tmp_path / "results.md": "new md\n"}
    for path in texts:
        path.write_text("old\n")
    with pytest.raises(KeyboardInterrupt):
        write_together(texts)
    assert [p.read_text() for p in texts] == ["new json\n", "new md\n"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "results.md"]
    for path in texts:
        path.write_text("old\n")
    monkeypatch.setattr(files, "signals_held", contextlib.nullcontext)  # nothing held
    with pytest.raises(KeyboardInterrupt):
        write_together(texts)
    assert [p.read_text() for p in texts] == ["new json\n", "old\n"]


def test_the_eagle_row_runs_the_head_on_the_tree_rows_plan(tmp_path, monkeypatch, capsys):
    """Issue 61: bench's eagle row drafts with the target's EAGLE head on the tree row's plan (said, with why),
    emits the baseline's tokens at greedy, and gives its first drafted token's acceptance beside the draft model's;
    its passes are priced on the head's own cost curve (`calibration.head_costs`), shown with the others."""
    head_curve = {s: {k: 0.01 * k for k in (1, 2, 4, 8)} for s in ("warm", "cold")}
    made_up_costs(monkeypatch)
    from specdec_np.eagle import Head
    monkeypatch.setattr(bench, "head_costs", lambda target, head, layout: ({}, head_curve) if isinstance(head, Head)
                        else None)
    assert bench.main(["--prompts", str(FIXTURES / "prompts.jsonl"), "--limit", "1", "--max-new-tokens", "24",
                       "--settings", "greedy", "--plan", "default", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "results.json").read_text())
    rows, plans = res["summary"]["greedy"], res["plans"]["greedy"]
    assert plans["eagle"]["method"] == "eagle" and plans["eagle"]["plan"] == plans["tree"]["plan"]
    assert "(ref.) EAGLE head: " in out and f"tree's plan, {SAME_TREE}" in out
    assert "| head, warm | 0.01 | 0.02 |" in out
    assert res["costs"]["curves"]["head"] == json.loads(json.dumps(head_curve))
    eagle, tree = rows["eagle"], rows["tree"]
    assert eagle["same_as_baseline"] and eagle["tokens"] == rows["ar"]["tokens"]
    assert eagle["draft_passes_per_target_pass"] > 0  # the head's passes, not the draft's:
    assert eagle["relative_weight_traffic"] != tree["relative_weight_traffic"]
    assert 0 < eagle["first_token_acceptance"] <= 1 and 0 < tree["first_token_acceptance"] <= 1
    assert rows["ar"]["first_token_acceptance"] is None
    assert eagle["predicted_speedup"] is not None and tree["predicted_speedup"] is not None
    md = (tmp_path / "results.md").read_text()
    assert "| draft passes/target pass | first drafted token accepted |" in md
    assert f"| {eagle['tokens_per_target_pass']:.2f} | {eagle['draft_passes_per_target_pass']:.2f} | " \
           f"{eagle['first_token_acceptance']:.2f} |" in md


def test_the_machine_plans_row_drafts_with_the_head_where_eagle_is_fastest(monkeypatch, embedded):
    """Issue 68: "this machine's plan" is the fastest of every method, eagle's plans priced on the head's curve: with a
    head cheaper than the draft model it is eagle, run with the head as its draft (greedy: the baseline's tokens);
    without the head (bench --rows rules) the draft model's tree, run with the draft model."""
    from specdec_np import eagle
    from specdec_np.models import load_head
    from specdec_np.tools import acceptance, choice

    profile = head_race_profile()
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: [])
    monkeypatch.setattr(acceptance, "head_key", lambda h: "H")
    target, draft, ngram, enc = embedded
    head = load_head(target=target)
    costs = FAKE_COSTS | {"curves": {"target": pass_curve(1.0), "draft": pass_curve(0.1), "head": pass_curve(0.0)},
                          "head": "H"}
    drafts = []
    monkeypatch.setattr(bench, "generate", lambda *a, **k: drafts.append(k["draft"]) or generate(*a, **k))
    for given, method, drafter in ((head, "eagle", head), (None, "tree", draft)):
        rows = bench.row_choices(target, draft, ngram, enc, costs, 0.0, "machine", given)
        assert rows["plan"].method == method and not rows["plan"].constant
        drafts.clear()
        plans = {"greedy": {m: rows[m] for m in ("ar", "plan")}}
        records = bench.run([list(range(1, 20))], target, draft, ngram, plans, costs, 16, head=given)["greedy"]
        assert drafts == [None, drafter] and records["plan"][0]["ids"] == records["ar"][0]["ids"]
        assert records["plan"][0]["stats"].draft_passes > 0 and isinstance(drafter, eagle.Head) == (given is not None)


def test_eagles_passes_are_priced_on_the_heads_curve_or_not_at_all():
    """A run of eagle priced with the head's curve in the draft's place (the control: the same run of the draft's
    row, priced on the draft's); with no head curve, unpriced rather than priced as a draft model's passes."""
    from specdec_np.decode import generate
    from specdec_np.models import load_embedded, load_head

    target, draft, ngram, enc = load_embedded()
    stats = generate(target, list(range(1, 20)), 12, "eagle", load_head(target=target)).stats
    overheads, padding = FAKE_COSTS["overheads"]["greedy"], {"target_pad": (), "draft_pad": ()}
    head = {s: {k: 0.001 * k for k in (1, 2, 4, 8)} for s in ("warm", "cold")}
    with_head = FAKE_COSTS | {"curves": FAKE_COSTS["curves"] | {"head": head}}
    assert bench.predicted_ms("eagle", stats, FAKE_COSTS, overheads, padding) is None
    as_draft = bench.predicted_ms("tree", stats, with_head, overheads, padding)
    as_head = bench.predicted_ms("eagle", stats, with_head, overheads, padding)
    assert stats.draft_passes and 0 < as_head < as_draft  # the head's passes at a tenth of the draft's made-up cost


def test_first_token_acceptance_counts_the_steps_that_drafted():
    """A step that drafted and emitted two tokens or more kept its first drafted token; one that drafted and emitted
    one did not; a step with no draft pass (the first, or a copy) is not counted."""
    from types import SimpleNamespace as S

    steps = [S(draft_blocks=[], tokens=[1]), S(draft_blocks=[2], tokens=[1, 2, 3]), S(draft_blocks=[1], tokens=[4]),
             S(draft_blocks=[], tokens=[5, 6, 7]), S(draft_blocks=[1, 1], tokens=[8, 9])]
    assert bench.first_token_acceptance(S(steps=steps)) == (2, 3)


def test_the_eagle_rows_plan_is_the_one_choose_gives(monkeypatch):
    """Issue 61: row_choices asks choose for eagle with the EAGLE head beside the other rows; the eagle row runs what
    choose gives, measured or not (choose itself gives a head with no measured plan its draft twin's, test_plan)."""
    from specdec_np.plan import Plan
    from specdec_np.tools.choice import Choice

    tree_plan, eagle_plan, asked = Plan(shape="fixed", widths=(2, 1)), Plan(shape="fixed", widths=(1, 1, 1)), []
    why = {"now": ""}

    def fake(*args, **kwargs):
        asked.append((args[5], kwargs.get("head")))
        return {m: Choice("eagle", eagle_plan, 1.0, 2.0, constant=why["now"]) if m == "eagle" else
                Choice(m or "staged", tree_plan if m == "tree" else Plan(), 1.0, 2.0) for m in args[5]}

    monkeypatch.setattr(bench, "choose", fake)
    head = object()
    rows = bench.row_choices(None, None, None, None, FAKE_COSTS, 0.0, "machine", head)
    assert rows["eagle"].plan == eagle_plan and not rows["eagle"].constant and rows["eagle"].speedup == 2.0
    assert "eagle" in asked[0][0] and asked[0][1] is head
    why["now"] = f"tree's plan, {SAME_TREE} (the constant plan: the acceptance profile holds no eagle plans)"
    rows = bench.row_choices(None, None, None, None, FAKE_COSTS, 0.0, "machine", head)
    assert rows["eagle"].method == "eagle" and rows["eagle"].plan == eagle_plan and rows["eagle"].reason() == why["now"]


STOP_PROMPT = 'def is_prime(n):\n    """Return True if n is prime."""\n'  # the embedded target ends it in 16 tokens


def test_bench_ends_each_run_at_the_stop_strings_and_says_which(tmp_path, monkeypatch, capsys):
    made_up_costs(monkeypatch)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": STOP_PROMPT}) + "\n")
    args = ["--prompts", str(prompts), "--max-new-tokens", "48", "--settings", "greedy", "--plan", "default", "--out",
            str(tmp_path)]
    assert bench.main(args + ["--stop", "humaneval"]) == 0
    out = capsys.readouterr().out
    assert "stop strings: HumanEval's stop sequences (\\ndef, \\nclass, \\nif, \\nprint, \\n#)" in out
    assert "1 prompts x 48 new tokens, ended at HumanEval's stop sequences" in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["stop"] == list(bench.HUMANEVAL_STOP)
    stopped = {m: r["tokens"] for m, r in res["summary"]["greedy"].items()}
    assert bench.main(args) == 0  # the control: without --stop every run decodes all 48 tokens
    assert "stop strings: none" in capsys.readouterr().out
    full = {m: r["tokens"] for m, r in json.loads((tmp_path / "results.json").read_text())["summary"]["greedy"].items()}
    assert set(full.values()) == {48} and len(set(stopped.values())) == 1 and stopped["ar"] < 48
