"""The command line, the demo and the benchmark run offline on the embedded models (few subprocesses:
the functions behind them are called directly where possible)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_np.tools import bench, demo
from specdec_np.tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "prompts.jsonl"


def run_cli(*args, stdin=None):
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "specdec_np", *args], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.parametrize("method", ["ar", "speculative", "tree", "staged"])
def test_generate_each_method(method, capsys):
    assert main(["generate", "def add(a, b):", "--method", method, "--max-new-tokens", "12", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def add(a, b):") and len(out) > len("def add(a, b):")
    assert "target passes" in err and "tokens/s" in err


def test_generate_sampled_tree_with_widths(capsys):
    assert main(["generate", "def add(a, b):", "--method", "staged", "--temperature", "1", "--top-k", "50",
                 "--sampled", "without", "--widths", "3,1", "--max-new-tokens", "12", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("def add(a, b):") and "target passes" in err


def test_generate_same_text_for_every_method_and_plan(capsys):
    texts = []
    for args in (["--method", "ar"], ["--method", "staged"], ["--method", "staged", "--plan", "default"],
                 ["--method", "tree", "--budget", "5", "--depth", "3"], ["--method", "speculative", "--depth", "2"],
                 ["--method", "staged", "--copy-len", "0", "--widths", "2,1"]):
        assert main(["generate", "class Stack:", "--max-new-tokens", "20", *args]) == 0
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1 and len(texts[0]) > len("class Stack:\n")


def test_generate_stats_name_the_plan(capsys):
    main(["generate", "class Stack:", "--max-new-tokens", "8", "--plan", "default", "--stats"])
    err = capsys.readouterr().err
    assert "method staged: best-first, 8 nodes at most 6 deep; n-gram guesses 3 deep (4 rows); copies of 12 " \
           "(the constant plan)" in err
    main(["generate", "class Stack:", "--max-new-tokens", "8", "--stats"])  # this machine's plan, whatever it is
    err = capsys.readouterr().err
    # Measured, or, when the machine was busy while measuring, the fallback saying so.
    assert "this machine's, predicted" in err and "x plain decoding" in err or "(not measured: the machine was busy" in err


def test_generate_reads_stdin_and_reports_errors_in_one_line():
    r = run_cli("generate", "-", "--max-new-tokens", "5", "--method", "ar", stdin="import os\n")
    assert r.returncode == 0 and r.stdout.startswith("import os\n")
    for args, needle in ((["generate", "x", "--temperature", "-1"], "temperature"),
                         (["generate", "x", "--top-p", "0", "--temperature", "1"], "--top-p"),
                         (["generate", "x", "--target", "gpt2-large"], "make weights"),
                         (["generate", "x", "--method", "tree", "--widths", "2,x"], "--widths"),
                         (["generate", "x", "--method", "tree", "--budget", "0"], "--budget"),
                         (["generate", "x", "--method", "tree", "--copy-len", "3"], "--copy-len"),
                         # --plan default: these fail at the plan, with no machine measured first
                         (["generate", "x", "--method", "speculative", "--plan", "default", "--rule", "block"],
                          "--rule block"),
                         (["generate", "x", "--method", "tree", "--plan", "default", "--temperature", "1",
                           "--rule", "traversal"], "--rule traversal"),  # the constant plan drafts top tokens
                         (["generate", "x", "--method", "tree", "--plan", "default", "--temperature", "1",
                           "--sampled", "with", "--widths", "2,1", "--rule", "block"], "--rule block"),
                         (["generate", "x", "--method", "lookup", "--plan", "default", "--temperature", "1",
                           "--rule", "block"], "--rule block"),
                         (["bench", "--prompts", "missing.jsonl"], "--prompts missing.jsonl: No such file"),
                         (["bench", "--prompts", "tests"], "--prompts tests: Is a directory"),
                         (["bench", "--results", "nowhere/results.md"], "--results nowhere/results.md: give"),
                         (["bench", "--results", "docs"], "--results docs: give a markdown file"),
                         (["bench", "--out", "README.md"], "--out README.md is a file"),
                         (["generate", "x", "--method", "staged", "--plan", "default", "--ngram", "tests"],
                          "n-gram model file tests is a directory"),
                         (["ngram", "fit", "tests", "--out", "never.npz"], "text file tests is a directory"),
                         (["ngram", "fit", "README.md", "--out", "tests"], "--out tests is a directory"),
                         (["ngram", "fit", "README.md", "--out", "nowhere/x.npz"], "the directory nowhere does not"),
                         (["demo", "--plan", "default", "--budget", "5000"], "--budget: a tree of up to 5000"),
                         (["demo", "--plan", "default", "--depth", "600"], "--depth: a tree of up to 600"),
                         (["bench", "--seeds", "0"], "--seeds"),
                         (["bench", "--jobs", "2"], "--jobs"),  # it applies to --profile only
                         (["bench", "--profile", "--jobs", "0"], "--jobs")):
        r = run_cli(*args)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def test_tree_options_replace_a_drawn_plan(monkeypatch, embedded):
    # At temperature > 0 the machine's plan may draw its tree from the draft (fixed widths, traversal):
    # --budget/--depth must give the best-first tree they ask for, with a rule valid for it, not be
    # ignored; options that cannot apply are one-line errors naming them.
    import argparse

    from specdec_np.decode import Plan
    from specdec_np.tools import cli, plan as plans

    drawn = Plan(shape="fixed", widths=(1, 1, 1), sampled="without", rule="traversal", copy_len=7)
    machine = {"method": "staged"}
    monkeypatch.setattr(plans, "plan_for", lambda *a, **k: plans.Choice(machine["method"], drawn, 2.0, 4.0))

    def choose(**options):
        a = argparse.Namespace(**{**dict(plan="machine", method=None, recalibrate=False, budget=None, depth=None,
                                         widths=None, sampled=None, copy_len=None, rule=None), **options})
        return cli.choose_plan(a, *embedded, 1.0)

    method, plan, about, _ = choose(budget=16, depth=5)
    assert (method, plan.shape, plan.budget, plan.depth, plan.sampled, plan.rule) == \
        ("staged", "best_first", 16, 5, None, None)
    assert plan.max_nodes(method) == 16 and "best-first, 16 nodes at most 5 deep" in about
    assert choose(widths="2,1")[1].sampled == "without"  # a fixed-width change keeps the drawn tree
    for options, needle in ((dict(budget=16, widths="2,1"), "--budget asks for a best-first tree, --widths"),
                            (dict(depth=4, sampled="with"), "--depth asks for a best-first tree, --sampled"),
                            (dict(method="ar", depth=3), "--depth: --method ar drafts no tree")):
        with pytest.raises(ValueError, match=needle):
            choose(**options)
    machine["method"] = "ar"  # where drafting does not pay, the machine's plan is plain decoding
    with pytest.raises(ValueError, match="--budget: this machine's plan .plain decoding. drafts no tree"):
        choose(budget=8)
    # The machine's lookup plan may set its chain's length by the match; --depth gives one length.
    machine["method"] = "lookup"
    drawn = Plan(lookup_chains=(23, 7, 0))
    method, plan, about, _ = choose(depth=5)
    assert (method, plan.chain, plan.lookup_chains, plan.max_depth(method)) == ("lookup", 5, (), 5)
    assert "a chain of 5 copied from the context" in about
    assert "23 tokens after a match of 3, 7 after 2, 0 after 1" in choose()[2]
    with pytest.raises(ValueError, match="--budget: method lookup proposes a chain: its length is --depth"):
        choose(budget=8)


def test_demo_options_reshape_each_plan_as_the_cli_does(monkeypatch, embedded):
    # The demo's --budget/--depth mean what the CLI's do (one helper, plan.resized): a chain's
    # length for the chain methods, a best-first tree of the draft's top tokens for the others.
    import argparse

    from specdec_np.decode import Plan
    from specdec_np.tools import plan as plans

    drawn = {"speculative": Plan(chain=3, sampled="with", rule="block"), "lookup": Plan(lookup_chains=(7, 3, 0)),
             "staged": Plan(shape="fixed", widths=(2, 1), sampled="without", rule="traversal")}
    monkeypatch.setattr(demo, "plans_for", lambda *a, **k: {m: plans.Choice(m, p, 2.0, 4.0) for m, p in drawn.items()})
    drawn["ar"] = Plan()
    a = argparse.Namespace(plan="machine", budget=None, depth=4)
    got = {m: p for m, (p, _) in demo.plans(a, *embedded, 1.0, tuple(drawn))[0].items()}
    assert got["ar"] == Plan()  # plain decoding has no tree to resize
    assert (got["speculative"].chain, got["speculative"].rule) == (4, "block")
    assert (got["lookup"].chain, got["lookup"].lookup_chains) == (4, ())
    assert (got["staged"].shape, got["staged"].depth, got["staged"].sampled, got["staged"].rule) == \
        ("best_first", 4, None, None)
    a.depth, a.budget = None, 8  # --budget resizes the trees only, and only their plans say so
    about = {m: origin for m, (_, origin) in demo.plans(a, *embedded, 1.0, tuple(drawn))[0].items()}
    assert [m for m in drawn if "with --budget/--depth" in about[m]] == ["staged"]
    a.budget = None
    assert all(p == drawn[m] for m, (p, _) in demo.plans(a, *embedded, 1.0, tuple(drawn))[0].items())


def test_generate_with_a_sequence_level_rule():
    r = run_cli("generate", "def f(x):", "--max-new-tokens", "12", "--method", "speculative", "--plan", "default",
                "--temperature", "1", "--top-k", "50", "--rule", "block", "--stats")
    assert r.returncode == 0 and "block verification" in r.stderr, r.stderr


def test_help_has_examples():
    r = run_cli("generate", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "--method" in r.stdout


def test_demo_small(capsys):
    assert demo.main(["--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "All 5 methods produced the identical completion" in out and "differs" not in out
    assert "| staged" in out and "(root)" in out and "sampled decoding" in out and "Plans:" in out


def test_bench_with_fixture(tmp_path, capsys):
    assert bench.main(["--prompts", str(FIXTURE), "--limit", "2", "--max-new-tokens", "16", "--out", str(tmp_path),
                       "--seeds", "2", "--results", str(tmp_path / "results.md")]) == 0
    out = capsys.readouterr().out
    assert "| staged |" in out and "| (ref.) prompt lookup |" in out and "### greedy" in out and "### top-k" in out
    assert "ms per target pass" in out and "staged's tokens/s over each method's" in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["prompts"] == 2 and res["seeds"] == 2
    # Top-k runs each prompt with 2 seeds; greedy once (it is deterministic).
    assert [len(res["per_prompt_speedup"][s]["staged"]) for s in ("greedy", "top-k")] == [2, 4]
    against = res["summary"]["top-k"]["staged"]["against"]
    assert set(against) == set(bench.METHODS) - {"staged"} and all(lo <= r <= hi for r, lo, hi in against.values())
    assert all(lo <= r <= hi for per in res["summary"].values() for r, lo, hi in
               (row["over_baseline"] for row in per.values()))
    assert set(res["plans"]["greedy"]) == set(bench.METHODS) and res["machine"]["cpus"] >= 1
    section = (tmp_path / "results.md").read_text()
    assert f"## {bench.machine_name()}" in section and "python -m specdec_np bench --prompts" in section
    g = res["summary"]["greedy"]
    assert g["ar"]["relative_weight_traffic"] == pytest.approx(1.0)
    assert all(g[m]["same_as_baseline"] for m in g)
    assert g["staged"]["tokens"] == g["ar"]["tokens"]


def test_results_file_keeps_one_section_per_machine(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("# Results\n\nintro\n\n## Machine A\n\nold A\n\n## Machine B\n\nB's table\n")
    bench.update_results(path, "Machine A", "new A")
    bench.update_results(path, "Machine C", "C's table")
    text = path.read_text()
    assert "old A" not in text and text.count("## Machine A") == 1 and "new A" in text
    assert text.index("intro") < text.index("new A") < text.index("B's table") < text.index("C's table")


def timed(prompt, tokens, seconds):
    return {"prompt": prompt, "tokens": tokens, "seconds": seconds}


def test_paired_ratio_is_exact_when_every_prompt_agrees():
    base = [timed(p, 100, 1.0 + p) for p in range(6)]
    twice = [timed(p, 100, (1.0 + p) / 2) for p in range(6)]  # twice as fast on every prompt
    assert bench.paired_ratio(twice, base) == pytest.approx([2.0, 2.0, 2.0])
    assert bench.paired_ratio(base, base) == pytest.approx([1.0, 1.0, 1.0])


def test_paired_ratio_interval_covers_a_mixed_result_and_groups_a_prompts_runs():
    base = [timed(p, 100, 1.0) for p in range(20)]
    mixed = [timed(p, 100, 0.8 if p % 2 else 1.25) for p in range(20)]  # faster on half, slower on half
    r, lo, hi = bench.paired_ratio(mixed, base)
    assert lo < 1.0 < hi and lo < r < hi
    assert bench.paired_ratio(mixed, base) == [r, lo, hi]  # seeded: the same interval every time
    # A prompt's runs (seeds) are resampled together: splitting every run in two halves changes nothing.
    halves = lambda rs: [timed(x["prompt"], x["tokens"] / 2, x["seconds"] / 2) for x in rs for _ in range(2)]
    assert bench.paired_ratio(halves(mixed), halves(base)) == pytest.approx([r, lo, hi])


def test_read_prompts_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="no \"prompt\" field"):
        bench.read_prompts(bad)
    assert len(bench.read_prompts(FIXTURE)) == 3


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path, monkeypatch):
    real = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ValueError, match="--plot needs matplotlib"):
        bench.main(["--prompts", str(FIXTURE), "--plot", "--out", str(tmp_path)])
    assert not (tmp_path / "results.json").exists()


def test_the_demo_says_when_its_timings_were_taken_on_a_busy_machine(monkeypatch):
    from specdec_np.tools import demo as demo_mod

    monkeypatch.setattr(demo_mod, "busy_warning", lambda start: "note: this machine was busy while its costs were "
                        "measured (other processes used 1.0 of its 2 cores), so ...")
    line = demo_mod.busy_while_timing(demo_mod.busy_warning(None))
    assert "other processes used 1.0 of its 2 cores" in line and "rerun when it is idle" in line


def test_bench_options_for_curves_only_need_curves():
    from specdec_np.tools import bench

    for option in ("--matrices", "--gpt2-shapes"):
        with pytest.raises(ValueError, match=f"{option} applies to --curves only"):
            bench.main([option, "--prompts", "/nonexistent.jsonl"])
