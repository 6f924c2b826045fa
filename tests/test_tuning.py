"""Cost-aware padding and the cost model, on hand-made cost curves."""

from types import SimpleNamespace

from specdec_np.tuning import (block_ms, draft_ms, fit_overheads, interp, pad_size, padding, predicted_ms, size_class,
                               target_ms)

# A curve like this machine's: 4- and 8-token blocks are cheaper than the sizes just below them.
CURVE = {"1": 1.0, "2": 2.0, "3": 3.0, "4": 2.5, "5": 3.5, "6": 3.6, "7": 4.0, "8": 3.0, "16": 6.0}


def test_pad_size_picks_the_cheapest_size_at_least_as_large():
    assert [pad_size(CURVE, k) for k in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert pad_size(CURVE, 9) == 9  # interpolated 3.375 beats 16's 6.0: no padding
    assert pad_size(CURVE, 20) == 20  # past the curve: unpadded
    assert block_ms(CURVE, 5) == 3.0 and block_ms(CURVE, 1) == 1.0


def test_padding_table_without_a_curve_is_the_identity():
    assert [padding(None)(k) for k in (1, 5, 100)] == [1, 5, 100]
    pad = padding(CURVE, limit=16)
    assert [pad(k) for k in (1, 3, 5, 7, 17)] == [1, 4, 8, 8, 17]


def stats(target_blocks, draft_blocks=(), ngram_queries=0, time_draft=0.0, draft_steps=None):
    return SimpleNamespace(target_blocks=list(target_blocks), draft_blocks=list(draft_blocks),
                           target_passes=len(target_blocks), draft_passes=len(draft_blocks),
                           ngram_queries=ngram_queries, time_draft=time_draft,
                           draft_steps=len(draft_blocks) if draft_steps is None else draft_steps)


def test_cost_model_charges_padded_blocks_and_overheads():
    s = stats([1, 5, 3], [2, 7], ngram_queries=10, draft_steps=1)
    curves = {"target": CURVE, "draft": CURVE}
    assert target_ms(s, curves) == 1.0 + 3.0 + 2.5 and draft_ms(s, curves) == 2.0 + 3.0
    assert predicted_ms(s, curves) == 11.5
    # 5 tokens are padded to 8 rows (a wide block), 3 to 4 (a block).
    assert [size_class(CURVE, k) for k in (1, 2, 3, 4, 5, 8, 16)] == ["step"] + ["block"] * 3 + ["wide"] * 3
    assert [target_ms(s, curves, size) for size in ("step", "block", "wide")] == [1.0, 2.5, 3.0]
    # The draft's 2 tokens and 7 (padded to 8) are both blocks; a single token is a step.
    assert [draft_ms(stats([], [1, 2, 7]), curves, size) for size in ("step", "block")] == [1.0, 2.0 + 3.0]
    o = {"step_scale": 1.1, "block_scale": 1.2, "wide_scale": 1.3, "draft_step_scale": 1.7, "draft_block_scale": 1.5,
         "draft_pass": 0.25, "ngram_query": 0.01, "draft_cold": 0.4}
    want = 1.1 * 1.0 + 1.2 * 2.5 + 1.3 * 3.0 + 1.5 * 5.0 + 2 * 0.25 + 10 * 0.01 + 1 * 0.4
    assert abs(predicted_ms(s, curves, o) - want) < 1e-12
    s = stats([1, 5, 3], [2, 7, 1], ngram_queries=10, draft_steps=1)  # one single-token draft pass more
    want += 1.7 * 1.0 + 0.25
    assert abs(predicted_ms(s, curves, o) - want) < 1e-12


def test_interp_extends_past_the_last_measured_size():
    assert interp(CURVE, 24) == 6.0 + 8 * (6.0 - 3.0) / 8  # the 8 -> 16 slope, continued
    assert interp(CURVE, 12) == 4.5


def test_fit_overheads_recovers_known_overheads():
    curves = {"target": CURVE, "draft": CURVE}
    truth = {"step_scale": 1.05, "block_scale": 1.4, "wide_scale": 1.6, "draft_step_scale": 1.3,
             "draft_block_scale": 1.7, "draft_pass": 0.2, "ngram_query": 0.05, "draft_cold": 0.4}
    runs = []
    for method, s in [("ar", stats([40, 1, 1, 1])), ("ar", stats([30, 1])),
                      ("tree", stats([40, 8, 5], [1, 2, 4, 2], draft_steps=2)),
                      ("tree", stats([8, 8, 8, 16], [1, 1, 7], draft_steps=3)),
                      ("staged", stats([30, 8], [1, 4], ngram_queries=12, draft_steps=1)),
                      ("staged", stats([30, 4, 8], [7, 8, 1], ngram_queries=5, draft_steps=2)),
                      ("speculative", stats([4, 4], [1, 1, 1, 1, 1, 1], draft_steps=2)),
                      ("tree", stats([8], [2, 2, 1, 3], draft_steps=1))]:
        s.time_draft = (1.3 * draft_ms(s, curves, "step") + 1.7 * draft_ms(s, curves, "block") + 0.2 * s.draft_passes
                        + 0.05 * s.ngram_queries + 0.4 * s.draft_steps) / 1000
        runs.append((method, s, predicted_ms(s, curves, truth) / 1000))
    got = fit_overheads(runs, curves)
    assert all(abs(got[k] - truth[k]) < 1e-9 for k in truth), got


def test_fit_overheads_never_returns_a_negative_overhead():
    curves = {"target": CURVE, "draft": CURVE}
    # Wall times below what the curves charge: no overhead can explain them, none goes negative.
    runs = [("ar", stats([2, 1, 1]), 0.001), ("tree", stats([8, 4], [1, 2]), 0.002)]
    got = fit_overheads(runs, curves)
    assert all(v >= 0 for v in got.values()), got


def test_tune_stores_a_shape_per_setting_that_generate_then_uses(tmp_path, monkeypatch):
    import numpy as np

    from specdec_np import ngram, tuning
    from specdec_np.decode import generate
    from specdec_np.gpt2 import GPT2Config, random_params
    from specdec_np.tree import children

    cfg = GPT2Config(n_vocab=30, n_ctx=64, n_embd=16, n_layer=1, n_head=2)
    target, draft = random_params(cfg, seed=1), random_params(cfg, seed=2)
    trigram = ngram.fit(np.random.default_rng(0).integers(0, 30, 500), 30)
    curves = {"target": CURVE, "draft": CURVE}
    calls = []  # every decoding the tune costs

    def recording(*args, **kw):
        calls.append(kw)
        return generate(*args, **kw)

    monkeypatch.setattr("specdec_np.decode.generate", recording)
    tuned = tuning.tune(target, draft, trigram, [[1, 2, 3], [4, 5]], curves, max_new_tokens=6, budgets=(1, 3),
                        depths=(1, 2), widths=((1,), (3, 1)), chains=(1, 2), spec_lens=(0, 1, 2), spec_rows=("pad", 2),
                        lookup_depths=(0, 2), sampled_seeds=2, out=lambda *_: None)
    monkeypatch.undo()
    # Greedy decoding is deterministic: one run per prompt. Sampled: each prompt with 2 seeds.
    for temperature, n_seeds in ((0.0, 1), (1.0, 2)):
        seeds = [c["seed"] for c in calls if c.get("method") == "staged" and c.get("lookup_depth") == 2
                 and c.get("temperature", 0.0) == temperature]  # one candidate, on the 2 prompts
        assert len(seeds) == len(set(seeds)) == 2 * n_seeds
    greedy, sampled = tuned["shapes"]["greedy"], tuned["shapes"]["sampled"]
    assert (greedy["budget"], greedy["depth"]) in {(1, 1), (3, 1), (3, 2)} and greedy["widths"] in ([1], [3, 1])
    assert greedy["tree"] in ("best_first", "fixed") and sampled["tree"] == "best_first"
    assert (sampled["budget"], sampled["depth"]) in {(1, 1), (3, 1), (3, 2)}
    assert sampled["widths"] in ([1], [3, 1]) and sampled["chain"] in (1, 2)
    assert greedy["lookup_depth"] in (0, 2) and sampled["lookup_depth"] in (0, 2)
    # A cost model per setting, each fitted on its own calibration runs (sampled: trees drawn from q).
    assert {k: set(o) for k, o in tuned["overheads_ms"].items()} == {n: set(tuning.OVERHEADS) for n in ("greedy", "sampled")}
    assert any(c.get("temperature") == 1.0 and c.get("sampled") == "without" and c.get("widths") == [2, 2, 1, 1]
               for c in calls)
    # Stage 2 and copies are tuned on the tree staged runs in each setting: sampled, the trees
    # whose children are drawn from q with the first round's widths (not the best-first tree);
    # then the widths once more with the chosen stage 2 and copies.
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        tried = [c for c in calls if c.get("method") == "staged" and c.get("temperature", 0.0) == temperature
                 and ("spec_len" in c or "lookup_depth" in c)]
        stage2 = [c for c in tried if "lookup_depth" not in c]
        assert {(c["spec_len"], c["spec_rows"]) for c in stage2} == {(0, "pad"), (1, "pad"), (1, 2), (2, "pad"), (2, 2)}
        # No guesses: the rows do not matter, so spec_len 0 is one candidate (2 prompts x its seeds).
        assert len([c for c in stage2 if c["spec_len"] == 0]) == 2 * (2 if temperature else 1)
        assert {c["lookup_depth"] for c in tried if "lookup_depth" in c} == {0, 2}
        chosen = tuned["shapes"][name]
        second = [c for c in tried if "lookup_depth" in c and c["lookup_depth"] == chosen["lookup_depth"]
                  and (c["spec_len"], c["spec_rows"]) == (chosen["spec_len"], chosen["spec_rows"])]
        if name == "sampled":
            assert all(c["sampled"] == "without" for c in tried)
            assert len({tuple(c["widths"]) for c in stage2}) == 1  # one tree for stage 2
            assert {tuple(c["widths"]) for c in second} == {(1,), (3, 1)}  # every width, second round
        elif greedy["tree"] == "best_first":
            assert all((c["budget"], c["depth"]) == (greedy["budget"], greedy["depth"]) for c in tried)
        else:
            assert len({tuple(c["widths"]) for c in stage2}) == 1
            assert {tuple(c["widths"]) for c in second} == {(1,), (3, 1)}

    # generate reads the stored shape for this pair: force sampled widths 3, 1 and check the trees.
    tuned["shapes"]["sampled"]["widths"] = [3, 1]
    monkeypatch.setattr(tuning, "TUNED_FILE", tmp_path / "tuned.json")
    tuning.save(tuned, tuning.TUNED_FILE)
    res = generate(target, [1, 2], 8, method="tree", draft=draft, temperature=1.0, sampled="without", eos=-1,
                   keep_trees=True)
    assert {len(children(t, 0)) for t, _ in res.stats.trees} == {3}
    assert {t.kind for t, _ in res.stats.trees} == {"without_replacement"}

    # Greedy: a stored fixed-width tree is the default tree; an explicit budget asks for best-first.
    tuned["shapes"]["greedy"].update(tree="fixed", widths=[3, 1], budget=2, depth=1, lookup_depth=0)
    tuning.save(tuned, tuning.TUNED_FILE)
    res = generate(target, [1, 2], 8, method="staged", draft=draft, ngram=trigram, eos=-1, keep_trees=True)
    assert {len(t.tokens) for t, _ in res.stats.trees} == {1 + 3 + 3}
    # The stored lookup_depth: a prompt ending in a repeat of "1 2 3" starts with a copied chain.
    for depth in (0, 2):
        tuned["shapes"]["greedy"]["lookup_depth"] = depth
        tuning.save(tuned, tuning.TUNED_FILE)
        res = generate(target, [1, 2, 3, 4, 5, 1, 2, 3], 4, method="staged", draft=draft, ngram=trigram, eos=-1,
                       keep_trees=True)
        first = res.stats.trees[0][0]
        assert first.source.any() == (depth > 0)
        assert first.tokens.tolist() == ([3, 4, 5] if depth else first.tokens.tolist())
    res = generate(target, [1, 2], 8, method="tree", draft=draft, budget=5, eos=-1, keep_trees=True)
    assert {len(t.tokens) for t, _ in res.stats.trees} == {1 + 5}  # best-first: 5 nodes, all at the stored depth 1
    tuning._read.cache_clear()


def test_tuned_entries_belong_to_a_machine(tmp_path, monkeypatch):
    """A cost curve measured on another CPU says nothing about this one: its entry is kept in the
    file but not used here; saving replaces only the entry for the same models and machine."""
    from specdec_np import tuning
    from specdec_np.gpt2 import GPT2Config, random_params

    cfg = GPT2Config(n_vocab=30, n_ctx=64, n_embd=16, n_layer=1, n_head=2)
    target, draft = random_params(cfg, seed=1), random_params(cfg, seed=2)
    monkeypatch.setattr(tuning, "TUNED_FILE", tmp_path / "tuned.json")
    here = {"models": tuning.model_key(target, draft), "machine": tuning.machine(),
            "shapes": {"greedy": {"budget": 5}}, "cost_curves_ms": {"target": CURVE, "draft": CURVE}}
    elsewhere = dict(here, machine={"cpu": "some other CPU", "cpus": 64}, shapes={"greedy": {"budget": 2}})
    try:
        tuning.save(elsewhere)
        assert tuning.tuned_for(target, draft) == {} and tuning.tuned_curves(target, draft) is None
        assert tuning.defaults(target, draft) == tuning.FALLBACK
        tuning.save(here)
        assert tuning.defaults(target, draft)["budget"] == 5 and tuning.tuned_curves(target, draft) == here["cost_curves_ms"]
        tuning.save(dict(here, shapes={"greedy": {"budget": 9}}))
        assert tuning.defaults(target, draft)["budget"] == 9
        assert sorted(e["shapes"]["greedy"]["budget"] for e in tuning.entries()) == [2, 9]
        assert tuning.tuned_for(random_params(cfg, seed=3), None) == {}  # no draft, no tuned shape
    finally:
        tuning._read.cache_clear()
