"""The command line, the demo and the benchmark run offline on the embedded models (few subprocesses:
the functions behind them are called directly where possible)."""

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_np.methods import METHODS
from specdec_np.tools import bench, demo
from specdec_np.tools.cli import main

from helpers import head_race_profile, pass_curve

ROOT = Path(__file__).resolve().parents[2]
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
                 ["--method", "staged", "--copy-len", "0", "--widths", "2,1"],
                 ["--method", "speculative", "--min-q", "0.6", "--plan", "default"]):
        assert main(["generate", "class Stack:", "--max-new-tokens", "20", *args]) == 0
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1 and len(texts[0]) > len("class Stack:\n")


def test_generate_stats_name_the_plan(capsys):
    main(["generate", "class Stack:", "--max-new-tokens", "8", "--plan", "default", "--stats"])
    err = capsys.readouterr().err
    assert "method staged: best-first, 8 nodes at most 6 deep; n-gram guesses 3 deep (4 rows); copies of 12 " \
           "(the constant plan, as --plan default asks)" in err
    main(["generate", "class Stack:", "--max-new-tokens", "8", "--plan", "default", "--stats", "--method",
          "speculative", "--min-q", "0.6"])
    assert "method speculative: a chain of 4; stopping below a token of q < 0.6" in capsys.readouterr().err
    main(["generate", "class Stack:", "--max-new-tokens", "8", "--stats"])  # this machine's plan, whatever it is
    err = capsys.readouterr().err
    # Measured, or, when the machine was busy while measuring, the fallback saying so.
    assert "this machine's measured plan, predicted" in err and "x plain decoding" in err or \
        "(the constant plan: " in err


def test_generate_reads_stdin_and_reports_errors_in_one_line(tmp_path, monkeypatch, capsys):
    """A process reads its prompt from standard input, and says a bad option in one line on standard error; the
    other errors through `main` in this process (the same handler; no process start each)."""
    r = run_cli("generate", "-", "--max-new-tokens", "5", "--method", "ar", stdin="import os\n")
    assert r.returncode == 0 and r.stdout.startswith("import os\n")
    r = run_cli("generate", "x", "--temperature", "-1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("error:") and "temperature" in lines[0]
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("NO_COLOR", "1")
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
                           "--sampled", "with", "--widths", "2,1", "--rule", "block"], "--rule block"),
                         (["generate", "x", "--method", "lookup", "--plan", "default", "--temperature", "1",
                           "--rule", "block"], "--rule block"),
                         (["bench", "--prompts", "missing.jsonl"], "--prompts missing.jsonl: No such file"),
                         (["bench", "--prompts", "tests"], "--prompts tests: Is a directory"),
                         (["bench", "--results", "nowhere/results.md"], "--results nowhere/results.md: the directory "
                                                                        "nowhere does not exist"),
                         (["bench", "--results", "docs"], "--results docs is a directory"),
                         (["bench", "--prompts", str(FIXTURE), "--out", "README.md"], "--out README.md: /"),
                         (["generate", "x", "--method", "staged", "--plan", "default", "--ngram", "tests"],
                          "n-gram model file tests is a directory"),
                         (["ngram", "fit", "tests", "--out", str(tmp_path / "never.npz")],
                          "text file tests: Is a directory"),
                         (["ngram", "fit", "README.md", "--out", "tests"], "--out tests is a directory"),
                         (["ngram", "fit", "README.md", "--out", "nowhere/x.npz"], "the directory nowhere does not"),
                         (["demo", "--plan", "default", "--budget", "5000"], "(--budget 5000"),
                         (["demo", "--plan", "default", "--depth", "600"], "tokens per step (--depth 600)"),
                         (["bench", "--seeds", "0"], "--seeds")):
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        assert code != 0
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def namespace(**options):
    """generate's options as argparse gives them, with `options` changed."""
    import argparse

    return argparse.Namespace(**{**dict(plan="machine", method=None, recalibrate=False, budget=None, depth=None,
                                        widths=None, sampled=None, min_q=None, copy_len=None, rule=None,
                                        temperature=1.0, top_k=None, top_p=None, max_new_tokens=8, seed=None, file=None,
                                        target="tiny-target", draft=None, ngram=None, stop=None), **options})


def measured_machine(monkeypatch, shapes):
    """This machine's plans, measured: `shapes` {method: (Plan fields, predicted ms per token)} as the acceptance
    profile's candidates, plain decoding at 4 ms per token; the real chooser (`choice.choose`) picks among them,
    and every call's asked methods are kept in the list returned."""
    from specdec_np.tools import acceptance, choice, cli

    records = [{"method": m, "shape": shape, "tokens": 1, "ms": ms} for m, (shape, ms) in shapes.items()]
    profile = {"settings": dict.fromkeys(("greedy", "sampled"), records + [{"method": "ar", "shape": {}, "tokens": 1,
                                                                            "ms": 4.0}])}
    monkeypatch.setattr(choice, "calibration", lambda *a, **k: ({"curves": {}, "overheads": dict.fromkeys(
        ("greedy", "sampled"), {}), "layout": {}}, False))
    monkeypatch.setattr(choice, "pads", lambda curves: {})
    monkeypatch.setattr(choice, "record_ms", lambda r, *a, **k: r["ms"] * r["tokens"])
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: [])
    asked = []
    monkeypatch.setattr(cli, "choose", lambda *a, **k: asked.append(a[5]) or choice.choose(*a, **k))
    return asked


def test_tree_options_replace_a_drawn_plan(monkeypatch, embedded):
    # At temperature > 0 the machine's plan may draw its tree from the draft (fixed widths, traversal):
    # --budget/--depth must give the best-first tree they ask for, with a rule valid for it, not be
    # ignored; options that cannot apply are one-line errors naming them.
    from specdec_np.plan import Plan, constant
    from specdec_np.tools import cli
    from specdec_np.tools.options import check_options

    drawn = dict(shape="fixed", widths=(1, 1, 1), sampled="without", rule="traversal", copy_len=7)
    asked = measured_machine(monkeypatch, {"speculative": ({"chain": 3}, 2.5), "tree": (drawn, 3.0),
                                           "staged": (drawn, 2.0), "lookup": ({"lookup_chains": (23, 7, 0)}, 2.2)})

    def choose(**options):
        a = namespace(**options)
        check_options(a)
        return cli.choose_plan(a, *embedded)

    method, plan, about, _ = choose(budget=16, depth=5)
    assert (method, plan.shape, plan.budget, plan.depth, plan.sampled, plan.rule) == \
        ("staged", "best_first", 16, 5, None, None)
    assert METHODS[method].max_nodes(plan) == 16 and "best-first, 16 nodes at most 5 deep" in about
    assert asked[-1] == (("tree", "staged", "eagle"),)  # without --method: the fastest where --budget applies
    # (eagle among them, but with no head (none given here) neither priced nor said)
    assert "(this machine's measured plan of tree, staged, predicted 2.00x plain decoding, changed by options)" in about
    assert choose(widths="2,1")[1].sampled == "without"  # a fixed-width change keeps the drawn tree
    for options, needle in ((dict(budget=16, widths="2,1"), "--budget asks for a best-first tree, --widths"),
                            (dict(depth=4, sampled="with"), "--depth asks for a best-first tree, --sampled"),
                            (dict(method="ar", depth=3), "--depth does nothing with --method ar"),
                            (dict(method="lookup", budget=8), "--budget does nothing with --method lookup")):
        with pytest.raises(ValueError, match=needle):
            choose(**options)
    # The machine's lookup plan may set its chain's length by the match; --depth gives one length.
    method, plan, about, _ = choose(depth=5, method="lookup")
    assert (method, plan.chain, plan.lookup_chains, METHODS[method].max_depth(plan)) == ("lookup", 5, (), 5)
    assert "a chain of 5 copied from the context" in about
    assert "23 tokens after a match of 3, 7 after 2, 0 after 1" in choose(method="lookup")[2]
    # Without any option the machine's plan may be any method (None: the plan choice's own), unchanged.
    asked.clear()
    assert choose()[:2] == ("staged", Plan(**drawn)) and asked == [(None,)]
    # --rule alone: the fastest plan whose trees the rule is lossless on (here tree, slower than
    # lookup and staged, which draft deterministic trees; speculative's chain is drawn but slowest).
    asked = measured_machine(monkeypatch, {"speculative": ({}, 5.0), "lookup": ({}, 1.5), "staged": ({}, 2.0),
                                           "tree": ({"shape": "fixed", "widths": (2, 1), "sampled": "with"}, 3.0)})
    method, plan, about, _ = choose(rule="recursive")
    assert (method, plan.rule, plan.sampled) == ("tree", "recursive", "with")
    assert choose(rule="chain")[0] == "speculative"  # the only chain drawn from the draft
    # none measured: the constant plan of the first method whose trees, drawn as the rule needs, it verifies
    method, plan, about, _ = choose(rule="recursive_wor")
    assert (method, plan) == ("tree", dataclasses.replace(constant(1.0), rule="recursive_wor"))
    assert "the profile has no plan of speculative, tree, staged, lookup lossless for --rule recursive_wor" in about


def test_the_rule_messages_follow_verify_lossless(monkeypatch):
    """The command line's words for where a rule is lossless come from verify.LOSSLESS, the core's
    one table: change the table and both the option check and the plan's check follow it."""
    from specdec_np import verify
    from specdec_np.plan import Plan
    from specdec_np.tools.options import check_options, check_rule, lossless_on

    a = namespace(rule="traversal", sampled="without")
    drawn = Plan(shape="fixed", widths=(2, 1), sampled="without", rule="traversal")
    check_options(a)  # traversal is lossless on trees drawn without replacement
    check_rule(drawn, "tree", 1.0)
    assert "without replacement" in lossless_on("traversal")
    table = dict(verify.LOSSLESS, without_replacement=("recursive_wor", ("greedy", "recursive_wor")))
    monkeypatch.setattr(verify, "LOSSLESS", table)
    needle = ("--rule traversal is lossless only on trees whose children are drawn from the draft with replacement "
              r"\(--sampled with, or --method speculative at temperature > 0\), not on ")
    with pytest.raises(ValueError, match=needle + r"the trees of --sampled without$"):
        check_options(a)
    with pytest.raises(ValueError, match=needle + r"the trees of method tree \(widths 2,1 drawn from the draft"):
        check_rule(drawn, "tree", 1.0)
    monkeypatch.setattr(verify, "LOSSLESS", dict(table, deterministic=("point_mass", ("greedy", "point_mass",
                                                                                       "traversal"))))
    assert lossless_on("traversal").startswith("on trees of the draft's top tokens (no --sampled) or on trees whose")


@pytest.mark.parametrize("options, methods", [
    (dict(budget=8), ("tree", "staged", "ngram", "eagle")),
    (dict(depth=3), ("speculative", "tree", "staged", "ngram", "lookup", "eagle")),
    (dict(widths="2,1"), ("tree", "staged", "eagle")), (dict(sampled="with"), ("tree", "staged", "eagle")),
    (dict(copy_len=4), ("staged",)), (dict(min_q=0.3, widths="1,1"), ("tree", "staged", "eagle")),
    (dict(min_q=0.3), ("speculative", "tree", "staged", "eagle")),
    (dict(rule="traversal"), ("speculative", "tree", "staged", "ngram", "lookup", "eagle")),
    (dict(copy_len=4, depth=3), ("staged",)), (dict(), ()), (dict(method="ar"), ("ar",)),
])
def test_the_options_narrow_the_machines_choice_to_the_methods_they_shape(options, methods):
    from specdec_np.tools.options import candidate_methods

    assert candidate_methods(namespace(**options)) == methods


@pytest.mark.parametrize("args, needle", [
    # Options that would do nothing, whatever the machine's plan would have been (checked before it is measured).
    (["--method", "lookup", "--widths", "2,1"], "--widths does nothing with --method lookup, whose plan is a chain "
                                                "of 4 copied"),
    (["--method", "speculative", "--widths", "2"], "--widths does nothing with --method speculative"),
    (["--method", "ngram", "--widths", "2"], "--widths does nothing with --method ngram, whose plan is best-first"),
    (["--method", "lookup", "--sampled", "with"], "--sampled does nothing with --method lookup"),
    (["--method", "speculative", "--sampled", "without", "--temperature", "1"], "--sampled does nothing with --method "
                                                                               "speculative"),
    (["--method", "ngram", "--sampled", "with"], "--sampled does nothing with --method ngram"),
    (["--method", "ar", "--rule", "greedy"], "--rule does nothing with --method ar, whose plan is plain decoding"),
    (["--method", "ar", "--depth", "3"], "--depth does nothing with --method ar"),
    (["--method", "tree", "--copy-len", "3"], "--copy-len does nothing with --method tree, whose plan is best-first, "
                                              "8 nodes at most 6 deep: it applies to --method staged"),
    (["--method", "lookup", "--min-q", "0.3"], "--min-q does nothing with --method lookup"),
    (["--min-q", "0.3"], "--min-q 0.3 stops a fixed-width tree or a chain: give --widths or --sampled"),
    (["--min-q", "0.3", "--budget", "8", "--method", "tree"], "--min-q 0.3 stops a fixed-width tree or a chain"),
    (["--min-q", "1.5", "--widths", "1,1"], "--min-q must be a number from 0 to 1, got 1.5"),
    (["--top-k", "50"], "--top-k 50: at temperature 0 decoding is greedy"),
    (["--top-p", "0.9"], "--top-p 0.9: at temperature 0 decoding is greedy"),
    (["--rule", "block"], "--rule block: at temperature 0 decoding is greedy"),
    # Sizes: the same answer whichever method the machine's measurement would pick.
    (["--budget", "100000"], "up to 100000 tokens per step (--budget 100000"),
    (["--depth", "100000"], "up to 100000 tokens per step (--depth 100000)"),
    (["--widths", "30,30"], "up to 930 tokens per step (--widths 30,30"),
    (["--copy-len", "600"], "(--budget 8, --copy-len 600) exceed the target's context (n_ctx=512)"),
    # --rule against what the options say about the tree, in the command line's terms.
    (["--rule", "block", "--sampled", "without", "--temperature", "1"],
     "--rule block is lossless only on trees whose children are drawn from the draft with replacement (--sampled "
     "with, or --method speculative at temperature > 0) that are chains (--method speculative, or --widths 1,1,1), "
     "not on the trees of --sampled without"),
    (["--rule", "block", "--widths", "2,1", "--temperature", "1"], "not on the trees of --widths 2,1"),
    (["--rule", "recursive", "--method", "lookup", "--temperature", "1"], "--rule recursive is lossless only on trees "
                                                                         "whose children are drawn from the draft with "
                                                                         "replacement"),
])
def test_options_that_cannot_apply_fail_before_the_machine_is_measured(args, needle, monkeypatch, capsys):
    from specdec_np.tools import cli

    def measured(*a, **k):
        raise AssertionError("the machine was measured")

    monkeypatch.setattr(cli, "choose", measured)
    assert main(["generate", "def f(x):", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


@pytest.mark.parametrize("args, needle", [
    # Options that would change nothing (issue 45's silent acceptances), from the methods' properties.
    (["--seed", "7"], "--seed 7: at temperature 0 decoding is greedy"),
    (["--top-p", "1", "--temperature", "1"], "--top-p 1 keeps every token, so it changes nothing"),
    (["--recalibrate", "--plan", "default"], "--recalibrate does nothing with --plan default"),
    (["--recalibrate", "--method", "ar"], "--recalibrate does nothing with --method ar"),
    (["--draft", "/nonexistent", "--method", "ar"], "--draft does nothing with --method ar and --plan machine: it "
                                                    "applies to --method speculative, tree, staged, lookup"),
    (["--draft", "tiny-draft", "--method", "lookup", "--plan", "default"], "--draft does nothing with --method lookup"),
    (["--ngram", "/nonexistent", "--method", "tree", "--plan", "default"], "--ngram does nothing with --method tree"),
    (["--draft", "bogus", "--method", "lookup"], "bogus"),  # read for lookup's plan: loaded, not dropped quietly
    (["--file", ""], "--file is empty"),
    (["--out", "x" * 300], "--out " + "x" * 300 + ": cannot write there: File name too long"),
    (["--out", "-"], "--out -: give a file name (it writes a file, not standard output), e.g. trace.html"),
])
def test_options_that_change_nothing_or_name_nothing_are_one_line_errors(args, needle, monkeypatch, capsys, tmp_path):
    from specdec_np.tools import cli

    monkeypatch.setattr(cli, "choose", lambda *a, **k: pytest.fail("the machine was measured"))
    monkeypatch.chdir(tmp_path)
    command = "trace" if "--out" in args else "generate"
    assert main([command, *(["def f(x):"] if "--file" not in args else []), *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_seed_at_temperature_0_is_accepted_where_the_trees_are_drawn(capsys):
    assert main(["generate", "def f(x):", "--method", "tree", "--plan", "default", "--sampled", "with",
                 "--widths", "2,1", "--seed", "3", "--max-new-tokens", "4"]) == 0


def test_trace_refuses_to_replace_a_read_only_file(tmp_path, capsys):
    out = tmp_path / "t.html"
    out.write_text("mine")
    out.chmod(0o444)
    assert main(trace_args(out)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--out {out} is read-only" in lines[0], lines
    assert out.read_text() == "mine" and out.stat().st_mode & 0o777 == 0o444


def test_demo_options_reshape_each_plan_as_the_cli_does(monkeypatch, embedded):
    # The demo's --budget/--depth mean what the CLI's do (one chooser, choice.choose): a chain's
    # length for the chain methods, a best-first tree of the draft's top tokens for the others.
    import argparse

    from specdec_np.plan import Plan, constant

    drawn = {"speculative": dict(chain=3, sampled="with", rule="block"), "lookup": dict(lookup_chains=(7, 3, 0)),
             "staged": dict(shape="fixed", widths=(2, 1), sampled="without", rule="traversal")}
    measured_machine(monkeypatch, {m: (shape, 2.0) for m, shape in drawn.items()})
    methods = ("ar", *drawn)
    a = argparse.Namespace(plan="machine", budget=None, depth=4)
    got = {m: p for m, (p, _) in demo.plans(a, *embedded, 1.0, methods)[0].items()}
    assert got["ar"] == constant(1.0)  # plain decoding has no tree to resize
    assert (got["speculative"].chain, got["speculative"].rule) == (4, "block")
    assert (got["lookup"].chain, got["lookup"].lookup_chains) == (4, ())
    assert (got["staged"].shape, got["staged"].depth, got["staged"].sampled, got["staged"].rule) == \
        ("best_first", 4, None, None)
    a.depth, a.budget = None, 8  # --budget resizes the trees only, and only their plans say so
    about = {m: origin for m, (_, origin) in demo.plans(a, *embedded, 1.0, methods)[0].items()}
    assert [m for m in methods if "changed by options" in about[m]] == ["staged"]
    a.budget = None
    assert all(p == Plan(**drawn[m]) for m, (p, _) in demo.plans(a, *embedded, 1.0, tuple(drawn))[0].items())


def test_the_demo_says_which_plan_each_row_used_and_why(monkeypatch, embedded):
    import argparse

    from specdec_np.plan import Plan
    from specdec_np.tools import choice

    measured = Plan(chain=3)
    chosen = {"ar": choice.Choice("ar", Plan(), 2.0, 2.0),
              "speculative": choice.Choice("speculative", measured, 1.0, 2.0),
              "lookup": choice.Choice("lookup", Plan(), constant="the constant plan: the machine was busy")}
    monkeypatch.setattr(demo, "choose", lambda *a, **k: chosen)
    a = argparse.Namespace(plan="machine", budget=None, depth=None)
    got = demo.plans(a, *embedded, 0.0, tuple(chosen))[0]
    assert got["speculative"] == (measured, "this machine's measured plan, predicted 2.00x plain decoding")
    assert got["lookup"] == (Plan(), "the constant plan: the machine was busy")
    monkeypatch.setattr(demo, "choose", choice.choose)  # the real choice, measuring nothing with --plan default
    a.plan = "default"
    got = demo.plans(a, *embedded, 0.0, ("ar", "tree"))[0]
    assert got == {"ar": (Plan(), "the baseline"), "tree": (Plan(), "the constant plan, as --plan default asks")}


def test_the_demos_row_without_copies_is_stageds_best_plan_without_copies(monkeypatch, embedded):
    """Issue 59: the demo's row "staged, no copies" runs staged with the fastest measured plan that copies
    nothing (as bench's row), its copy_len 0; with the constant plan, staged's constant plan less its copies."""
    import argparse
    import dataclasses

    from specdec_np.plan import Plan
    from specdec_np.tools import choice

    copying, guessing = Plan(copy_len=7, guess_len=3), Plan(shape="fixed", widths=(1, 1), guess_len=2)

    def fake(*args, keep=None, **kwargs):
        if keep is None:
            return {m: choice.Choice(m, copying, 2.0, 4.0) for m in args[5]}
        assert keep({"shape": {"copy_len": 0}}) and not keep({"shape": {"copy_len": 7}})  # plans without copies
        return {"staged": choice.Choice("staged", guessing, 2.0, 3.0)}

    monkeypatch.setattr(demo, "choose", fake)
    a = argparse.Namespace(plan="machine", budget=None, depth=None)
    got = demo.plans(a, *embedded, 0.0, ("ar", "staged", demo.NO_COPIES))[0]
    assert got["staged"][0] == copying
    assert got[demo.NO_COPIES] == (dataclasses.replace(guessing, copy_len=0),
                                   "this machine's measured plan, predicted 1.50x plain decoding")
    monkeypatch.setattr(demo, "choose", choice.choose)
    a.plan = "default"
    got = demo.plans(a, *embedded, 0.0, ("staged", demo.NO_COPIES))[0]
    assert got["staged"][0].copy_len > 0 and got[demo.NO_COPIES][0] == dataclasses.replace(got["staged"][0], copy_len=0)


def test_the_demos_eagle_row_runs_the_plan_choose_gives(monkeypatch, embedded):
    """Issue 61: the demo asks choose for eagle's plan with the EAGLE head, beside the other rows, and runs and says
    what choose gives, measured or not (choose gives a head with no measured plan its draft twin's: test_plan)."""
    import argparse

    from specdec_np.plan import Plan
    from specdec_np.tools import choice

    eagle_plan, asked = Plan(shape="fixed", widths=(1, 1, 1)), []
    eagle_why = {"now": f"tree's plan, {choice.SAME_TREE} (the constant plan: the acceptance profile holds no eagle "
                        "plans)"}

    def fake(*args, **kwargs):
        asked.append((args[5], kwargs.get("head")))
        return {m: choice.Choice(m, eagle_plan, constant=eagle_why["now"]) if m == "eagle" else
                choice.Choice(m, Plan(), 2.0, 4.0) for m in args[5]}

    monkeypatch.setattr(demo, "choose", fake)
    a, head = argparse.Namespace(plan="machine", budget=None, depth=None), object()
    for methods in (("ar", "tree", "eagle"), ("ar", "eagle")):
        asked.clear()
        got = demo.plans(a, *embedded, 0.0, methods, head)[0]
        assert got["eagle"] == (eagle_plan, eagle_why["now"]) and asked == [(tuple(methods), head)]
    eagle_why["now"] = ""  # measured: its own plan, said as the others are
    got = demo.plans(a, *embedded, 0.0, ("ar", "tree", "eagle"), head)[0]
    assert got["eagle"][0] == eagle_plan and "measured plan" in got["eagle"][1]


def test_the_demo_says_when_its_completions_stop_at_the_context(monkeypatch, capsys):
    class Stop(Exception):
        pass

    monkeypatch.setattr(demo, "generate", lambda *a, **k: (_ for _ in ()).throw(Stop))
    with pytest.raises(Stop):
        demo.main(["--plan", "default", "--max-new-tokens", "2000"])
    assert "note: --max-new-tokens 2000: the target's context (512 tokens) leaves room for 429 after the prompt, " \
        "where each completion stops" in capsys.readouterr().out


def test_the_demos_speeds_are_intervals_and_its_prose_never_ranks_rows_within_noise(monkeypatch, capsys, embedded):
    """Issue 69: each row is timed in interleaved runs (the rows in turn, the same tokens each run); the table gives the
    median speed and the speedup's range, each run's speedup over its own round's ar; the prose names a row fastest
    only when its range lies above every other row's (the demo said 1.80x and 2.34x of two rows that did identical
    work), else says which rows are within noise. Clocks here are a fake, so the figures are known."""
    from specdec_np.plan import Plan
    from specdec_np.tokenizer import encode

    target, draft, ngram, enc = embedded
    prompt, order = encode(enc, demo.PROMPT), []
    runs = {m: demo.generate(target, prompt, 8, method=m, draft=draft if m != "ar" else None, keep_trees=True)
            for m in ("ar", "speculative", "tree")}

    def generate(*args, method, **kw):  # the demo's generate, noting the order of the runs (decoded above)
        order.append(method)
        return runs[method]
    monkeypatch.setattr(demo, "generate", generate)
    seconds = iter([0.0, 1.0, 1.0, 1.5, 3.0, 3.5,  # round 1: ar 1 s, speculative 0.5 s, tree 0.5 s
                    4.0, 5.0, 5.0, 5.4, 6.0, 6.6,  # round 2: ar 1 s, speculative 0.4 s, tree 0.6 s
                    7.0, 9.0, 9.0, 9.8, 10.0, 10.8])  # round 3: ar 2 s, speculative 0.8 s, tree 0.8 s
    monkeypatch.setattr(demo.time, "perf_counter", lambda: next(seconds))
    plans = {m: (Plan(), "a plan") for m in ("ar", "speculative", "tree")}
    results = demo.run_methods(target, draft, ngram, prompt, 8, plans)
    assert order == ["ar", "speculative", "tree"] * demo.ROUNDS
    assert sum((dts for _, dts in results.values()), []) == pytest.approx([1, 1, 2, 0.5, 0.4, 0.8, 0.5, 0.6, 0.8])
    demo.report(results, plans, None)
    out = capsys.readouterr().out
    assert "| speculative       |     16.0 |           2.50x (2.00-2.50) |" in out  # 8 tokens / 0.5 s
    assert "| tree              |     13.3 |           2.00x (1.67-2.50) |" in out
    assert "No row is fastest beyond the noise: speculative's speedup range overlaps tree's." in out
    assert "Within noise of each other (their ranges overlap: no order between them): speculative ~ tree." in out
    # The control: ranges apart are ranked, and only those.
    said = demo.within_noise({"tree": [1.9, 2.3, 2.4], "staged": [2.6, 2.7, 2.9], "speculative": [1.7, 1.8, 2.0]})
    assert said.startswith("Fastest here beyond the noise: staged (") and said.endswith(": tree ~ speculative.")
    assert "Within noise" not in demo.within_noise({"a": [2.0, 2.1, 2.2], "b": [1.0, 1.1, 1.2]})


def test_generate_with_a_sequence_level_rule():
    r = run_cli("generate", "def f(x):", "--max-new-tokens", "12", "--method", "speculative", "--plan", "default",
                "--temperature", "1", "--top-k", "50", "--rule", "block", "--stats")
    assert r.returncode == 0 and "block verification" in r.stderr, r.stderr


def test_help_has_examples():
    r = run_cli("generate", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "--method" in r.stdout


def test_demo_small(capsys):
    from specdec_np.tools import choice

    assert demo.main(["--max-new-tokens", "24"]) == 0
    out = capsys.readouterr().out
    assert "All 7 rows produced the identical completion" in out and "differs" not in out
    assert "| staged" in out and "(root)" in out and "sampled decoding" in out and "Plans:" in out
    # Issue 59: staged without copies is a row of its own, and each row's tokens are split by where they came
    # from, stage 2's guesses apart from its copies sent to the target; each table's rows, greedy and sampled.
    head = "| tokens: draft | guessed | copied | target |"
    assert out.count(head) == 2
    for table in out.split(head)[1:]:
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in itertools.takewhile(lambda x: x.startswith("| "), table.splitlines()[2:])}
        assert {"ar", "staged", "staged, no copies"} <= set(rows)
        for cells in rows.values():  # tokens by part add up to the 24 emitted; at most one target's per pass
            assert sum(map(int, cells[-4:])) == 24 and 0 < int(cells[-1]) <= int(cells[2])
        assert rows["staged, no copies"][-2] == "0" and rows["ar"][-4:] == ["0", "0", "0", "24"]
    assert "staged, no copies: " in out and "; no copies (" in out  # its plan, said
    # Issue 61: the EAGLE head's row is in the greedy table (and so in the identical-completion check above),
    # with its plan and why: its own, measured from the profile's eagle plans, or else the tree row's.
    greedy = out.split("== sampled")[0]
    assert "| eagle             |" in greedy and "eagle: its draft is the target's EAGLE head" in greedy
    eagle_plan = next(line for line in greedy.splitlines() if line.startswith("  eagle: "))
    assert "(this machine's measured plan" in eagle_plan or f"tree's plan, {choice.SAME_TREE}" in eagle_plan, eagle_plan
    assert "4-gram repeats: " in out and " of the 24 emitted tokens" in out
    # Issue 70: the completion shown ends at HumanEval's stop sequences by default (the tables decode all 24).
    assert "The staged completion, ended by --stop at the first of HumanEval's stop sequences" in out
    assert "(the tables decode all 24)" in out


def test_the_demos_header_says_plain_decodings_roofline(tmp_path, monkeypatch, capsys):
    """With this machine's costs (made up here, as on a quiet machine), the demo's first line is plain decoding's
    roofline: the target's weight bytes over its one-token pass, against the read-rate probe."""
    from specdec_np.tools import calibration

    curve = {s: {k: 0.1 * k for k in (1, 2, 4, 8)} for s in ("warm", "cold")}
    costs = {"curves": {"target": curve, "draft": curve}, "layout": {"target": 0, "draft": 0}, "read_gbps": 20.0,
             "overheads": {s: dict.fromkeys(("step", "draft_step", "draft_dist", "ngram_query"), 0.01)
                           for s in ("greedy", "sampled")}}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for quiet in ("busy", "busy_since"):
        monkeypatch.setattr(calibration, quiet, lambda *a: "")
    monkeypatch.setattr(calibration, "measure_costs", lambda *a, **k: costs)
    monkeypatch.setattr(calibration, "head_curves", lambda *a, **k: curve)
    assert demo.main(["--max-new-tokens", "4", "--no-sampled"]) == 0
    assert capsys.readouterr().out.startswith("roofline: plain decoding's one-token pass reads the target's 70.2 MB "
                                              "of weights in 0.10 ms, 701.6 GB/s, 3508% of the 20.0 GB/s")


def test_the_demo_shows_a_tree_with_the_constant_plan(capsys):
    """The constant plan (`--plan default`, and a busy machine's with no cached costs) has stage 2 guess in most
    steps: the demo still shows a verification tree, its nodes marked by who proposed them."""
    assert demo.main(["--max-new-tokens", "24", "--plan", "default", "--no-sampled"]) == 0
    out = capsys.readouterr().out
    assert "One verification tree (" in out and "(root)" in out
    tree = out.split("One verification tree (")[1]
    assert "proposed tokens" not in tree.splitlines()[0] or "(ngram)" in tree or "(copy)" in tree


def test_bench_with_fixture(tmp_path, capsys):
    assert bench.main(["--prompts", str(FIXTURE), "--limit", "2", "--max-new-tokens", "16", "--out", str(tmp_path),
                       "--seeds", "2", "--results", str(tmp_path / "results.md")]) == 0
    out = capsys.readouterr().out
    assert "| staged |" in out and "| (ref.) prompt lookup |" in out and "### greedy" in out and "### top-k" in out
    assert "ms per target pass" in out and "staged's tokens/s over each method's" in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["prompts"] == 2 and res["seeds"] == 2
    # Top-k runs each prompt with 2 seeds; greedy once (it is deterministic).
    assert [len(res["summary"][s]["staged"]["per_prompt_speedup"]) for s in ("greedy", "top-k")] == [2, 4]
    against = res["summary"]["top-k"]["staged"]["against"]
    assert set(against) == set(bench.METHODS) - {"staged"} and all(lo <= r <= hi for r, lo, hi in against.values())
    assert all(lo <= r <= hi for per in res["summary"].values() for r, lo, hi in
               (row["over_baseline"] for row in per.values()))
    assert set(res["plans"]["greedy"]) == set(bench.METHODS) and res["machine"]["cpus"] >= 1
    section = (tmp_path / "results.md").read_text()
    assert f"## {bench.machine_name()}" in section and "python -m specdec_np bench --prompts" in section
    kernel = res["machine"]["blas"]["kernel"]  # the section names the BLAS it was measured with
    assert "BLAS: " in section and f"{kernel} kernel" in section and "layout: target" in section
    g = res["summary"]["greedy"]
    assert g["ar"]["relative_weight_traffic"] == pytest.approx(1.0)
    assert all(g[m]["same_as_baseline"] for m in g)
    assert g["staged"]["tokens"] == g["ar"]["tokens"]
    assert len(g["ar"]["repeat_share"]) == 2 and "4-gram repeats (share of emitted tokens" in out
    assert f"wrote {tmp_path / 'results.json'} and {tmp_path / 'results.md'}" in out


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
    with pytest.raises(ValueError, match="needs a non-empty \"prompt\" field"):
        bench.acceptance.read_prompts(bad)
    assert len(bench.acceptance.read_prompts(FIXTURE)) == 3


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path, monkeypatch):
    real = bench.importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ValueError, match="--plot needs matplotlib"):
        bench.main(["--prompts", str(FIXTURE), "--plot", "--out", str(tmp_path)])
    assert not (tmp_path / "results.json").exists()


def test_no_prompt_with_standard_input_closed_is_one_line():
    for args in (["generate"], ["generate", "-"]):
        needle = "no prompt: standard input is closed: give the prompt as an argument or with --file"
        r = subprocess.run([sys.executable, "-m", "specdec_np", *args, "--plan", "default"], capture_output=True,
                           text=True, cwd=ROOT, timeout=300, preexec_fn=lambda: os.close(0))  # `<&-`
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


def test_the_end_of_text_token_is_not_printed(monkeypatch, capsys, embedded):
    from specdec_np.record import Result
    from specdec_np.tools import cli

    real = cli.generate

    def ends_at_eos(target, prompt, *args, **kwargs):  # as if the model had emitted <|endoftext|> last
        res = real(target, prompt, *args, **kwargs)
        return Result(res.tokens + [target.config.n_vocab - 1], res.stats, "eos")

    monkeypatch.setattr(cli, "generate", ends_at_eos)
    assert main(["generate", "def f(x):", "--method", "ar", "--plan", "default", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def f(x):") and len(out) > len("def f(x):\n") and "<|endoftext|>" not in out
    monkeypatch.setattr(cli, "generate", real)
    assert main(["generate", "def f(x):", "--method", "ar", "--plan", "default", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out == out  # the same text, without the end-of-text token


def test_a_draft_whose_context_the_prompt_fills_is_named_before_the_machine_is_measured(tmp_path, monkeypatch, capsys):
    from specdec_np import checkpoint
    from specdec_np.gpt2 import GPT2Config, random_params
    from specdec_np.tools import cli

    checkpoint.save(random_params(GPT2Config(n_vocab=8193, n_ctx=8, n_embd=8, n_layer=1, n_head=2)), tmp_path / "short")
    monkeypatch.setattr(cli, "choose", lambda *a, **k: pytest.fail("the machine was measured"))
    prompt = "def add(a, b):\n    return a + b\n"  # more than 8 tokens
    for args in ([], ["--method", "staged", "--plan", "default"], ["--method", "tree"]):
        assert main(["generate", prompt, "--draft", str(tmp_path / "short"), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and f"--draft {tmp_path / 'short'}: the prompt has 16 tokens: the draft's context " \
            "(n_ctx=8) must hold more; shorten it, or decode with a method that runs no draft (ar, ngram, lookup)" \
            in lines[0], lines
    # Methods that run no draft decode (the machine's plan for lookup reads the pair's profile).
    from specdec_np.plan import Plan
    from specdec_np.tools.choice import Choice
    monkeypatch.setattr(cli, "choose", lambda *a, **k: {m: Choice("lookup", Plan(), 1.0, 2.0) for m in a[5]})
    assert main(["generate", prompt, "--draft", str(tmp_path / "short"), "--method", "lookup",
                 "--max-new-tokens", "3"]) == 0


def trace_args(out):
    return ["trace", "def f(x):", "--method", "ar", "--plan", "default", "--max-new-tokens", "3", "--out", str(out)]


def test_trace_writes_through_a_symlink_and_the_link_stays(tmp_path, capsys):
    for existing in (True, False):  # a link to a file, and a dangling link (the file is created)
        real, link = tmp_path / f"real-{existing}.html", tmp_path / f"link-{existing}.html"
        if existing:
            real.write_text("old")
        link.symlink_to(real)
        assert main(trace_args(link)) == 0, capsys.readouterr().err
        assert link.is_symlink() and os.readlink(link) == str(real)
        assert real.is_file() and real.read_text().startswith("<!doctype html>")
        assert f"wrote {link}:" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link-False.html", "link-True.html", "real-False.html",
                                                          "real-True.html"]  # no temporary file left


def test_trace_refuses_what_is_not_a_regular_file(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "to-fifo.html"
    link.symlink_to(fifo)
    loop = tmp_path / "loop.html"
    loop.symlink_to(loop)
    for out, needle in ((fifo, f"--out {fifo} is not a regular file (a FIFO)"),
                        (link, f"--out {link} is not a regular file (a FIFO)"),
                        (loop, f"--out {loop} is not a regular file (a symlink loop)")):
        assert main(trace_args(out)) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert fifo.is_fifo() and link.is_symlink() and loop.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "loop.html", "to-fifo.html"]


def test_trace_out_where_nothing_can_be_written_names_out(tmp_path, monkeypatch, capsys):
    from specdec_np.tools import trace, writable

    def refused(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "tmpk3x9"))

    with monkeypatch.context() as m:  # an unwritable directory (root may write anywhere: simulated)
        m.setattr(writable.tempfile, "TemporaryFile", refused)
        assert main(trace_args(tmp_path / "t.html")) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {tmp_path / 't.html'}: cannot write in {tmp_path}: Permission denied"
    if os.geteuid() != 0:  # a read-only directory for real
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert main(trace_args(ro / "t.html")) == 2
        assert f"--out {ro / 't.html'}: cannot write in {ro}" in capsys.readouterr().err

    def full(*a, **k):  # the disk fills while the page is written
        raise OSError(28, "No space left on device", str(tmp_path / "t.html.abc123.tmp"))

    monkeypatch.setattr(trace, "write", full)
    assert main(trace_args(tmp_path / "t.html")) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --out {tmp_path / 't.html'}: No space left on device: not written (a file already there "
                   "is kept)")


@pytest.mark.parametrize("args, needle", [
    (["/dev/null"], "text file /dev/null is not a regular file"),  # was "does not exist"
    (["a" * 6000], f"text file {'a' * 60}... (6000 characters): File name too long"),  # was a bare [Errno 36]
    (["{src}", "--n-vocab", "0"], "--n-vocab must be in 257..50257"),  # was GPT-2's 50257, silently
    (["{src}", "--min-count", "0"], "--min-count must be >= 1"),  # was the core's min_count=0, not the option
    (["{src}", "--n-vocab", "256"], "--n-vocab must be in 257..50257"),
    (["{src}", "--n-vocab", "50258"], "--n-vocab must be in 257..50257"),
    (["{src}", "--out", "-"], "--out -: give a file name (it writes a file, not standard output), e.g. trigram.npz"),
])
def test_ngram_fit_names_what_it_cannot_read_or_write(tmp_path, capsys, args, needle):
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    return x\n")
    out = [] if "--out" in args else ["--out", str(tmp_path / "t.npz")]
    assert main(["ngram", "fit", *(a.format(src=src) for a in args), *out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]
    assert main(["ngram", "fit", str(src), "--out", str(tmp_path / "t.npz"), "--n-vocab", "257"]) == 0  # the control


def test_ngram_fit_names_a_file_that_is_not_utf8(tmp_path, capsys):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("def f(x):\n    return x\n")
    bad.write_bytes(b"x = '\xff'\n")
    assert main(["ngram", "fit", str(good), str(bad), "--out", str(tmp_path / "t.npz")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"text file {bad} is not UTF-8 text: byte 5 is b'\\xff'" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py", "good.py"]


def test_bench_prompts_that_are_not_jsonl_say_what_to_give(tmp_path):
    for name, data, needle in (("prompt.py", b"def f(x):\n", "line 1: not JSON (Expecting value): give a JSONL file"),
                               ("numbers.jsonl", b"5\n", "line 1 needs a non-empty \"prompt\" field: give a JSONL"),
                               ("latin1.jsonl", b'{"prompt": "\xe9"}\n', "not UTF-8 text")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError) as e:
            bench.acceptance.read_prompts(tmp_path / name)
        assert str(e.value).startswith(f"{tmp_path / name}: ") and needle in str(e.value)
    r = run_cli("bench", "--prompts", str(tmp_path / "prompt.py"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: --prompts {tmp_path / 'prompt.py'}: line 1: not JSON")


def test_the_suite_runs_blas_on_one_thread():
    # conftest pins it (on a busy machine OpenBLAS's threads wait for each other at every call),
    # here and in the command lines the tests start.
    import threadpoolctl

    blas = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)
    code = "import numpy, threadpoolctl; print(max(p['num_threads'] for p in threadpoolctl.threadpool_info()))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "1"


def test_the_demo_says_when_its_timings_were_taken_on_a_busy_machine(monkeypatch):
    # The demo (and the lessons) print machine.timing_note under what they timed.
    import os

    from specdec_np.tools import machine

    def since(others):  # a snapshot 10 s ago; now: own 15 s more, others `others` cores' worth
        monkeypatch.setattr(machine, "cpu_times", lambda: (100.0 + 15 + 10 * others, 65.0, 10.0))
        return (100.0, 50.0, 0.0)

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    line = machine.timing_note(since(1.0))
    assert "other processes used 1.0 of its 2 cores" in line and "rerun when it is idle" in line
    assert machine.timing_note(since(0.1)) == ""  # quiet: nothing to say
    assert machine.timing_note(since(0.1), "a figure was off", "why") == "note: a figure was off: why"


def link(kind, src, dst):
    if kind == "symlink":
        os.symlink(src, dst)
    else:
        os.link(src, dst)


@pytest.mark.parametrize("out", ["same", "symlink", "hardlink", "dotted"])
def test_ngram_fit_refuses_an_out_that_is_one_of_its_inputs(tmp_path, capsys, out):
    """B8: the input is never replaced by the model, whatever path names it."""
    src = tmp_path / "src.py"
    src.write_text("def f(x):\n    return x\n")
    (tmp_path / "sub").mkdir()
    path = {"same": src, "dotted": tmp_path / "sub" / ".." / "src.py"}.get(out, tmp_path / "alias.py")
    if out in ("symlink", "hardlink"):
        link(out, src, path)
    assert main(["ngram", "fit", str(src), "--out", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--out {path} is the input {src}" in lines[0], lines
    assert src.read_text() == "def f(x):\n    return x\n"


@pytest.mark.parametrize("katz_k", ["1000000000000000000000000000000", "1000000000", "0", "6"])
def test_ngram_fit_bounds_katz_k_by_the_tokens(tmp_path, capsys, katz_k):
    """B9: an absurd --katz-k is one line naming it (it was an OverflowError or a 7.45 GiB table)."""
    src = tmp_path / "src.py"
    src.write_text("x = 1\n")  # 4 tokens
    assert main(["ngram", "fit", str(src), "--out", str(tmp_path / "t.npz"), "--katz-k", katz_k]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--katz-k must be in 1..5 (no n-gram of the files' 4 tokens" in lines[0], lines
    assert not (tmp_path / "t.npz").exists()


def test_ngram_fit_takes_the_vocabulary_from_a_checkpoint_and_says_the_shipped_one(tmp_path, capsys):
    from specdec_np import ngram
    from specdec_np.files import WEIGHTS_DIR

    src = tmp_path / "src.py"
    src.write_text("def f(x):\n    return x\n")
    assert main(["ngram", "fit", str(src), "--out", str(tmp_path / "t.npz"), "--vocab-from",
                 str(WEIGHTS_DIR / "tiny-target")]) == 0
    assert ngram.load(tmp_path / "t.npz").n_vocab == 8193
    assert main(["ngram", "fit", str(src), "--out", str(tmp_path / "u.npz")]) == 0  # the default: GPT-2's
    assert ngram.load(tmp_path / "u.npz").n_vocab == 50257
    with pytest.raises(SystemExit):
        main(["ngram", "fit", "--help"])
    assert "8193 for the embedded tiny models" in " ".join(capsys.readouterr().out.split())


def no_measuring(*args, **kwargs):
    raise AssertionError("measured before the check")


@pytest.mark.parametrize("lines, extra, needle", [
    # B5: --max-new-tokens that leaves no room for a prompt (the slice start went positive).
    (['{"prompt": "def f():"}'], ["--max-new-tokens", "600"], "--max-new-tokens 600 leaves no room for a prompt"),
    (['{"prompt": "def f():"}'], ["--max-new-tokens", "511"], "give at most 510"),
    # B6: an empty prompt, named by file and line.
    (['{"prompt": "def f():"}', '{"prompt": ""}'], [], "p.jsonl: line 2 needs a non-empty \"prompt\" field"),
    # B7: a gzip whose deflate data is corrupt.
    (None, [], "c.jsonl.gz: not gzipped UTF-8 text"),
])
def test_bench_checks_prompts_and_sizes_before_measuring_and_leaves_no_out(tmp_path, capsys, monkeypatch, lines,
                                                                           extra, needle):
    import gzip
    monkeypatch.setattr(bench, "calibration", no_measuring)
    if lines is None:
        data = bytearray(gzip.compress(b"".join(b'{"prompt":"x%d"}\n' % i for i in range(2000))))
        data[40:60] = bytes(x ^ 255 for x in data[40:60])
        prompts = tmp_path / "c.jsonl.gz"
        prompts.write_bytes(bytes(data))
    else:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("\n".join(lines) + "\n")
    out = tmp_path / "b"
    assert main(["bench", "--prompts", str(prompts), "--plan", "default", "--settings", "greedy", "--out", str(out),
                 *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], err
    assert not out.exists()


def test_bench_says_once_that_it_cuts_long_prompts(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "calibration", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "x = 1"}\n' + '{"prompt": "%s"}\n' % ("y = 2\\n" * 40) * 2)
    assert main(["bench", "--prompts", str(prompts), "--max-new-tokens", "500", "--out", str(tmp_path / "b")]) == 130
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == "interrupted"  # Ctrl-C: one line, exit 130
    notes = [line for line in out.splitlines() if "longer than" in line]
    assert notes == ["note: 2 of 3 prompts are longer than the 11 tokens the context (512) leaves beside "
                     "--max-new-tokens 500: each keeps its last 11 tokens"]
    assert not (tmp_path / "b").exists()


def test_the_readmes_demo_table_counts_are_a_runs(embedded):
    """The README's demo table gives each row's counts (target passes, tokens per pass, draft passes, weight
    traffic, where the tokens came from) as the same on every machine for its plan: a run of each plan here gives
    them exactly. The plans are the ones the README's run lists under its table (that machine's choices)."""
    from specdec_np.decode import generate
    from specdec_np.models import load_head
    from specdec_np.plan import Plan
    from specdec_np.tokenizer import encode
    from specdec_np.tools import acceptance

    target, draft, ngram, enc = embedded
    head = load_head(target=target)  # the eagle row's draft, here on the tree row's tree
    tree = Plan(shape="fixed", widths=(1, 1, 1))
    rows = {"ar": ("ar", Plan()), "speculative": ("speculative", Plan(chain=3)), "tree": ("tree", tree),
            "staged": ("staged", Plan(shape="fixed", widths=(1, 1, 1), guess_len=0, guess_rows=0, copy_len=15)),
            demo.NO_COPIES: ("staged", Plan(shape="fixed", widths=(1, 1, 1), guess_len=2, guess_rows=4, copy_len=0)),
            "lookup": ("lookup", Plan(lookup_chains=(23, 7, 0))), "eagle": ("eagle", tree)}
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = {cells[0]: cells[3:] for line in readme.splitlines() if line.startswith("| ")
             and (cells := [c.strip() for c in line.strip("|").split("|")])[0] in rows}
    assert list(table) == list(rows)
    prompt = encode(enc, demo.PROMPT)
    stats = {}
    for name, (method, plan) in rows.items():
        s = stats[name] = generate(target, prompt, 128, method=method, plan=plan,
                                   **acceptance.models_for(method, draft, ngram, head)).stats
        p = s.parts
        assert table[name] == [str(s.target_passes), f"{s.tokens_per_pass:.2f}", str(s.draft_passes),
                               f"{s.weight_traffic:.2f}", str(p["draft"]), str(p["ngram_guess"] + p["copy_guess"]),
                               str(p["copied"]), str(p["target"])], name
    # The prose under the table quotes the same runs.
    text = " ".join(readme.split())
    bare, tree = stats[demo.NO_COPIES], stats["tree"]
    assert f"{stats['staged'].parts['copied']} of its 128 tokens are copies" in text
    assert (f"{bare.parts['ngram_guess'] + bare.parts['copy_guess']} of the emitted tokens were guesses the draft kept "
            f"({bare.parts['copy_guess']} a repeat's continuation, {bare.parts['ngram_guess']} the trigram's), so it "
            f"ran {bare.draft_passes} draft passes where `tree`, the same tree without stage 2, ran "
            f"{tree.draft_passes}, for the same {tree.target_passes} target passes") in text


def no_memory(*args, **kwargs):
    raise MemoryError


@pytest.mark.parametrize("cmd, where", [("generate", "load"), ("trace", "load"), ("generate", "decode"),
                                        ("demo", "load")])
def test_out_of_memory_is_one_line_naming_the_models_and_their_memory(tmp_path, capsys, monkeypatch, cmd, where):
    """A MemoryError while a model loads (an allocation of its weights) or while it decodes: one line naming
    each model and the float32 weights and KV cache it needs (the embedded target's: 4 bytes a parameter),
    no traceback."""
    from specdec_np import checkpoint
    from specdec_np.files import SHIPPED_DIR
    from specdec_np.tools import cli

    if where == "load":
        monkeypatch.setattr(checkpoint, "read_tensor", no_memory)
    else:
        monkeypatch.setattr(cli, "generate", no_memory)
    args = {"demo": ["demo", "--plan", "default", "--max-new-tokens", "4", "--no-sampled"],
            "trace": ["trace", "x", "--plan", "default", "--out", str(tmp_path / "t.html")]}.get(
        cmd, ["generate", "x", "--plan", "default", "--method", "speculative"])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    target = "the embedded target tiny-target" if cmd == "demo" else "--target tiny-target"
    draft = "the embedded draft tiny-draft" if cmd == "demo" else "its draft tiny-draft"
    weights = checkpoint.read_config(SHIPPED_DIR / "tiny-target" / "config.json").n_params * 4 / 1e6
    assert err[0].startswith(f"error: out of memory in {cmd}: {target} needs {weights:.1f} MB of float32 weights and "), err
    assert f"; {draft} needs " in err[0] and "MB of KV cache" in err[0]
    assert not (tmp_path / "t.html").exists()


@pytest.mark.parametrize("cmd", ["trace", "ngram"])
def test_a_file_size_limit_on_out_names_the_option_and_the_file(tmp_path, cmd):
    """Under `ulimit -f` (Python ignores SIGXFSZ, so the write fails with EFBIG) the page or the trigram is one
    line naming --out and its file, and the file already there is kept whole."""
    import resource

    out = tmp_path / ("t.html" if cmd == "trace" else "t.npz")
    out.write_text("before\n")
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    return x\n" * 20)
    args = (["trace", "def f(x):", "--plan", "default", "--max-new-tokens", "2", "--out", str(out)] if cmd == "trace"
            else ["ngram", "fit", str(src), "--out", str(out), "--n-vocab", "300"])
    limit = (200, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    r = subprocess.run([sys.executable, "-m", "specdec_np", *args], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, limit))
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2 and err == [f"error: --out {out}: File too large: not written (a file already there is "
                                         "kept)"], r.stderr
    assert out.read_text() == "before\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.py", out.name]


def test_a_prompt_argument_that_is_not_utf8_is_named(tmp_path):
    """Bytes that are not UTF-8 in the prompt argument (they reach Python as lone surrogates): one line naming
    the prompt, UTF-8 and the byte, as --file and standard input say it."""
    r = subprocess.run([sys.executable.encode(), b"-m", b"specdec_np", b"generate", b"def f(\xff):", b"--plan",
                        b"default"], capture_output=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.decode().splitlines() == [
        "error: the prompt (the argument) is not UTF-8 text: byte 6 is b'\\xff'"], r.stderr
    assert main(["generate", "def f(\udcff):", "--plan", "default"]) == 2  # the same, in process


@pytest.mark.parametrize("top_k, ok", [(8193, False), (10 ** 6, False), (8192, True)])
def test_top_k_that_keeps_every_token_is_an_error(capsys, top_k, ok):
    """--top-k at or above the target's vocabulary keeps every token, so changes nothing: an error naming it
    (8192 of the embedded 8193 still drops one)."""
    rc = main(["generate", "x", "--plan", "default", "--temperature", "1", "--top-k", str(top_k),
               "--max-new-tokens", "2", "--method", "ar"])
    err = capsys.readouterr().err.strip().splitlines()
    if ok:
        assert rc == 0, err
    else:
        assert rc == 2 and err == [f"error: --top-k {top_k}: the target has 8193 tokens, so it keeps them all and "
                                   "changes nothing: give fewer than 8193, or leave it off"]


def test_stats_prints_the_seed_beside_the_plan_and_help_says_why(capsys):
    """The same seed gives the same text only with the same plan: --stats prints the seed beside the plan when
    sampling, --help says so."""
    assert main(["generate", "x", "--plan", "default", "--temperature", "1", "--seed", "7", "--max-new-tokens", "2",
                 "--stats"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("method staged: ") and lines[0].endswith("; seed 7") and lines[1].startswith("2 tokens in ")
    assert main(["generate", "x", "--plan", "default", "--max-new-tokens", "2", "--stats"]) == 0
    assert "seed" not in capsys.readouterr().err  # greedy: nothing is drawn
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "same seed gives the same text only with the same plan" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("broken", ["target", "draft"])
def test_logits_that_give_no_distribution_name_their_model(embedded, broken):
    """A model whose weights hold inf gives NaN logits: the error through the API says whose they are."""
    import numpy as np

    from specdec_np.decode import generate
    from specdec_np.gpt2 import GPT2, map_params

    target, draft, ngram, enc = embedded
    models = {"target": target, "draft": draft}
    models[broken] = GPT2(models[broken].config, map_params(lambda a: np.full_like(a, np.inf) if a.ndim == 2 else a,
                                                            models[broken].params))
    with pytest.raises(ValueError, match=f"^the {broken}'s logits contain NaN or \\+inf"), np.errstate(all="ignore"):
        generate(models["target"], [1, 2, 3], 4, method="speculative", draft=models["draft"], temperature=1.0)


def test_method_eagles_machine_plan_is_priced_on_the_pairs_profile_with_the_head(monkeypatch):
    """Issue 61: --method eagle --plan machine asks choose for eagle with the embedded pair (its profile and costs:
    the draft model and the n-gram loaded for them) and the EAGLE head; it decodes with the head as its draft.
    With --plan default nothing but the head is loaded (no draft model, no n-gram), and the plan is the constant one."""
    from specdec_np import eagle
    from specdec_np.gpt2 import GPT2
    from specdec_np.plan import Plan
    from specdec_np.tools import choice, cli

    calls, plan = [], Plan(shape="fixed", widths=(2, 1))
    monkeypatch.setattr(cli, "choose", lambda *a, **k: calls.append((a, k)) or {
        "eagle": choice.Choice("eagle", plan, 1.0, 2.0, layout={})})
    s = cli.setup(namespace(prompt="def f(x):", method="eagle", temperature=0.0))
    (args, kw), = calls
    target, draft, ngram = args[:3]
    assert isinstance(draft, GPT2) and ngram is not None and isinstance(kw["head"], eagle.Head)  # the pair, the head
    assert s.draft is kw["head"] and s.method == "eagle" and s.plan == plan and "measured plan" in s.about
    calls.clear()
    monkeypatch.setattr(cli, "choose", lambda *a, **k: calls.append((a, k)) or choice.choose(*a, **k))
    s = cli.setup(namespace(prompt="def f(x):", method="eagle", temperature=0.0, plan="default"))
    (args, kw), = calls
    assert args[1] is s.draft and isinstance(s.draft, eagle.Head) and args[2] is None and kw["head"] is None  # no pair
    assert s.plan == constant_plan() and "as --plan default asks" in s.about


def test_the_machine_plan_runs_eagle_with_the_head_where_its_plan_is_fastest(monkeypatch, embedded):
    """Issue 68: with no --method the machine's choice is of every method, eagle's plans priced on its head's curve
    when the target has its head (the embedded target's) and the profile counts that head's plans: a cheap head makes
    eagle the plan and generate decodes with the head as its draft (at greedy, plain decoding's text); a dear head, or
    a target without one, the draft model's tree, as before."""
    from specdec_np import eagle
    from specdec_np.decode import generate
    from specdec_np.gpt2 import GPT2
    from specdec_np.tools import acceptance, choice, cli
    from specdec_np.tokenizer import encode
    from specdec_np.tools.costmodel import OVERHEADS

    profile = head_race_profile()
    head_ms = {"now": 0.01}
    monkeypatch.setattr(choice, "calibration", lambda *a, **k: ({
        "curves": {"target": pass_curve(1.0), "draft": pass_curve(0.1), "head": pass_curve(head_ms["now"])},
        "overheads": {"greedy": dict.fromkeys(OVERHEADS, 0.0)}, "layout": {}}, False))
    monkeypatch.setattr(choice, "acceptance_profile", lambda *a, **k: profile)
    monkeypatch.setattr(choice, "settle_threads", lambda: "")
    monkeypatch.setattr(acceptance, "calibration_prompts", lambda enc: [])
    monkeypatch.setattr(acceptance, "head_key", lambda h: "H" if isinstance(h, eagle.Head) else pytest.fail("a head"))
    options = dict(prompt="def is_prime(n):", temperature=0.0, max_new_tokens=24, stats=False)
    plain = generate(embedded[0], encode(embedded[3], options["prompt"]), 24, "ar").tokens
    s, res = cli.run(namespace(**options))
    assert s.method == "eagle" and isinstance(s.draft, eagle.Head) and s.ngram is None and res.tokens == plain
    assert res.stats.draft_passes > 0 and s.plan.widths == (1, 1, 1, 1) and "measured plan" in s.about
    head_ms["now"] = 5.0  # a head dearer than the draft model
    s, res = cli.run(namespace(**options))
    assert s.method == "tree" and isinstance(s.draft, GPT2) and res.tokens == plain
    head_ms["now"] = 0.01
    monkeypatch.setattr(cli, "load_head", lambda *a: (_ for _ in ()).throw(FileNotFoundError("no head")))
    s, res = cli.run(namespace(**options))  # a target without a head: as before
    assert s.method == "tree" and isinstance(s.draft, GPT2) and res.tokens == plain


def constant_plan():
    from specdec_np.plan import constant

    return constant(0.0)
