"""The tools' plan: the tuner's search, the stored plan per machine, and the core's independence from both."""

import numpy as np
import pytest

from specdec_np import ngram
from specdec_np.decode import Plan, generate
from specdec_np.gpt2 import GPT2Config, random_params
from specdec_np.tools import plan as plans
from specdec_np.tools.costmodel import OVERHEADS
from specdec_np.tree import children

# A curve like the AMD EPYC's: 4- and 8-token blocks are cheaper than the sizes just below them.
CURVE = {"1": 1.0, "2": 2.0, "3": 3.0, "4": 2.5, "5": 3.5, "6": 3.6, "7": 4.0, "8": 3.0, "16": 6.0}
CFG = GPT2Config(n_vocab=30, n_ctx=64, n_embd=16, n_layer=1, n_head=2)


@pytest.fixture(scope="module")
def pair():
    target, draft = random_params(CFG, seed=1), random_params(CFG, seed=2)
    return target, draft, ngram.fit(np.random.default_rng(0).integers(0, 30, 500), 30)


@pytest.fixture
def tuned_file(tmp_path, monkeypatch):
    """weights/tuned.json replaced by a temporary file (tests never write to the repository)."""
    monkeypatch.setattr(plans, "TUNED_FILE", tmp_path / "tuned.json")
    plans._read.cache_clear()
    yield plans.TUNED_FILE
    plans._read.cache_clear()


def test_tune_searches_each_setting_and_its_plan_is_what_generate_runs(pair, monkeypatch, tuned_file):
    target, draft, trigram = pair
    calls = []  # (method, plan, temperature, seed) of every decoding the tuner costs

    def recording(*args, **kw):
        calls.append((kw["method"], kw["plan"], kw.get("temperature", 0.0), kw["seed"]))
        return generate(*args, **kw)

    monkeypatch.setattr(plans, "generate", recording)
    tuned = plans.tune(target, draft, trigram, [[1, 2, 3], [4, 5]], {"target": CURVE, "draft": CURVE},
                       max_new_tokens=6, budgets=(1, 3), depths=(1, 2), widths=((1,), (3, 1)), chains=(1, 2),
                       guess_lens=(0, 1, 2), guess_rows=("pad", 2), copy_lens=(0, 2), sampled_seeds=2,
                       out=lambda *_: None)
    staged = [c for c in calls if c[0] == "staged"]
    # Every candidate ran padded as the curve says, greedy once per prompt, sampled with 2 seeds.
    assert all(p.target_pad == plans.padding(CURVE) and p.draft_pad == plans.padding(CURVE) for _, p, _, _ in calls)
    for temperature, n_seeds in ((0.0, 1), (1.0, 2)):
        copies2 = [c for c in staged if c[2] == temperature and c[1].copy_len == 2]
        assert len({c[3] for c in copies2}) == 2 * n_seeds
    # Stage 2's candidates: guess_len 0 is one candidate (the rows do not matter), not one per rows.
    for temperature in (0.0, 1.0):
        stage2 = {(p.guess_len, p.guess_rows) for m, p, t, _ in staged if t == temperature}
        assert {(0, "pad"), (1, "pad"), (1, 2), (2, "pad"), (2, 2)} <= stage2 and (0, 2) not in stage2
    # Sampled: only trees drawn from the draft without replacement are tried.
    assert all(p.sampled == "without" for _, p, t, _ in staged if t == 1.0)
    greedy, sampled = (Plan(**{k: tuple(v) if isinstance(v, list) else v for k, v in tuned["shapes"][s].items()})
                       for s in ("greedy", "sampled"))
    assert sampled.sampled == "without" and sampled.widths in ((1,), (3, 1)) and greedy.chain in (1, 2)
    assert {k: set(o) for k, o in tuned["overheads_ms"].items()} == {n: set(OVERHEADS) for n in ("greedy", "sampled")}
    # The stored choice is what the tools' plan_for returns on this machine, with padding.
    tuned["shapes"]["sampled"]["widths"] = [3, 1]
    plans.save(tuned)
    plan, origin = plans.plan_for(target, draft, 1.0)
    assert "weights/tuned.json" in origin and plan.widths == (3, 1) and plan.target_pad == plans.padding(CURVE)
    res = generate(target, [1, 2], 8, method="tree", draft=draft, plan=plan, temperature=1.0, eos=-1, keep_trees=True)
    assert {len(children(t, 0)) for t, _ in res.stats.trees} == {3}
    assert {t.kind for t, _ in res.stats.trees} == {"without_replacement"}


def test_stored_plans_belong_to_a_machine(pair, tuned_file):
    """A plan measured on another CPU says nothing about this one: its entry is kept in the file but
    not used here; saving replaces only the entry for the same models and machine."""
    target, draft, _ = pair
    here = {"models": plans.model_key(target, draft), "machine": plans.machine(),
            "shapes": {"greedy": {"budget": 5}}, "cost_curves_ms": {"target": CURVE, "draft": CURVE}}
    elsewhere = dict(here, machine={"cpu": "some other CPU", "cpus": 64}, shapes={"greedy": {"budget": 2}})
    plans.save(elsewhere)
    assert plans.tuned_for(target, draft) == {} and plans.plan_for(target, draft)[0] == Plan()
    plans.save(here)
    assert plans.plan_for(target, draft)[0] == Plan(budget=5, target_pad=plans.padding(CURVE),
                                                    draft_pad=plans.padding(CURVE))
    plans.save(dict(here, shapes={"greedy": {"budget": 9}}))
    assert plans.plan_for(target, draft)[0].budget == 9
    assert sorted(e["shapes"]["greedy"]["budget"] for e in plans.entries()) == [2, 9]
    assert plans.plan_for(target, draft, 1.0)[0] == Plan()  # no sampled plan stored: the constants
    assert plans.tuned_for(random_params(CFG, seed=3), None) == {}  # no draft, no stored plan


def test_the_core_ignores_stored_plans_and_the_machine_identity(pair, tuned_file, monkeypatch):
    """generate's defaults give the same tokens for a seed whatever plan is stored for this machine
    and whatever the machine says it is; the tools' plan_for does follow both (the control)."""
    target, draft, trigram = pair
    kw = dict(method="staged", draft=draft, ngram=trigram, temperature=1.0, top_k=10, seed=7, eos=-1, keep_trees=True)
    before = generate(target, [1, 2, 3, 1, 2], 24, **kw)
    stored = {"models": plans.model_key(target, draft), "machine": plans.machine(),
              "shapes": {"sampled": {"sampled": "without", "widths": [3, 1], "copy_len": 0}},
              "cost_curves_ms": {"target": CURVE, "draft": CURVE}}
    plans.save(stored)
    assert plans.plan_for(target, draft, 1.0)[0].widths == (3, 1)  # the tools see the stored plan
    monkeypatch.setattr(plans, "machine", lambda: {"cpu": "a different CPU", "cpus": 96})
    assert plans.plan_for(target, draft, 1.0)[0] == Plan()  # ... and the machine identity
    for machine in (lambda: stored["machine"], lambda: {"cpu": "a different CPU", "cpus": 96}):
        monkeypatch.setattr(plans, "machine", machine)
        after = generate(target, [1, 2, 3, 1, 2], 24, **kw)
        assert after.tokens == before.tokens and after.stats.accepted == before.stats.accepted
    # The control: the stored plan, passed explicitly, decodes with other trees.
    monkeypatch.setattr(plans, "machine", lambda: stored["machine"])
    explicit = generate(target, [1, 2, 3, 1, 2], 24, plan=plans.plan_for(target, draft, 1.0)[0], **kw)
    assert {t.kind for t, _ in before.stats.trees} == {"deterministic"}
    assert {t.kind for t, _ in explicit.stats.trees} == {"without_replacement"}


def test_the_core_imports_no_tool_and_reads_no_file():
    """The layering, checked on the source: no core module imports the tools or reads a file,
    /proc/cpuinfo or the stored plans; the tools import the core."""
    import ast
    from pathlib import Path

    core = Path(plans.__file__).resolve().parents[1]
    for path in sorted(core.glob("*.py")):
        if path.name in ("__main__.py", "checkpoint.py", "models.py", "tokenizer.py", "ngram.py"):
            continue  # the entry point, and the loaders of models, vocabularies and n-grams
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert "tools" not in (node.module or ""), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "open":
                raise AssertionError(f"{path.name} opens a file")
        text = path.read_text()
        assert "cpuinfo" not in text and "tuned.json" not in text, path.name
