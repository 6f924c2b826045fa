"""End to end: every decoding method emits exactly the target's greedy tokens, caches stay exact,
staged drafting builds the identical tree with fewer draft passes, and sampled decoding follows the
target's distribution (with a broken rule caught by the same check).

The models are conftest's session fixtures: `small` (a random target, a perturbed draft, a trigram
fitted on the target's greedy text) and `tiny` (two 4-token models one can enumerate)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import SMALL as CFG
from helpers import TINY_PROMPT as PROMPT
from helpers import always_accept, ar_greedy, exact_target_distribution, models_for
from specdec_np import checks, ngram, verify
from specdec_np.decode import generate
from specdec_np.fastpath import laid_out
from specdec_np.gpt2 import GPT2Config, forward, new_cache, random_params
from specdec_np.kvcache import KVCache
from specdec_np.plan import Plan
from specdec_np.sampling import process
from specdec_np.tree import COPY
from specdec_np.tree import NGRAM as NGRAM_SOURCE
from specdec_np.tree import children, depths


def plan(**shape):
    """A Plan for these tests: `depth` is the best-first tree's depth and the chain's length."""
    if "depth" in shape:
        shape.setdefault("chain", shape["depth"])
    return Plan(**shape)


METHODS = [
    dict(method="speculative"),
    dict(method="tree"),
    dict(method="tree", shape="fixed", widths=(3, 2, 1)),
    dict(method="staged"),
    dict(method="ngram"),
    dict(method="lookup"),
    dict(method="lookup", lookup_chains=(5, 2, 0)),
    dict(method="tree", shape="fixed", widths=(3, 2, 1), min_q=0.3),  # the draft's doubted tokens are leaves
]
prompts = st.lists(st.integers(0, CFG.n_vocab - 2), min_size=1, max_size=12)


@pytest.mark.parametrize("kw", METHODS, ids=lambda kw: "-".join(map(str, kw.values())))
@given(prompt=prompts, budget=st.integers(1, 12), depth=st.integers(1, 5))
@settings(max_examples=15)
def test_greedy_equals_autoregressive(small, kw, prompt, budget, depth):
    target, draft, trigram = small
    ref = ar_greedy(target, prompt, 24)
    kw = dict(kw)
    method = kw.pop("method")
    res = generate(target, prompt, 24, method, plan=plan(budget=budget, depth=depth, **kw), eos=None,
                   **models_for(method, draft, trigram))
    assert res.tokens == ref
    assert sum(res.stats.accepted) == len(res.tokens)


@pytest.mark.parametrize("kw", METHODS[:4], ids=lambda kw: "-".join(map(str, kw.values())))
def test_drafts_are_really_accepted(small, kw):
    """The equivalence above is not vacuous: multi-token acceptance and compaction happen."""
    target, draft, trigram = small
    res = generate(target, [1, 2, 3], 40, kw["method"], plan=plan(budget=10, depth=4), eos=None,
                   **models_for(kw["method"], draft, trigram))
    assert res.tokens == ar_greedy(target, [1, 2, 3], 40)
    assert res.stats.tokens_per_pass > 1.5
    assert res.stats.target_passes < 40


def test_staged_builds_the_identical_tree_with_fewer_draft_passes(small):
    target, draft, trigram = small
    # copy_len=0: stage 2 only speculates the draft (the paper's staged decoding), so every
    # step's tree is the draft's own.
    kw = dict(draft=draft, plan=plan(budget=10, depth=5, copy_len=0), keep_trees=True, eos=None)
    for prompt in ([1, 2, 3], [5, 9], [20, 21, 22, 23]):
        tree = generate(target, prompt, 30, method="tree", **kw)
        staged = generate(target, prompt, 30, method="staged", ngram=trigram, **kw)
        assert staged.tokens == tree.tokens
        for (a, pa), (b, pb) in zip(tree.stats.trees, staged.stats.trees):
            np.testing.assert_array_equal(a.tokens, b.tokens)
            np.testing.assert_array_equal(a.parents, b.parents)
            assert pa == pb
        assert staged.stats.draft_passes < tree.stats.draft_passes
        assert staged.stats.ngram_queries > 0
        assert NGRAM_SOURCE in staged.stats.source  # some emitted tokens are credited to the n-gram


def test_staged_with_no_guesses_drafts_as_the_tree_decoder_does(small):
    target, draft, trigram = small
    # guess_len=0: the draft gets no guessed rows, so with copies off too staged makes exactly the
    # tree decoder's draft passes; the same run with guesses does not.
    kw = dict(draft=draft, temperature=1.0, seed=5, eos=None)
    shape = dict(widths=(2, 1, 1), sampled="without", copy_len=0)
    tree = generate(target, [1, 2, 3], 30, method="tree", plan=plan(**shape), **kw)
    bare = generate(target, [1, 2, 3], 30, method="staged", plan=plan(guess_len=0, **shape), ngram=trigram, **kw)
    guessing = generate(target, [1, 2, 3], 30, method="staged", plan=plan(guess_len=2, guess_rows=2, **shape),
                        ngram=trigram, **kw)
    assert bare.tokens == tree.tokens == guessing.tokens  # the draft's trees, the same random draws
    assert bare.stats.draft_blocks == tree.stats.draft_blocks and bare.stats.ngram_queries == 0
    assert guessing.stats.draft_blocks != tree.stats.draft_blocks and guessing.stats.ngram_queries > 0
    # The guessed rows are computed but not processed into distributions: the builder asked for
    # the same nodes' distributions either way.
    assert bare.stats.draft_dists == tree.stats.draft_dists == guessing.stats.draft_dists > 0
    assert sum(guessing.stats.draft_blocks) > guessing.stats.draft_dists


def test_stage_two_guesses_what_followed_the_same_three_tokens_earlier(small):
    """Stage 2 guesses a continuation copied from the context when its last three tokens occurred
    before (code repeats its names), credited as a copy; else the trigram's greedy continuation,
    credited to the n-gram."""
    from specdec_np.drafting import ModelDrafter

    _, draft, trigram = small

    def guessed(seq):
        d = ModelDrafter(draft, ngram=trigram, guess_len=2, guess_rows=2)
        d.begin(seq, 5)
        d.dist_fn(np.array([seq[-1]]), np.array([-1]), np.array([0]))  # the root's pass
        return d.guessed

    repeat = [7, 8, 9, 30, 31, 20, 7, 8, 9]
    assert ngram.greedy_continuation(trigram, repeat, 2) != [30, 31]  # the copy is not the trigram's guess
    assert guessed(repeat) == {(30,): COPY, (30, 31): COPY}
    fresh = [7, 8, 9, 30, 31, 20, 21, 8, 9]  # "7 8 9" does not recur: the trigram guesses
    g = ngram.greedy_continuation(trigram, fresh, 2)
    assert guessed(fresh) == {(g[0],): NGRAM_SOURCE, tuple(g): NGRAM_SOURCE}


def test_staged_copies_a_repeat_straight_to_the_target(small):
    """When the context's last three tokens occurred before, staged decoding verifies what followed
    them with no draft pass (the random target's greedy text cycles, like a small model's does):
    still exactly the target's greedy tokens, with fewer draft passes than without the copies."""
    target, draft, trigram = small
    start = [5, 6, 7, 8]
    prompt = start + ar_greedy(target, start, 20) + start[-3:]  # ends in a repeat of "6 7 8"
    ref = ar_greedy(target, prompt, 30)
    kw = dict(draft=draft, ngram=trigram, eos=None, keep_trees=True, method="staged")
    copying = generate(target, prompt, 30, plan=plan(copy_len=6), **kw)
    drafting = generate(target, prompt, 30, plan=plan(copy_len=0), **kw)
    assert copying.tokens == drafting.tokens == ref
    copied = [(s.trace.tree, s.trace.path) for s in copying.stats.steps if s.trace.copied]
    assert copied and all(len(t) <= 7 and (t.source[1:] == COPY).all() for t, _ in copied)
    assert sum(len(path) - 1 for _, path in copied) > 0  # copied tokens are accepted, not just proposed
    assert not any(s.trace.copied for s in drafting.stats.steps)
    assert copying.stats.draft_passes < drafting.stats.draft_passes
    assert copying.stats.source.count(COPY) > 0 and copying.stats.tally["copy"] == copying.stats.source.count(COPY)
    # Steps that ran the draft (the cost model charges their first pass cold): never a copied one.
    assert 0 < copying.stats.draft_steps <= len(copying.stats.trees) - len(copied)
    assert copying.stats.draft_steps <= copying.stats.draft_passes
    spec = generate(target, prompt, 30, draft=draft, eos=None, method="speculative", plan=plan(chain=3))
    assert spec.stats.draft_steps == spec.stats.target_passes  # a chain is drafted every step


@pytest.mark.parametrize("kw", [dict(method="staged"), dict(method="tree", temperature=1.0, top_k=10, seed=4),
                                dict(method="speculative", temperature=0.8, seed=5)])
def test_caches_equal_a_fresh_prefill(small, kw):
    target, draft, trigram = small
    models = models_for(kw["method"], draft, trigram)
    res = generate(target, [4, 5, 6], 30, plan=plan(budget=8, depth=4), eos=None, **models, **kw)
    seq = [4, 5, 6] + res.tokens
    for model, cache in ((target, res.target_cache), (draft, res.draft_cache)):
        fresh = new_cache(model)
        forward(model, seq[:cache.length], fresh)
        assert cache.length >= len(seq) - 6  # the draft may lag by the last accepted leaves
        n = cache.length
        np.testing.assert_allclose(cache.k[:, :, :n], fresh.k[:, :, :n], rtol=0, atol=1e-12)
        np.testing.assert_allclose(cache.v[:, :, :n], fresh.v[:, :, :n], rtol=0, atol=1e-12)
    assert res.target_cache.length == len(seq) - 1


@pytest.mark.parametrize("method", ["speculative", "tree", "staged"])
def test_decoding_never_reads_an_unset_cache_slot(small, monkeypatch, method):
    """A KVCache starts unset (np.empty), so every slot a pass reads must have been written first: caches filled
    with NaN (which reach the logits from any slot read, the control below) decode exactly the tokens zero-filled
    ones do, through tree passes, `keep` and a target computing padded blocks."""
    target, draft, trigram = small
    target, init = laid_out(target, padding=[8] * 8), KVCache.__init__
    kw = dict(method=method, plan=plan(budget=8, depth=4), eos=None, temperature=1.0, top_k=10, seed=4,
              **models_for(method, draft, trigram))
    runs = []
    for fill in (0.0, np.nan):
        def filled(self, *args, fill=fill, **kwargs):
            init(self, *args, **kwargs)
            self.k[...], self.v[...] = fill, fill
        monkeypatch.setattr(KVCache, "__init__", filled)
        runs.append(generate(target, [4, 5, 6], 30, **kw))
        control = new_cache(target)
        control.length = 2  # slots 0 and 1 read, never written
        assert np.isnan(forward(target, [7], control)).all() == np.isnan(fill)
    assert runs[0].tokens == runs[1].tokens and len(runs[1].tokens) == 30


def test_budget_one_depth_one_drafts_one_token_per_step(small):
    target, draft, _ = small
    ref = generate(target, [1, 2], 20, method="ar", eos=None)
    res = generate(target, [1, 2], 20, method="tree", draft=draft, plan=plan(budget=1, depth=1), eos=None,
                   keep_trees=True)
    assert res.tokens == ref.tokens
    assert {len(t) for t, _ in res.stats.trees} == {2}


def test_eos_and_max_new_tokens_mid_path(small):
    target, draft, _ = small
    ref = ar_greedy(target, [1, 2, 3], 30)
    eos = ref[7]
    first = ref.index(eos)
    res = generate(target, [1, 2, 3], 30, method="tree", draft=draft, plan=plan(budget=10, depth=4), eos=eos)
    assert res.tokens == ref[:first + 1] and res.stop_reason == "eos"
    for n in range(1, 9):  # cut wherever an accepted path would overshoot
        res = generate(target, [1, 2, 3], n, method="tree", draft=draft, plan=plan(budget=10, depth=5), eos=None)
        assert res.tokens == ref[:n] and res.stop_reason == "max_new_tokens"
        assert sum(res.stats.accepted) == n  # statistics count what was emitted, not what was accepted


def test_context_limit_stops_cleanly(small):
    target, draft, trigram = small
    prompt = [i % (CFG.n_vocab - 1) for i in range(CFG.n_ctx - 5)]
    for method in ("ar", "tree", "staged"):
        res = generate(target, prompt, 50, method=method, plan=plan(budget=8, depth=4), eos=None,
                       **models_for(method, draft, trigram))
        assert res.stop_reason == "context"
        assert len(prompt) + len(res.tokens) == CFG.n_ctx
        assert res.tokens == ar_greedy(target, prompt, 50)[:5]


def test_bad_input_raises(small):
    target, draft, _ = small
    with pytest.raises(ValueError, match="empty"):
        generate(target, [], 5)
    with pytest.raises(ValueError, match="token id 40 is outside"):
        generate(target, [1, 40], 5)
    with pytest.raises(ValueError, match=r"the target's context \(n_ctx=64\) must hold more"):
        generate(target, [1] * CFG.n_ctx, 5)
    with pytest.raises(ValueError, match="unknown method"):
        generate(target, [1], 5, method="magic")
    with pytest.raises(ValueError, match="needs a draft"):
        generate(target, [1], 5, method="tree")
    other = random_params(GPT2Config(n_vocab=41, n_ctx=64, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="share the tokenizer"):
        generate(target, [1], 5, method="tree", draft=other)
    with pytest.raises(ValueError, match="^temperature=-1 must be"):
        generate(target, [1], 5, temperature=-1)
    with pytest.raises(ValueError, match="^top_p=0 must be"):
        generate(target, [1], 5, temperature=1, top_p=0)
    with pytest.raises(ValueError, match="^top_k=0 must be"):
        generate(target, [1], 5, temperature=1, top_k=0)
    with pytest.raises(ValueError, match="point_mass"):
        generate(target, [1], 5, method="tree", draft=draft, temperature=1,
                 plan=plan(sampled="with", rule="point_mass"))
    with pytest.raises(TypeError, match="token ids, not text"):
        generate(target, "def f(x):", 5)
    with pytest.raises(TypeError, match="integer token ids"):
        generate(target, [1.5], 5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, [1], None)
    with pytest.raises(ValueError, match="seed"):
        generate(target, [1], 5, seed="abc")


@pytest.mark.parametrize("shape, message", [
    (dict(sampled="maybe"), "sampled must be"), (dict(shape="bushy"), "shape must be"),
    (dict(budget=0), "budget must be an integer >= 1"), (dict(depth=-1), "depth must be an integer >= 1"),
    (dict(chain=1.5), "chain must be"), (dict(widths=()), "widths must be"), (dict(widths=(2, 0)), "widths must be"),
    (dict(copy_len=-1), "copy_len must be an integer >= 0"), (dict(guess_len=True), "guess_len must be"),
    (dict(guess_rows="lots"), "guess_rows must be"),
    (dict(lookup_chains=(7, 3)), "lookup_chains must be"), (dict(lookup_chains=(0, 0, 0)), "lookup_chains must be"),
    (dict(lookup_chains=(7, -1, 0)), "lookup_chains must be"), (dict(lookup_chains=7), "lookup_chains must be")])
def test_plan_validates_itself(shape, message):
    with pytest.raises(ValueError, match=message):
        Plan(**shape)


def test_the_sampling_settings_are_checked_once_per_generate(small, monkeypatch):
    """checks.py is their one boundary: once before decoding, not on each step's `process`."""
    calls = []
    monkeypatch.setattr(checks, "check_settings", lambda *settings: calls.append(settings))
    generate(small.target, [1, 2], 6, "tree", small.draft, temperature=1.0, top_k=3, top_p=0.9)
    assert calls == [(1.0, 3, 0.9)]


def test_generate_refuses_an_unknown_rule(small):
    """A plan's rule is a name in verify.RULES (the leaf Plan cannot know them: generate checks)."""
    with pytest.raises(ValueError, match="plan: unknown rule 'magic'"):
        generate(small.target, [1, 2], 4, "speculative", small.draft, plan=Plan(rule="magic"))


def test_plan_defaults_are_constants():
    assert Plan() == Plan(shape="best_first", budget=8, depth=6, widths=(2, 2, 1, 1, 1, 1), chain=4,
                          lookup_chains=(), sampled=None,
                          guess_len=3, guess_rows=4, copy_len=12, rule=None)
    assert Plan(widths=[2, 1]).widths == (2, 1)  # lists are accepted and frozen


@pytest.mark.parametrize("method, temperature, sampled, kind", [
    ("tree", 0.0, None, "deterministic"), ("staged", 1.0, None, "deterministic"),
    ("speculative", 1.0, None, "with_replacement"), ("speculative", 0.0, None, "deterministic"),
    ("tree", 1.0, "without", "without_replacement"), ("staged", 1.0, "without", "without_replacement"),
    ("tree", 0.0, "with", "with_replacement")])
def test_tree_construction_per_setting(small, method, temperature, sampled, kind):
    target, draft, trigram = small
    res = generate(target, [1, 2, 3], 12, method=method, **models_for(method, draft, trigram), temperature=temperature,
                   plan=plan(sampled=sampled, copy_len=0), eos=None, keep_trees=True)
    assert {t.kind for t, _ in res.stats.trees} == {kind}
    if sampled is not None:
        # Sampled children come in the plan's fixed widths 2, 2, 1, ...
        assert max(len(children(t, 0)) for t, _ in res.stats.trees) == 2
        assert max(int(depths(t).max()) for t, _ in res.stats.trees) <= 6


def test_same_seed_same_tokens(small):
    target, draft, _ = small
    kw = dict(method="tree", draft=draft, temperature=1.0, top_k=20, plan=plan(budget=6, depth=3), eos=None)
    assert generate(target, [1, 2], 25, seed=11, **kw).tokens == generate(target, [1, 2], 25, seed=11, **kw).tokens


def runs_changed_by_rounding(small, monkeypatch) -> int:
    """Of 40 sampled runs (block verification of chains, traversal of trees), how many change their
    tokens when every logit is perturbed by 1e-12 (relative), as another BLAS might round them."""
    from specdec_np import decode

    target, draft, _ = small
    exact_lm_head = decode.lm_head  # the target's logits, in the loop's verify pass

    def rounded(wobble):
        def lm_head(*args, **kwargs):
            logits = exact_lm_head(*args, **kwargs)
            return logits * (1 + wobble * np.cos(np.arange(logits.size)).reshape(logits.shape))
        return lm_head

    plans = (Plan(chain=4, rule="block"), Plan(shape="fixed", widths=(2, 1, 1), sampled="without", rule="traversal"))
    changed = 0
    for seed in range(20):
        for method, shape in zip(("speculative", "tree"), plans):
            runs = []
            for wobble in (0.0, 1e-12):
                monkeypatch.setattr(decode, "lm_head", rounded(wobble))
                runs.append(generate(target, [1, 2, 3], 30, method, draft, plan=shape, temperature=1.0, seed=seed,
                                     eos=None).tokens)
            changed += runs[0] != runs[1]
    return changed


def test_seeds_survive_rounding(small, monkeypatch):
    """A rule's test that is 1 in exact arithmetic lands on either side of 1 after rounding; the coin
    treats both as certain (sampling.SURE), so no later draw shifts and the tokens stay the same."""
    assert runs_changed_by_rounding(small, monkeypatch) == 0


def test_seeds_survive_rounding_negative_control(small, monkeypatch):
    """Without that tolerance, the same check sees runs change."""
    from specdec_np import sampling

    monkeypatch.setattr(sampling, "SURE", 0.0)
    assert runs_changed_by_rounding(small, monkeypatch) > 0


# ----------------------------------------------------------------------------- sampling, end to end

COPY_PROMPT = [0, 1, 2, 3, 0, 1, 2]  # "0 1 2" recurs: staged copies "3 0" at the first step
# Every method and every rule it can verify with, on the tiny pair at temperature 1: (method, plan
# fields, settings). Sampled trees are one level wide, or two levels at top-k 2, so that every
# random branch of two new tokens can be enumerated in about a second.
EXACT_CASES = [
    ("ar", {}, {}),
    ("speculative", dict(chain=2), {}),  # a chain drawn from q: the rule "chain"
    ("speculative", dict(chain=2, sampled="without"), {}),
    ("speculative", dict(chain=2, rule="block"), {}),
    ("speculative", dict(chain=2, rule="recursive"), {}),
    ("speculative", dict(chain=2, rule="traversal"), {}),
    ("tree", dict(budget=3, depth=2), {}),  # the draft's top tokens: point mass
    ("tree", dict(budget=3, depth=2), dict(top_k=3)),
    ("tree", dict(widths=(2,), sampled="with"), {}),  # recursive
    ("tree", dict(widths=(2, 1), sampled="with"), dict(top_k=2)),
    ("tree", dict(widths=(3,), sampled="without"), {}),  # recursive without replacement
    ("tree", dict(widths=(2, 1), sampled="without"), dict(top_k=2)),
    ("tree", dict(widths=(2,), sampled="with", rule="traversal"), {}),
    ("tree", dict(widths=(2, 1), sampled="without", rule="traversal"), dict(top_k=2)),
    ("tree", dict(widths=(2, 1), sampled="without", rule="traversal", min_q=0.6), dict(top_k=2)),  # doubted: leaves
    ("speculative", dict(chain=2, min_q=0.6), dict(top_k=2)),
    ("tree", dict(widths=(1, 1), sampled="with", rule="chain"), {}),
    ("tree", dict(widths=(1, 1), sampled="with", rule="block"), {}),
    ("staged", dict(budget=3, depth=2, copy_len=2), {}),  # copies (point mass) and top-token trees
    ("staged", dict(widths=(2, 1), sampled="with", copy_len=2), dict(top_k=2)),
    ("staged", dict(widths=(2, 1), sampled="without", copy_len=2, guess_len=1), dict(top_k=2)),
    ("ngram", dict(budget=3, depth=2), {}),
    ("lookup", dict(chain=2), {}),
    ("lookup", dict(lookup_chains=(2, 1, 0)), {}),
]


def exact_output(tiny, method, fields, settings, prompt, n=2):
    """{the first n tokens: exact probability} of `generate` itself, every random branch enumerated
    (the enumerator is its `rand`), and the rules that ran."""
    from specdec_np.proofs import exact

    rules = set()

    def fn(rand):
        res = generate(tiny.target, prompt, n, method, plan=Plan(**fields), temperature=1.0, rand=rand, eos=None,
                       keep_trees=True, **models_for(method, tiny.draft, tiny.trigram), **settings)
        rules.update(step.trace.rule for step in res.stats.steps)
        return tuple(res.tokens)

    return exact.outcomes(fn), rules


def target_output(tiny, prompt, n=2, top_k=None):
    """{the first n tokens: probability} sampling the (top-k processed) target token by token."""
    from specdec_np.proofs import exact

    def next_dist(context):
        return process(forward(tiny.target, list(context), new_cache(tiny.target))[-1], 1.0, top_k)
    return exact.sequence_distribution(next_dist, tuple(prompt), n)


@pytest.mark.parametrize("prompt", [PROMPT, COPY_PROMPT], ids=["fresh", "repeat"])
@pytest.mark.parametrize("method,fields,settings", EXACT_CASES,
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()))
def test_generate_samples_the_target_exactly(tiny, method, fields, settings, prompt):
    """Whatever the method, plan and rule, the tokens `generate` emits are distributed exactly as
    the target's own samples: every random branch of the real loop is enumerated."""
    got, rules = exact_output(tiny, method, fields, settings, prompt)
    want = target_output(tiny, prompt, top_k=settings.get("top_k"))
    assert fields.get("rule") is None or fields["rule"] in rules  # the plan's rule really ran
    assert set(got) <= set(want)
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) < 1e-12


def test_a_doubted_token_ends_the_draft_in_generate(tiny):
    """Plan.min_q reaches the builders (the exact cases above prove such trees lossless): some steps' trees stop
    early, and a chain's draft runs fewer passes a step than without it."""
    def run(method, **shape):
        res = [generate(tiny.target, PROMPT, 12, method, tiny.draft, plan=Plan(**shape), temperature=1.0, top_k=2,
                        seed=seed, eos=None, keep_trees=True) for seed in range(4)]
        trees = [len(tree) for r in res for tree, _ in r.stats.trees]
        return trees, sum(r.stats.draft_passes for r in res) / len(trees)
    for method, shape in (("tree", dict(widths=(2, 1), sampled="without")), ("speculative", dict(chain=3))):
        (full, passes), (stopped, fewer) = run(method, **shape), run(method, **shape, min_q=0.6)
        assert min(stopped) < min(full) and (fewer < passes or method == "tree"), method


@pytest.mark.parametrize("method,fields,settings,rule", [
    ("tree", dict(widths=(2,), sampled="with"), {}, "recursive"),
    ("tree", dict(budget=3, depth=2), {}, "point_mass"),
    ("speculative", dict(chain=2), {}, "chain"),
    ("staged", dict(widths=(2, 1), sampled="without", copy_len=2), dict(top_k=2), "recursive_wor"),
])
def test_generate_samples_the_target_exactly_negative_control(tiny, monkeypatch, method, fields, settings, rule):
    """The same check catches a rule that accepts drafts untested."""
    monkeypatch.setitem(verify.RULES, rule, always_accept)
    got, _ = exact_output(tiny, method, fields, settings, COPY_PROMPT)
    want = target_output(tiny, COPY_PROMPT, top_k=settings.get("top_k"))
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) > 0.01


def test_staged_sampled_children_are_exact_samples_of_q(tiny):
    """Stage 2 only precomputes the draft's distributions: a sampled tree drafted with it has exactly
    the distribution of one drafted without it, and that is the product of the draft's q along it."""
    from specdec_np import build
    from specdec_np.drafting import ModelDrafter
    from specdec_np.proofs import exact

    def tree_distribution(trigram):
        def fn(rand):
            d = ModelDrafter(tiny.draft, temperature=1.0, ngram=trigram, guess_len=2, guess_rows=8)
            d.begin(PROMPT, 3)
            t = build.build_fixed(PROMPT[-1], d.dist_fn, [2, 1, 1], rand=rand, replacement=False)
            return tuple(zip(t.tokens.tolist(), t.parents.tolist()))
        return exact.outcomes(fn)

    unstaged, staged = tree_distribution(None), tree_distribution(tiny.trigram)
    assert set(unstaged) == set(staged)
    assert max(abs(unstaged[k] - staged[k]) for k in unstaged) < 1e-12

    def q(context):  # the draft's own next-token distribution, from a plain forward pass
        return process(forward(tiny.draft, list(context), new_cache(tiny.draft))[-1], 1.0)

    for tree, prob in list(unstaged.items())[:20]:
        toks = [t for t, _ in tree]
        parents = [p for _, p in tree]
        kids = [i for i in range(1, len(toks)) if parents[i] == 0]
        root_q = q(PROMPT)  # without replacement: first child ~ q, second ~ q without the first
        want = root_q[toks[kids[0]]] * root_q[toks[kids[1]]] / (1 - root_q[toks[kids[0]]])
        for c in kids:  # each depth-1 node has one child drawn from q at its context, and so on
            node, ctx = c, PROMPT + [toks[c]]
            while (nxt := [i for i in range(len(toks)) if parents[i] == node]):
                want *= q(ctx)[toks[nxt[0]]]
                node, ctx = nxt[0], ctx + [toks[nxt[0]]]
        assert prob == pytest.approx(want, abs=1e-12)


def staged_copy_distribution(tiny, n=3):
    """The exact distribution of staged decoding's first n tokens after COPY_PROMPT at T=1, by
    enumerating every random branch of `generate` itself (the enumerator is its `rand`), and
    whether both kinds of step ran: copied chains (point-mass rule) and sampled draft chains
    (recursive rule) alternate."""
    from specdec_np.proofs import exact

    steps = {"copied": 0, "drafted": 0}
    shape = plan(shape="fixed", widths=(1,), sampled="without", copy_len=2)

    def fn(rand):
        res = generate(tiny.target, COPY_PROMPT, n, method="staged", draft=tiny.draft, ngram=tiny.trigram,
                       temperature=1.0, plan=shape, rand=rand, keep_trees=True, eos=None)
        for t, _ in res.stats.trees:
            steps["copied" if (t.source == COPY).any() else "drafted"] += 1
        return tuple(res.tokens)

    return exact.outcomes(fn), steps["copied"] > 0 and steps["drafted"] > 0


def lookup_distribution(tiny, n=3):
    """The same for prompt lookup with chains of 2 after a 3-token match, of 1 after a 2-token one
    and none after one token (point-mass verified), and whether some step proposed a chain."""
    from specdec_np.proofs import exact

    proposed = [0]

    def fn(rand):
        res = generate(tiny.target, COPY_PROMPT, n, method="lookup", temperature=1.0, rand=rand, eos=None,
                       plan=plan(lookup_chains=(2, 1, 0)), keep_trees=True)
        proposed[0] += sum(len(t) > 1 for t, _ in res.stats.trees)
        return tuple(res.tokens)

    return exact.outcomes(fn), proposed[0] > 0


COPIED_CHAINS = pytest.mark.parametrize("distribution", [staged_copy_distribution, lookup_distribution],
                                        ids=["staged copies", "lookup by match"])


@COPIED_CHAINS
def test_copied_chains_are_lossless_when_sampling(tiny, distribution):
    got, exercised = distribution(tiny)
    assert exercised
    want = exact_target_distribution(tiny.target, COPY_PROMPT, 3)
    assert set(got) <= set(want)
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) < 1e-12


@COPIED_CHAINS
def test_copied_chains_negative_control_always_accept(tiny, monkeypatch, distribution):
    """The same check rejects a point-mass rule that accepts the copied chain without a test."""
    monkeypatch.setitem(verify.RULES, "point_mass", always_accept)
    got, _ = distribution(tiny)
    want = exact_target_distribution(tiny.target, COPY_PROMPT, 3)
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) > 0.05


def test_lookup_steps_propose_the_chain_for_their_match(small):
    """Each step of lookup with lengths by match proposes `lookup_by_match`'s chain for the tokens so far."""
    from specdec_np.lookup import lookup_by_match

    target, _, _ = small
    prompt = [1, 2, 3, 4, 1, 2, 3]
    res = generate(target, prompt, 20, "lookup", plan=plan(lookup_chains=(6, 3, 0)), eos=None, keep_trees=True)
    seq, lengths = list(prompt), set()
    for step in res.stats.steps:
        want = lookup_by_match(seq, (6, 3, 0))
        assert list(step.trace.tree.tokens[1:]) == want
        lengths.add(len(want))
        seq += step.tokens
    assert 6 in lengths  # the prompt's repeat was copied
    assert res.tokens == ar_greedy(target, prompt, 20)


def test_wide_fixed_tree_runs_to_the_end_of_the_context(small):
    # 3 + 9 + 45 = 57 drafted nodes per pass, near the cap (n_ctx = 64): the caches are sized
    # from the tree, and a bigger tree is refused before any work.
    target, draft, _ = small
    wide = plan(shape="fixed", widths=(3, 3, 5))
    res = generate(target, [1, 2], 100, method="tree", draft=draft, plan=wide, eos=None)
    assert res.stop_reason == "context" and res.tokens == ar_greedy(target, [1, 2], len(res.tokens))
    with pytest.raises(ValueError, match=r"widths=4,4,4\) exceed the target.s context \(n_ctx=64\)"):
        generate(target, [1, 2], 100, method="tree", draft=draft, plan=plan(shape="fixed", widths=(4, 4, 4)))
