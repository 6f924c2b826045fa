"""The NumPy GPT-2: KV-cache decoding, tree attention and cache compaction equal plain forward passes."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import fastpath
from specdec_np.fastpath import ONE_ROW, SLAB, SLAB_MIN, SLAB_ROWS, Layout, Weight, laid_out
from specdec_np.gpt2 import GPT2Config, KVCache, forward, iter_params, new_cache, random_params

CFG = GPT2Config(n_vocab=61, n_ctx=48, n_embd=24, n_layer=2, n_head=3)


@pytest.fixture(scope="module")
def model():
    return random_params(CFG, seed=1, dtype=np.float64, scale=0.3)  # large scale: non-trivial attention


def full_logits(model, tokens):
    return forward(model, tokens, new_cache(model))


@given(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=2, max_size=30), st.data())
@settings(max_examples=30)
def test_incremental_decoding_equals_full_pass(model, tokens, data):
    ref = full_logits(model, tokens)
    cache = new_cache(model)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(tokens) - 1), max_size=4))))
    out = [forward(model, tokens[a:b], cache) for a, b in zip([0] + cuts, cuts + [len(tokens)])]
    np.testing.assert_allclose(np.concatenate(out), ref, rtol=0, atol=1e-10)
    assert cache.length == len(tokens)


def random_tree(data, max_nodes=10):
    """Parents (parents[i] < i, root 0 with parent -1) and tokens of a random token tree."""
    n = data.draw(st.integers(1, max_nodes))
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)]
    tokens = data.draw(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=n, max_size=n))
    return np.array(parents), np.array(tokens)


def tree_mask_and_depth(parents):
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    depth = np.zeros(n, dtype=int)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
        depth[i] = depth[parents[i]] + 1
    return mask, depth


def path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


def tree_pass(model, prefix, data):
    """A random tree run in one pass after `prefix`, in a fresh cache: (parents, tokens, its logits, cache)."""
    parents, tokens = random_tree(data)
    mask, depth = tree_mask_and_depth(parents)
    cache = new_cache(model)
    forward(model, prefix, cache)
    logits = forward(model, tokens, cache, positions=len(prefix) + depth, mask=mask)
    return parents, tokens, logits, cache


@given(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=1, max_size=20), st.data())
@settings(max_examples=30)
def test_tree_pass_equals_each_root_to_node_path(model, prefix, data):
    parents, tokens, logits, _ = tree_pass(model, prefix, data)
    for i in range(len(tokens)):
        seq = list(prefix) + list(tokens[path(parents, i)])
        np.testing.assert_allclose(logits[i], full_logits(model, seq)[-1], rtol=0, atol=1e-10)


@given(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=1, max_size=15), st.data())
@settings(max_examples=25)
def test_keep_accepted_path_then_continue_equals_fresh_prefill(model, prefix, data):
    parents, tokens, _, cache = tree_pass(model, prefix, data)
    start = len(prefix)  # where the tree's rows begin in the cache
    node = data.draw(st.integers(0, len(tokens) - 1))
    kept = path(parents, node)
    cache.keep(start, kept)
    accepted = list(prefix) + list(tokens[kept])
    assert cache.length == len(accepted)
    fresh = new_cache(model)
    forward(model, accepted, fresh)
    n = len(accepted)
    np.testing.assert_allclose(cache.k[:, :, :n], fresh.k[:, :, :n], rtol=0, atol=1e-12)
    np.testing.assert_allclose(cache.v[:, :, :n], fresh.v[:, :, :n], rtol=0, atol=1e-12)
    nxt = data.draw(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=1, max_size=4))
    np.testing.assert_allclose(forward(model, nxt, cache), full_logits(model, accepted + nxt)[-len(nxt):],
                               rtol=0, atol=1e-10)


@given(st.lists(st.integers(0, CFG.n_vocab - 1), min_size=1, max_size=15), st.data())
@settings(max_examples=25)
def test_padded_block_computes_exactly_the_unpadded_one(model, prefix, data):
    # Dummy rows (a layout's padding) must be invisible to the real ones: same logits, same cache, same length.
    parents, tokens = random_tree(data)
    mask, depth = tree_mask_and_depth(parents)
    pad_to = len(tokens) + data.draw(st.integers(0, 9))
    caches = []
    for padded in (model, laid_out(model, padding=[max(k, pad_to) for k in range(1, len(tokens) + 1)])):
        cache = new_cache(model, max_block=16)
        forward(model, prefix, cache)
        logits = forward(padded, tokens, cache, positions=len(prefix) + depth, mask=mask)
        assert logits.shape == (len(tokens), CFG.n_vocab) and cache.length == len(prefix) + len(tokens)
        caches.append((logits, cache))
    (a, ca), (b, cb) = caches
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    n = ca.length
    np.testing.assert_allclose(cb.k[:, :, :n], ca.k[:, :, :n], rtol=0, atol=1e-12)
    np.testing.assert_allclose(cb.v[:, :, :n], ca.v[:, :, :n], rtol=0, atol=1e-12)


def test_padding_past_the_cache_is_refused(model):
    cache = KVCache(CFG, capacity=12, dtype=np.float64)
    forward(model, list(range(8)), cache)
    with pytest.raises(ValueError, match="KV cache overflow: 8 cached \\+ 8 padded > capacity 12"):
        forward(laid_out(model, padding=(8, 8)), [1, 2], cache)
    assert cache.length == 8


def test_truncate_then_redo_equals_fresh(model):
    toks = list(range(10))
    cache = new_cache(model)
    forward(model, toks, cache)
    cache.truncate(6)
    np.testing.assert_allclose(forward(model, [7, 8], cache), full_logits(model, toks[:6] + [7, 8])[-2:], atol=1e-10)


def test_float32_is_close_to_float64(model):
    m32 = model.astype(np.float32)
    toks = list(range(20))
    got = forward(m32, toks, new_cache(m32))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, full_logits(model, toks), atol=1e-4)


def test_logits_are_row_major(model):
    # Consumers (softmax, top-k, the rules) work along rows: column-major logits cost 5-10x there.
    m32 = model.astype(np.float32)
    for n in (1, 2, 3, SLAB_ROWS, SLAB_ROWS + 1):
        assert forward(m32, list(range(n)), new_cache(m32)).flags.c_contiguous


def test_head_is_a_row_major_copy_of_wte_transposed(model):
    # The tied head is multiplied from its own copy (fastpath.prepare): it must be wte.T, made
    # from this model's own wte (a model cast to another dtype gets its own copy).
    for m in (model, model.astype(np.float32)):
        head = m.prepared["head"].w
        assert head.flags.c_contiguous and head.dtype == m.params["wte"].dtype
        np.testing.assert_array_equal(head, m.params["wte"].T)
    assert model.prepared is model.prepared  # made once per model


def test_prepared_layouts_hold_the_parameters(model):
    # Every linear layer's Weight is the parameter itself plus slabs holding the same numbers.
    for block, prepared in zip(model.params["blocks"], model.prepared["blocks"]):
        for part, name in [("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")]:
            w, weight = block[part][name]["w"], prepared[part][name]["w"]
            assert weight.w is w or np.array_equal(weight.w, w)
            n_in, n_out = w.shape
            if w.size <= SLAB_MIN:
                assert weight.slabs is None
                continue
            assert weight.slabs.shape == (-(-n_out // SLAB), n_in, SLAB)
            unslabbed = weight.slabs.transpose(1, 0, 2).reshape(n_in, -1)
            np.testing.assert_array_equal(unslabbed[:, :n_out], w)
            assert not unslabbed[:, n_out:].any()  # the last slab's padding is zeros


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_out", [5, SLAB, SLAB + 3, 3 * SLAB])
def test_matmul_is_the_matrix_product_for_every_block_size(n_out, dtype):
    # One row (gemv), 2..SLAB_ROWS rows (slabs) and more (one x @ w), a few rows row by row (gemv_rows):
    # the same product within rounding.
    rng = np.random.default_rng(n_out)
    w = rng.standard_normal((37, n_out)).astype(dtype)
    weight = Weight.of(w, slab_min=0)  # slabs however small w is
    plain = Weight.of(w, slab_rows=0, slab_min=0)
    one_by_slabs = Weight.of(w, slab_min=0, gemv_rows=0)  # one row slab by slab too
    row_by_row = Weight.of(w, slab_min=0, gemv_rows=4)  # up to 4 rows one matrix-vector product each
    assert plain.slabs is None
    assert weight.slabs is not None and Weight.of(w).slabs is None
    tol = 1e-12 if dtype == np.float64 else 1e-4
    for n in (1, 2, 3, SLAB_ROWS - 1, SLAB_ROWS, SLAB_ROWS + 1, 40):
        x = rng.standard_normal((n, 37)).astype(dtype)
        for wt in (weight, plain, one_by_slabs, row_by_row):
            got = x @ wt
            assert got.shape == (n, n_out) and got.dtype == dtype
            np.testing.assert_allclose(got, x @ w, rtol=0, atol=tol)


def test_logits_from_skips_only_the_head(model):
    # Catch-up rows get no logits, but their K/V land in the cache exactly as without logits_from.
    toks = list(range(3, 9))
    ref_cache, cache = new_cache(model), new_cache(model)
    ref = forward(model, toks, ref_cache)
    for skip in range(len(toks)):
        cache.truncate(0)
        got = forward(model, toks, cache, logits_from=skip)
        assert got.shape == (len(toks) - skip, CFG.n_vocab)
        np.testing.assert_allclose(got, ref[skip:], rtol=0, atol=1e-12)
        np.testing.assert_array_equal(cache.k[:, :, :len(toks)], ref_cache.k[:, :, :len(toks)])
    with pytest.raises(ValueError, match="logits_from=6"):
        forward(model, toks, new_cache(model), logits_from=len(toks))


def test_errors_are_clear(model):
    cache = new_cache(model)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        forward(model, [CFG.n_vocab], cache)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        forward(model, [-1], cache)
    with pytest.raises(ValueError, match="context overflow"):
        forward(model, [1] * (CFG.n_ctx + 1), cache)
    with pytest.raises(ValueError, match="at least one"):
        forward(model, [], cache)
    with pytest.raises(ValueError, match="mask shape"):
        forward(model, [1, 2], cache, mask=np.ones((3, 3), bool))
    small = KVCache(CFG, capacity=4, dtype=np.float64)
    with pytest.raises(ValueError, match="KV cache overflow"):
        forward(model, [1] * 5, small)
    forward(model, [1, 2, 3], cache)
    with pytest.raises(ValueError, match="ascending"):
        cache.keep(1, [1, 0])
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(5)
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(n_embd=10, n_head=3)


def test_slab_rows_change_no_logit(model, monkeypatch):
    # The layout is the tools' choice for a machine: any choice gives the same logits in float64.
    monkeypatch.setattr(fastpath, "SLAB_MIN", 0)  # slabs for this small model's matrices too
    toks = list(range(3, 20))
    ref = full_logits(model, toks)
    for rows in (0, 1, 4, 16):
        m = dataclasses.replace(model, layout=Layout(slab_rows=rows))  # prepared anew
        assert m.prepared["head"].slab_rows == rows
        cache = new_cache(m)
        got = np.concatenate([forward(m, toks[:9], cache), forward(m, toks[9:12], cache), forward(m, toks[12:], cache)])
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10)


def test_one_row_by_gemv_by_slabs_or_as_a_pair_gives_the_same_logits(model, monkeypatch):
    # `Layout.one_row`, the tools' choice for a machine: the layer matrices multiply one row by one matrix-vector
    # product, slab by slab, or slab by slab as two rows (the head by one product each way); decoding one token at
    # a time gives the same logits, and "pair" does read two rows from the slabs.
    monkeypatch.setattr(fastpath, "SLAB_MIN", 0)  # slabs for this small model's matrices too
    read = []  # rows of each slab product
    unslab = fastpath.unslab
    monkeypatch.setattr(fastpath, "unslab", lambda y, n_out: read.append(y.shape[1]) or unslab(y, n_out))
    toks = list(range(3, 15))
    logits = {}
    for how in ONE_ROW:
        m = dataclasses.replace(model, layout=Layout(one_row=how))  # prepared anew
        layers = [w for k, v in m.prepared.items() if k != "head" for w in iter_params(v) if isinstance(w, Weight)]
        assert layers and all(w.gemv_rows == (how == "gemv") and w.pair == (how == "pair") and w.slabs is not None
                              for w in layers)
        assert m.prepared["head"].gemv_rows == 1 == laid_out(model, one_row=how).prepared["head"].gemv_rows
        for m in (m, laid_out(laid_out(m, one_row="slabs" if how != "slabs" else "pair"), one_row=how)):
            cache, read[:] = new_cache(m), []
            logits[how] = np.concatenate([forward(m, [t], cache) for t in toks])
            assert set(read) == {"gemv": set(), "slabs": {1}, "pair": {2}}[how]
            np.testing.assert_allclose(logits[how], full_logits(model, toks), rtol=0, atol=1e-10)
    np.testing.assert_allclose(logits["gemv"], logits["slabs"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(logits["pair"], logits["slabs"], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="^one_row: one of gemv, slabs, pair, got 'blas'$"):
        dataclasses.replace(model, layout=Layout(one_row="blas"))


def test_blocks_row_by_row_give_the_same_logits(model, monkeypatch):
    # `Layout.gemv_rows`, the tools' choice where a BLAS packs w for a few rows: blocks of up to that many rows are
    # one matrix-vector product per row, the head's included. A prefix of 9, one token, then a tree of 5 in one pass.
    monkeypatch.setattr(fastpath, "SLAB_MIN", 0)  # slabs for this small model's matrices too (the other way)
    mask, depth = tree_mask_and_depth([-1, 0, 0, 1, 1])
    logits = []
    for rows, one_row in ((1, "gemv"), (3, "gemv"), (8, "gemv"), (8, "slabs")):
        m = dataclasses.replace(model, layout=Layout(one_row=one_row, gemv_rows=rows))  # prepared anew
        weights = [w for w in iter_params(m.prepared) if isinstance(w, Weight)]
        assert {w.gemv_rows for w in weights} == ({rows} if one_row == "gemv" else {0, 1})  # slabs: the head's 1
        cache = new_cache(m)
        logits.append(np.concatenate([forward(m, list(range(3, 12)), cache), forward(m, [5], cache),
                                      forward(m, [3, 9, 4, 4, 7], cache, positions=10 + depth, mask=mask)]))
        np.testing.assert_allclose(logits[-1], logits[0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="^gemv_rows: an integer >= 1 .*, got 0$"):
        laid_out(model, gemv_rows=0)
    assert laid_out(m, gemv_rows=3).prepared["blocks"][0]["mlp"]["c_fc"]["w"].gemv_rows == 0  # one row by slabs


def test_a_large_model_reads_its_slabs_from_views(monkeypatch):
    # Above SLAB_COPY_MAX bytes of weights the layer matrices' slabs are views of the parameters
    # (no second copy) and the head is wte.T itself; the logits are those of the copies (within
    # rounding: one row's head is a matrix-vector product over wte rather than over its transpose).
    model = random_params(GPT2Config(n_vocab=61, n_ctx=48, n_embd=64, n_layer=2, n_head=4), 1, np.float64, 0.3)
    monkeypatch.setattr(fastpath, "SLAB_MIN", 0)
    toks = list(range(3, 20))
    copied = dataclasses.replace(model)
    assert copied.prepared  # laid out now, as a small model
    monkeypatch.setattr(fastpath, "SLAB_COPY_MAX", 0)
    viewed = dataclasses.replace(model)
    for block, prepared in zip(model.params["blocks"], viewed.prepared["blocks"]):
        for part, name in [("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")]:
            weight, w = prepared[part][name]["w"], block[part][name]["w"]
            assert weight.w is w and np.shares_memory(weight.slabs, w)
    head = viewed.prepared["head"]
    assert np.shares_memory(head.w, model.params["wte"]) and not np.shares_memory(head.slabs, model.params["wte"])
    assert not np.shares_memory(copied.prepared["head"].w, model.params["wte"])  # the small model's row-major copy
    for n in (1, 3, SLAB_ROWS + 1):
        got = [forward(m, toks[:n], new_cache(m)) for m in (copied, viewed)]
        np.testing.assert_allclose(got[0], got[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("field, value", [("n_head", 0), ("n_head", -8), ("n_vocab", 0), ("n_embd", -16),
                                          ("n_layer", "6"), ("n_vocab", 8193.7), ("n_ctx", True),
                                          ("layer_norm_epsilon", -1.0), ("layer_norm_epsilon", float("nan")),
                                          ("layer_norm_epsilon", float("inf"))])
def test_config_refuses_impossible_hyperparameters(field, value):
    # B11: n_head=0 was a ZeroDivisionError; the others were accepted, then failed oddly.
    with pytest.raises(ValueError, match=f"^{field}="):
        GPT2Config(**{field: value})


def entries_into_gpt2(target, run) -> tuple[list, list]:
    """What `run()` does with `target` in gpt2.py: (the gpt2.py functions entered from another file with `target`
    among their arguments, as (caller's file, function)), and the calls gpt2.py makes into checks.py."""
    import sys

    entries, checks = [], []

    def tracer(frame, event, arg):
        callee = frame.f_code.co_filename.rsplit("/", 1)[-1]
        caller = frame.f_back.f_code.co_filename.rsplit("/", 1)[-1] if frame.f_back else ""
        if callee == "gpt2.py" and caller != "gpt2.py" and any(v is target for v in frame.f_locals.values()):
            entries.append((caller, frame.f_code.co_name))
        if callee == "checks.py" and caller == "gpt2.py":
            checks.append(frame.f_code.co_name)
    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return entries, checks


@pytest.mark.parametrize("method", ["tree", "eagle"])
def test_the_target_enters_gpt2_to_build_its_cache_and_run_its_pass(small, method):
    """Issue 67's walk: `target`, followed from `generate` through a step, enters gpt2.py only to build its cache
    and to run its pass (`hidden`, then `lm_head`), besides the recorder's read of its `weight_bytes`; gpt2.py
    leaves for checks.py never (forward's arguments are checked where its block is built, `gpt2.inputs`)."""
    from specdec_np import eagle
    from specdec_np.decode import generate

    draft = eagle.random_head(small.target) if method == "eagle" else small.draft
    generate(small.target, [1, 2, 3], 3, method, draft)  # the parameters prepared (made once per model)
    entries, checks = entries_into_gpt2(small.target, lambda: generate(small.target, [1, 2, 3], 1, method, draft))
    assert [name for _, name in entries] == ["weight_bytes", "new_cache", "hidden", "lm_head"], entries
    assert {file for file, _ in entries} == {"decode.py"} and checks == []
