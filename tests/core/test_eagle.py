"""EAGLE's head (specdec_np/eagle.py) in the one decoding loop: proved lossless like every method, and
its features and caches checked against a fresh computation.

On conftest's random float64 models, with a random head bound to each target: greedy decoding equals
plain decoding; `generate`'s exact output distribution (every random branch enumerated) equals the
target's for each rule on the head's trees, and a rule that accepts untested fails the same check;
the features the loop hands the head are the target's own, its cache holds what a fresh pass over the
accepted text writes; the head's pass (fc, its narrow block, out, q folded into out) equals a plain float64
computation of its math; stop reasons, the context limit, traces; the checkpoint round trip."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import SMALL, TINY_PROMPT, always_accept, ar_greedy
from specdec_np import eagle, verify
from specdec_np.checkpoint import CheckpointError
from specdec_np.decode import generate
from specdec_np.fastpath import Layout
from specdec_np.gpt2 import forward, hidden, lm_head, new_cache, random_params
from specdec_np.plan import Plan
from specdec_np.sampling import process
from specdec_np.tree import DRAFT, path_key


@pytest.fixture(scope="module")
def head(small):
    """A random head of conftest's `small` target (seed 1: its guesses are right now and then)."""
    return eagle.random_head(small.target, seed=1)


@pytest.fixture(scope="module")
def tiny_head(tiny):
    return eagle.random_head(tiny.target, seed=5, scale=0.3)


SHAPES = [dict(), dict(shape="fixed", widths=(3, 2, 1))]
prompts = st.lists(st.integers(0, SMALL.n_vocab - 2), min_size=1, max_size=12)


@pytest.mark.parametrize("shape", SHAPES, ids=["best_first", "fixed"])
@given(prompt=prompts, budget=st.integers(1, 12), depth=st.integers(1, 5))
@settings(max_examples=15)
def test_greedy_equals_autoregressive(small, head, shape, prompt, budget, depth):
    res = generate(small.target, prompt, 24, "eagle", head, plan=Plan(budget=budget, depth=depth, **shape), eos=None)
    assert res.tokens == ar_greedy(small.target, prompt, 24)
    assert sum(res.stats.accepted) == len(res.tokens)


def test_drafts_are_really_accepted(small, head):
    """The equivalence is not vacuous: the head's tokens are accepted, several per pass."""
    res = generate(small.target, [1, 2, 3], 40, "eagle", head, plan=Plan(budget=10, depth=4), eos=None)
    assert res.tokens == ar_greedy(small.target, [1, 2, 3], 40)
    assert max(res.stats.accepted) >= 2 and res.stats.target_passes < 40
    assert res.stats.accepted[0] == 1  # the first step's pass reads the prompt: nothing drafted yet


def test_the_features_are_what_the_head_reads(small):
    """gpt2.hidden then gpt2.lm_head: forward's logits, and the features are what the tied head multiplies."""
    t = small.target
    plain = forward(t, [1, 2, 3, 4], new_cache(t), logits_from=2)
    feats = hidden(t, [1, 2, 3, 4], new_cache(t))
    np.testing.assert_array_equal(lm_head(t, feats[2:]), plain)
    assert feats.shape == (4, SMALL.n_embd)
    np.testing.assert_allclose(feats[2:] @ t.params["wte"].T, plain, rtol=0, atol=1e-12)


def reference_head(head, features, tokens, positions):  # [n, D], [n], [n] -> guesses [n, D], logits [n, V]
    """The head's math in plain float64 over a causal chain, from nothing of eagle.py or gpt2.py: fc [2D -> d] on
    (embedding, feature), one GPT-2 block of width d, out [d -> D], then the target's tied head on the guesses
    unfolded (a D-wide product with every row of wte; -inf outside a reduced vocabulary)."""
    def ln(x, p):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * p["g"] + p["b"]

    def lin(x, p):
        return x @ p["w"] + p["b"]
    b, H, n = head.block, head.config.n_head, len(tokens)
    x = lin(np.concatenate([head.wte[tokens] + head.wpe[positions], features], axis=-1), head.fc)  # [n, d]
    qkv = np.split(lin(ln(x, b["ln_1"]), b["attn"]["c_attn"]), 3, axis=-1)  # 3 x [n, d]
    q, k, v = (a.reshape(n, H, -1).transpose(1, 0, 2) for a in qkv)  # [H, n, d / H]
    s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]) + np.where(np.tri(n, dtype=bool), 0, -np.inf)  # [H, n, n]
    a = np.exp(s - s.max(-1, keepdims=True))
    x = x + lin(((a / a.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, -1), b["attn"]["c_proj"])
    u = lin(ln(x, b["ln_2"]), b["mlp"]["c_fc"])
    x = x + lin(0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u ** 3))), b["mlp"]["c_proj"])
    guesses = lin(x, head.out)  # [n, D]
    logits = guesses @ head.wte.T  # [n, V]
    return guesses, logits if head.vocab is None else np.where(head.vocab > 0, logits, -np.inf)


@pytest.mark.parametrize("vocab_size,width", [(None, None), (12, None), (None, 4), (7, 16)])
def test_the_head_pass_is_its_math(small, vocab_size, width):
    """head_pass, head_features and head_logits (q folded into out: h @ (out.w @ rows.T) + out.b @ rows.T) equal the
    plain float64 computation of fc -> block -> out -> the target's head, for heads narrower than the target (8, 4
    wide, one head), as wide (16, two heads), with every token or a reduced vocabulary. Controls: q folded from
    the wrong rows of wte, or without out's bias, fails the same comparison."""
    head = eagle.random_head(small.target, seed=3, vocab_size=vocab_size, width=width)
    rng = np.random.default_rng(0)
    n = 9
    features, tokens = rng.standard_normal((n, SMALL.n_embd)), rng.integers(0, SMALL.n_vocab, n)
    positions = np.arange(2, 2 + n)
    h = eagle.head_pass(head, features, tokens, positions, new_cache(head), np.tri(n, dtype=bool))  # [n, d]
    guesses, logits = reference_head(head, features, tokens, positions)
    assert h.shape == (n, head.config.n_embd) and head.config.n_embd == (width or SMALL.n_embd // 2)
    np.testing.assert_allclose(eagle.head_features(head, h), guesses, rtol=0, atol=1e-12)
    got = eagle.head_logits(head, h)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(logits))
    finite = np.isfinite(logits)
    np.testing.assert_allclose(got[finite], logits[finite], rtol=0, atol=1e-12)
    # Its layout (`fastpath.Layout`, chosen by the tools as the draft's): the 9 rows one matrix-vector product each.
    by_rows = dataclasses.replace(head, layout=Layout(gemv_rows=n))
    assert by_rows.prepared["head"].gemv_rows == n == by_rows.prepared["fc"]["w"].gemv_rows
    h_rows = eagle.head_pass(by_rows, features, tokens, positions, new_cache(by_rows), np.tri(n, dtype=bool))
    np.testing.assert_allclose(eagle.head_logits(by_rows, h_rows)[finite], logits[finite], rtol=0, atol=1e-12)
    ids = np.arange(SMALL.n_vocab) if vocab_size is None else head.ids
    for wrong in ({"head": head.out["w"] @ head.wte[np.roll(ids, 1)].T},  # the rows of other tokens
                  {"bias": np.zeros(len(ids))}):  # out's bias left out of the fold
        broken = dataclasses.replace(head)
        broken.__dict__["prepared"] = head.prepared | wrong  # its cached_property, replaced
        assert np.abs(eagle.head_logits(broken, h)[finite] - logits[finite]).max() > 1e-3


@pytest.mark.parametrize("kw", [dict(), dict(temperature=1.0, top_k=10, seed=4),
                                dict(temperature=0.8, seed=5, plan=Plan(shape="fixed", widths=(2, 2), sampled="without"))])
def test_features_and_head_cache_equal_a_fresh_pass(small, head, kw):
    """What the loop handed the head (the target's features of the kept tokens) and what its cache holds
    equal a fresh computation over the emitted text: the target's features in one pass, then the head
    over every pair (f_(j-1), t_j) in one causal pass."""
    kw = {"plan": Plan(budget=8, depth=4), **kw}
    t, prompt = small.target, [4, 5, 6]
    from specdec_np.methods import make
    seen = {}
    original = make

    def spy(*args, **kwargs):  # keep the method object, to read its drafter after the run
        seen["method"] = original(*args, **kwargs)
        return seen["method"]

    import specdec_np.decode as decode
    decode.make, saved = spy, decode.make
    try:
        res = generate(t, prompt, 30, "eagle", head, eos=None, **kw)
    finally:
        decode.make = saved
    seq = prompt + res.tokens
    d = seen["method"].drafter
    fresh = hidden(t, seq, new_cache(t))  # [len(seq), D]
    # Every token's but the last (the bonus token's, unscored), or all when the last step was cut at max_new_tokens.
    n = min(d.n_features, len(seq))
    assert n >= len(seq) - 1
    np.testing.assert_allclose(d.features[:n], fresh[:n], rtol=0, atol=1e-12)
    cache = res.draft_cache
    assert 1 <= cache.length <= len(seq) - 2
    n = cache.length
    ref = new_cache(head)
    mask = np.tril(np.ones((n, n), dtype=bool))
    eagle.head_pass(head, fresh[:n], np.array(seq[1:n + 1]), np.arange(1, n + 1), ref, mask)
    np.testing.assert_allclose(cache.k[:, :, :n], ref.k[:, :, :n], rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache.v[:, :, :n], ref.v[:, :, :n], rtol=0, atol=1e-12)


def test_eos_max_new_tokens_and_context(small, head):
    t = small.target
    ref = ar_greedy(t, [1, 2, 3], 30)
    eos = ref[7]
    res = generate(t, [1, 2, 3], 30, "eagle", head, plan=Plan(budget=10, depth=4), eos=eos)
    assert res.tokens == ref[:ref.index(eos) + 1] and res.stop_reason == "eos"
    for n in range(1, 9):  # cut wherever an accepted path would overshoot
        res = generate(t, [1, 2, 3], n, "eagle", head, plan=Plan(budget=10, depth=5), eos=None)
        assert res.tokens == ref[:n] and res.stop_reason == "max_new_tokens" and sum(res.stats.accepted) == n
    prompt = [i % (SMALL.n_vocab - 1) for i in range(SMALL.n_ctx - 5)]
    res = generate(t, prompt, 50, "eagle", head, plan=Plan(budget=8, depth=4), eos=None)
    assert res.stop_reason == "context" and len(prompt) + len(res.tokens) == SMALL.n_ctx
    assert res.tokens == ar_greedy(t, prompt, 50)[:5]


def test_trace_records_the_heads_passes(small, head):
    res = generate(small.target, [1, 2, 3], 12, "eagle", head, plan=Plan(budget=6, depth=3), eos=None,
                   keep_trees=True)
    first, *rest = res.stats.steps
    assert first.trace.passes == [] and len(first.trace.tree) == 1  # the prompt's pass: no feature yet
    for step in rest:
        assert step.trace.passes and step.trace.passes[0].keys[0] == ()  # the root's guess comes first
        fed, tree = [k for p in step.trace.passes for k in p.keys], step.trace.tree
        expanded = {path_key(tree.tokens, tree.parents, int(i)) for i in tree.parents[1:]}
        assert len(fed) == len(set(fed)) and expanded <= set(fed)  # each node it expanded fed once
        assert step.draft_blocks == [p.rows for p in step.trace.passes]
    assert rest[0].trace.passes[0].rows == 3  # the catch-up pairs of the prompt, then the root's


@pytest.mark.parametrize("plan", [Plan(budget=10, depth=4), Plan(shape="fixed", widths=(2, 1))], ids=["best", "fixed"])
def test_the_head_is_fed_only_the_pairs_it_lacks(small, head, plan):
    """The head's cache keeps the pairs made of the target's features, up to the step's root's, so a step feeds
    (root - 1) - (the last drafting step's root) catch-up pairs before its nodes (root - 1 at the first): counted
    from the emitted text alone. Keeping one pair fewer (truncating to root - 1 after verification) feeds one more
    per step, as keeping one more would feed a stale one."""
    prompt = [1, 2, 3]
    res = generate(small.target, prompt, 40, "eagle", head, plan=plan, eos=None, keep_trees=True)
    root, last, checked = len(prompt) - 1, 0, 0
    for step in res.stats.steps:
        if step.trace.passes:
            first = step.trace.passes[0]
            assert first.rows - len(first.keys) == (root - 1) - last, f"at root {root}"
            assert sum(p.rows for p in step.trace.passes) == (root - 1) - last + sum(len(p.keys) for p in
                                                                                      step.trace.passes)
            last, checked = root, checked + 1
        root += len(step.tokens)
    assert checked >= 5 and res.stats.steps[0].trace.passes == []


def test_the_head_is_not_a_draft_model(small):
    with pytest.raises(ValueError, match="EAGLE head"):
        generate(small.target, [1, 2], 4, "eagle", small.draft)
    other = random_params(SMALL.__class__(**{**vars(SMALL), "n_embd": 8}), seed=0)
    with pytest.raises(ValueError, match="features of width 8"):
        generate(small.target, [1, 2], 4, "eagle", eagle.random_head(other))


@pytest.mark.parametrize("method", ["tree", "speculative", "staged"])
def test_a_head_where_a_model_belongs_is_refused(small, head, method):
    """An EAGLE head passed as the target, or as the draft of a method that drafts with a draft model: one line
    naming the argument, before any work (a draft model there is accepted: the control)."""
    t, ngram = small.target, small.trigram if method == "staged" else None  # generate refuses a model never read
    with pytest.raises(TypeError, match=r"^target: an EAGLE head is not a model"):
        generate(head, [1, 2], 4)
    with pytest.raises(ValueError, match=rf"^draft: an EAGLE head drafts only with method 'eagle' \(method '{method}'"):
        generate(t, [1, 2], 4, method, head, ngram)
    assert len(generate(t, [1, 2], 4, method, small.draft, ngram, eos=None).tokens) == 4


def test_random_head_vocabulary_sizes(small):
    """vocab_size from 1 to the target's vocabulary; 0 or more than it is one line naming it."""
    V = small.target.config.n_vocab
    for bad in (0, V + 1, 10**9, 2.5):
        with pytest.raises(ValueError, match=rf"^vocab_size={bad!r} must be an integer from 1 to the target's {V}"):
            eagle.random_head(small.target, vocab_size=bad)
    assert eagle.random_head(small.target, vocab_size=1).ids.size == 1
    assert eagle.random_head(small.target, vocab_size=V).ids.size == V


def test_a_head_checkpoint_that_disagrees_with_itself_is_refused(tmp_path, small, head):
    """A head's config.json saying two blocks over one block's tensors, or another model_type: refused, naming
    the file; the head as saved loads (the control)."""
    import json

    t32 = small.target.astype(np.float32)
    eagle.save_head(eagle.bind(t32, head.config.n_head, head.fc, head.block, head.out), tmp_path / "h")
    config = tmp_path / "h" / "config.json"
    saved = json.loads(config.read_text())
    assert (saved["n_embd"], saved["n_head"], saved["target_n_embd"]) == (SMALL.n_embd // 2, 1, SMALL.n_embd)
    assert eagle.load_head(tmp_path / "h", t32).n_params == head.n_params
    config.write_text(json.dumps(saved | {"n_layer": 2}))
    with pytest.raises(CheckpointError, match=r"config\.json: n_layer=2, but an EAGLE head has one block"):
        eagle.load_head(tmp_path / "h", t32)
    config.write_text(json.dumps(saved | {"model_type": "bert"}))
    with pytest.raises(CheckpointError, match=r"not an EAGLE head \(its config\.json's model_type is 'bert'"):
        eagle.load_head(tmp_path / "h", t32)
    config.write_text(json.dumps({k: v for k, v in saved.items() if k != "target_n_embd"}))  # a wide head's, before
    with pytest.raises(CheckpointError, match=r"/h: the head of a target with n_embd=None, not 16$"):
        eagle.load_head(tmp_path / "h", t32)


def test_a_head_tensor_of_another_shape_is_refused(tmp_path, small, head):
    """load_head reads through checkpoint.read_tensors, which checks each tensor's shape: named, with both shapes."""
    from specdec_np import checkpoint

    t32 = small.target.astype(np.float32)
    eagle.save_head(eagle.bind(t32, head.config.n_head, head.fc, head.block, head.out), tmp_path / "h")
    D, d = SMALL.n_embd, head.config.n_embd
    tensors = {name: ("F32", np.zeros((D, d) if name == "fc.weight" else shape, np.float32))
               for name, (_, shape) in eagle.head_places(head.config, D).items()}
    checkpoint.write_safetensors(tmp_path / "h" / "model.safetensors", tensors)
    with pytest.raises(CheckpointError, match=rf"model\.safetensors: tensor 'fc\.weight' has shape \({D}, {d}\), "
                                              rf"expected \({2 * D}, {d}\)"):
        eagle.load_head(tmp_path / "h", t32)


def test_save_head_refuses_what_float16_cannot_hold(tmp_path, small, head):
    """save_head writes through checkpoint.py's writer: a weight out of float16's range is refused, named."""
    big = {**head.fc, "b": head.fc["b"] + 1e6}
    with pytest.raises(ValueError, match=r"save: parameter fc\.bias is not finite in float16"):
        eagle.save_head(eagle.bind(small.target, head.config.n_head, big, head.block, head.out), tmp_path / "h")
    assert not (tmp_path / "h" / "model.safetensors").exists()


def test_checkpoint_round_trip(tmp_path, small, head):
    t32 = small.target.astype(np.float32)
    h32 = eagle.bind(t32, head.config.n_head, head.fc, head.block, head.out)
    eagle.save_head(h32, tmp_path / "h")
    loaded = eagle.load_head(tmp_path / "h", t32)
    assert loaded.wte is t32.params["wte"] and loaded.wpe is t32.params["wpe"]  # the target's, not copies
    assert loaded.config == h32.config and loaded.config.n_embd < t32.config.n_embd  # its own width and heads
    assert set(eagle.head_places(loaded.config, SMALL.n_embd)) >= {"fc.weight", "out.weight", "out.bias"}
    for key, (where, _) in eagle.head_places(loaded.config, SMALL.n_embd).items():
        got = {"fc": loaded.fc, "blocks": [loaded.block], "out": loaded.out}
        want = {"fc": h32.fc, "blocks": [h32.block], "out": h32.out}
        for k in where:
            got, want = got[k], want[k]
        np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32), err_msg=key)
    with pytest.raises(CheckpointError, match="n_embd=16, not 8"):
        eagle.load_head(tmp_path / "h", random_params(SMALL.__class__(**{**vars(SMALL), "n_embd": 8}), seed=0))
    (tmp_path / "h" / "config.json").write_text((tmp_path / "h" / "config.json").read_text().replace("eagle-head", "x"))
    with pytest.raises(CheckpointError, match="not an EAGLE head"):
        eagle.load_head(tmp_path / "h", t32)


# ----------------------------------------------------------------------------- exact, through generate
# (rule or None for the tree's own, plan fields, sampling settings). Three tokens: the first step's pass
# reads the prompt and drafts nothing, the second verifies the head's tree (up to two levels deep).
EXACT_CASES = [  # top-k keeps the enumeration small (each case a few hundred runs of `generate` at most)
    (None, dict(budget=3, depth=2), dict(top_k=3)),  # the head's top tokens, best first: point mass
    (None, dict(shape="fixed", widths=(2, 1)), dict(top_k=2)),
    (None, dict(widths=(2,), sampled="with"), dict(top_k=2)),  # recursive
    (None, dict(widths=(2, 1), sampled="without"), dict(top_k=2)),  # recursive without replacement
    ("traversal", dict(widths=(2, 1), sampled="without"), dict(top_k=2)),
    ("traversal", dict(widths=(1, 1), sampled="without", min_q=0.6), dict(top_k=2)),  # doubted tokens are leaves
    ("chain", dict(widths=(1, 1), sampled="with"), dict(top_k=2)),
    ("block", dict(widths=(1, 1), sampled="with"), dict(top_k=2)),
]


def exact_output(tiny, head, fields, settings, n=3):
    """{the first n tokens: exact probability} of `generate`, every random branch enumerated, and the rules run."""
    from specdec_np.proofs import exact

    rules = set()

    def fn(rand):
        res = generate(tiny.target, TINY_PROMPT, n, "eagle", head, plan=Plan(**fields), temperature=1.0, rand=rand,
                       eos=None, keep_trees=True, **settings)
        rules.update(step.trace.rule for step in res.stats.steps[1:])
        return tuple(res.tokens)

    return exact.outcomes(fn), rules


def target_output(tiny, n=3, top_k=None):
    from specdec_np.proofs import exact

    def next_dist(context):
        return process(forward(tiny.target, list(context), new_cache(tiny.target))[-1], 1.0, top_k)
    return exact.sequence_distribution(next_dist, tuple(TINY_PROMPT), n)


@pytest.mark.parametrize("rule,fields,settings", EXACT_CASES, ids=lambda v: str(v))
def test_generate_samples_the_target_exactly(tiny, tiny_head, rule, fields, settings):
    fields = {**fields, "rule": rule}
    got, rules = exact_output(tiny, tiny_head, fields, settings)
    want = target_output(tiny, top_k=settings.get("top_k"))
    expected = rule or verify.default_rule(eagle_kind(fields), 1.0)
    assert rules == {expected}  # the head's trees were verified by that rule, every step after the first
    assert set(got) <= set(want)
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) < 1e-12


def eagle_kind(fields) -> str:
    from specdec_np.methods import METHODS
    return METHODS["eagle"].tree_kind(Plan(**fields), 1.0)


@pytest.mark.parametrize("rule,fields,settings", [("point_mass", dict(budget=3, depth=2), dict(top_k=3)),
                                                  ("recursive", dict(widths=(2,), sampled="with"), dict(top_k=2)),
                                                  ("recursive_wor", dict(widths=(2, 1), sampled="without"),
                                                   dict(top_k=2))], ids=lambda v: str(v))
def test_generate_samples_the_target_exactly_negative_control(tiny, tiny_head, monkeypatch, rule, fields, settings):
    """The same check catches a rule that accepts the head's tokens untested."""
    monkeypatch.setitem(verify.RULES, rule, always_accept)
    got, _ = exact_output(tiny, tiny_head, fields, settings)
    want = target_output(tiny, top_k=settings.get("top_k"))
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) > 0.01


@pytest.mark.parametrize("rule,fields,settings", [EXACT_CASES[0], EXACT_CASES[3], EXACT_CASES[2]], ids=lambda v: str(v))
def test_a_reduced_vocabulary_samples_the_target_exactly(tiny, rule, fields, settings):
    """EAGLE-3's reduced draft vocabulary: a head that can draft only 3 of the 4 tokens (q = 0 on the fourth,
    which the target may still emit) leaves the output distribution exactly the target's."""
    head = eagle.random_head(tiny.target, seed=5, scale=0.3, vocab_size=3)
    got, _ = exact_output(tiny, head, {**fields, "rule": rule}, settings)
    want = target_output(tiny, top_k=settings.get("top_k"))
    assert max(abs(got.get(k, 0.0) - p) for k, p in want.items()) < 1e-12


def test_a_reduced_vocabulary_drafts_only_its_tokens(small):
    """Greedy output is plain decoding's; every drafted token is in the head's vocabulary, and q is zero outside it."""
    head = eagle.random_head(small.target, seed=1, vocab_size=12)
    allowed = set(np.flatnonzero(head.vocab).tolist())
    for temperature in (0.0, 1.0):
        res = generate(small.target, [1, 2, 3], 30, "eagle", head, plan=Plan(budget=8, depth=3), eos=None,
                       keep_trees=True, temperature=temperature, seed=3)
        if temperature == 0:
            assert res.tokens == ar_greedy(small.target, [1, 2, 3], 30)
        drafted = {int(t) for s in res.stats.steps for t, src in zip(s.trace.tree.tokens[1:], s.trace.tree.source[1:])
                   if src == DRAFT}
        assert drafted and drafted <= allowed
    q = process(eagle.head_logits(head, np.ones((2, head.config.n_embd))), 1.0)
    assert (q[:, sorted(set(range(SMALL.n_vocab)) - allowed)] == 0).all() and np.allclose(q.sum(-1), 1)


def test_a_reduced_vocabulary_round_trip(tmp_path, small):
    t32 = small.target.astype(np.float32)
    head = eagle.random_head(t32, seed=2, vocab_size=10)
    eagle.save_head(head, tmp_path / "h")
    loaded = eagle.load_head(tmp_path / "h", t32)
    np.testing.assert_array_equal(loaded.vocab, head.vocab)
    rows = t32.params["wte"][head.vocab > 0]  # [10, D]
    np.testing.assert_allclose(loaded.prepared["head"].w, loaded.out["w"] @ rows.T, rtol=1e-6)  # folded into out
    without = eagle.bind(t32, head.config.n_head, head.fc, head.block, head.out)
    eagle.save_head(without, tmp_path / "all")
    assert eagle.load_head(tmp_path / "all", t32).vocab is None  # the control: no row, every token
    # What a pass reads: q's folded head [d, N] and bias [N] over its 10 rows instead of all V (and the 0/1 row).
    def q_bytes(h):
        return h.prepared["head"].w.nbytes + h.prepared["bias"].nbytes
    assert loaded.weight_bytes - q_bytes(loaded) - loaded.vocab.nbytes == without.weight_bytes - q_bytes(without)
    d = head.config.n_embd
    assert loaded.prepared["head"].w.shape == (d, 10) and without.prepared["head"].w.shape == (d, SMALL.n_vocab)
    bad = eagle.bind(t32, head.config.n_head, head.fc, head.block, head.out, head.vocab * 2)
    eagle.save_head(bad, tmp_path / "bad")
    with pytest.raises(CheckpointError, match="'vocab' must hold only 0 and 1"):
        eagle.load_head(tmp_path / "bad", t32)


def test_the_shipped_head_drafts_for_the_shipped_target(embedded):
    """specdec_np/weights/tiny-eagle, bound to the embedded target: narrower than the target, a pass reads fewer bytes
    than the draft model's, and its guesses are accepted more than never, as only a head reading the feature it was
    trained on can be (a random head of its shape: one token per pass, the control; greedy equality is proved above,
    in float64). No particular head's acceptance is asked for."""
    from specdec_np import models
    from specdec_np.tokenizer import encode

    target, draft, _, enc = embedded
    shipped = models.load_head(models.EMBEDDED_HEAD, target)
    assert shipped.wte is target.params["wte"] and shipped.n_feature == target.config.n_embd
    assert shipped.config.n_embd < target.config.n_embd and shipped.weight_bytes < draft.weight_bytes
    prompt = encode(enc, "def mean(values):\n    \"\"\"Return the mean.\"\"\"\n")
    for head, trained in ((shipped, True), (eagle.random_head(target, width=shipped.config.n_embd), False)):
        res = generate(target, prompt, 20, "eagle", head, plan=Plan(budget=8, depth=6), eos=None)
        assert (res.stats.tokens_per_pass > 1.2) == trained


def test_a_head_of_another_width_is_refused_before_any_work(small):
    """generate's checks (checks.py) refuse a head whose features are not the target's width, naming the draft;
    a head of the target's width passes the same check (the control)."""
    target = small.target
    other = eagle.random_head(random_params(dataclasses.replace(SMALL, n_embd=8), seed=1, dtype=np.float64))
    with pytest.raises(ValueError, match=r"^draft: an EAGLE head reads features of width 8, the target's are 16"):
        generate(target, [1, 2], 2, "eagle", other, None, Plan())
    assert len(generate(target, [1, 2], 2, "eagle", eagle.random_head(target), None, Plan()).tokens) == 2
