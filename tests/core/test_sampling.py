"""Sampling: temperature / top-k / top-p against a brute-force reference, greedy, settings, Rand."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np.checks import check_settings
from specdec_np.fastpath import kth_largest
from specdec_np.sampling import Rand, process, top_ids


def reference(logits, temperature, top_k, top_p):
    """Plain-Python processing: softmax(logits / T), keep top-k, keep the nucleus, renormalise."""
    V = len(logits)
    if temperature == 0:
        best = max(range(V), key=lambda i: (logits[i], -i))  # highest logit, then lowest id
        return [1.0 if i == best else 0.0 for i in range(V)]
    m = max(logits)
    e = [math.exp((x - m) / temperature) if x != -math.inf else 0.0 for x in logits]
    p = [x / sum(e) for x in e]
    if top_k is not None:
        keep = sorted(range(V), key=lambda i: (-p[i], i))[:top_k]
        s = sum(p[i] for i in keep)
        p = [p[i] / s if i in keep else 0.0 for i in range(V)]
    if top_p is not None and top_p < 1:
        keep, acc = [], 0.0
        for i in sorted(range(V), key=lambda i: (-p[i], i)):
            if p[i] == 0:
                break
            keep.append(i)
            acc += p[i]
            if acc >= top_p:
                break
        s = sum(p[i] for i in keep)
        p = [p[i] / s if i in keep else 0.0 for i in range(V)]
    return p


# Logits from a small grid, so exact ties (and -inf) are common.
logit_values = st.sampled_from([-3.0, -1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0000001, -math.inf])
logit_rows = st.lists(logit_values, min_size=2, max_size=9).filter(lambda r: max(r) > -math.inf)


@settings(max_examples=60)
@given(logit_rows, st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.one_of(st.none(), st.integers(1, 10)),
       st.one_of(st.none(), st.sampled_from([0.1, 0.3, 0.5, 0.75, 0.9, 0.999, 1.0])))
def test_process_matches_reference(row, temperature, top_k, top_p):
    got = process(np.array(row), temperature, top_k, top_p)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reference(row, temperature, top_k, top_p), rtol=0, atol=1e-12)
    assert abs(got.sum() - 1) < 1e-12


@settings(max_examples=20)
@given(st.lists(logit_rows, min_size=1, max_size=4), st.sampled_from([0.0, 1.0, 2.0]),
       st.one_of(st.none(), st.integers(1, 4)), st.one_of(st.none(), st.sampled_from([0.4, 0.8])))
def test_batch_equals_rows(rows, temperature, top_k, top_p):
    V = min(len(r) for r in rows)
    batch = np.array([r[:V] for r in rows])  # [n, V]
    if (batch == -math.inf).all(axis=1).any():
        return
    got = process(batch, temperature, top_k, top_p)
    for i in range(len(batch)):
        np.testing.assert_array_equal(got[i], process(batch[i], temperature, top_k, top_p))


def test_greedy_is_one_hot_on_lowest_tied_id():
    got = process(np.array([1.0, 3.0, 0.0, 3.0]), temperature=0, top_k=2, top_p=0.5)
    np.testing.assert_array_equal(got, [0, 1, 0, 0])


def test_top_k_ties_keep_lowest_ids_and_top_p_reaches_mass():
    p = process(np.zeros(5), top_k=3)  # five-way tie: ids 0, 1, 2 survive
    np.testing.assert_allclose(p, [1 / 3, 1 / 3, 1 / 3, 0, 0])
    logits = np.log([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(process(logits, top_p=0.45), [1, 0, 0, 0])  # 0.5 alone reaches 0.45
    np.testing.assert_allclose(process(logits, top_p=0.75), [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    np.testing.assert_allclose(process(logits, top_p=0.85), np.array([0.5, 0.3, 0.15, 0]) / 0.95)


@settings(max_examples=40)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.2, 0.5]), min_size=1, max_size=12), st.integers(1, 14))
def test_top_ids_matches_sort(values, k):
    p = np.array(values)
    want = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    assert top_ids(p, k).tolist() == want


def too_high(x, k):  # kth_largest's bound taken from too few block maxima (the control below)
    width = x.size // (4 * k)
    maxima = x[:width * (x.size // width)].reshape(-1, width).max(axis=1)
    reach = x[x >= np.sort(maxima)[-max(1, k // 2)]]
    return np.sort(reach)[-min(k, reach.size)]


@settings(max_examples=60)
@given(st.integers(0, 2**32 - 1), st.integers(32, 3000), st.integers(1, 40), st.sampled_from(["ties", "normal"]))
def test_kth_largest_is_a_partitions(seed, V, k, kind):
    """The k-th largest through block maxima equals np.partition's on long rows (the pruned path), with ties and
    -inf (a head's logits outside its vocabulary); top_ids then matches a full sort. The control, a bound from too
    few block maxima, fails the same check."""
    rng = np.random.default_rng(seed)
    k = min(k, V)
    x = rng.choice([0.0, 0.1, 0.2, 0.5], V) if kind == "ties" else rng.standard_normal(V)
    x[rng.random(V) < 0.5] = -np.inf
    x[rng.integers(V)] = 1.0  # at least one finite value
    want = np.partition(x, V - k)[V - k]
    assert kth_largest(x, k) == want
    assert top_ids(x, k).tolist() == sorted(range(V), key=lambda i: (-x[i], i))[:k]


def test_kth_largest_control():
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal(2000) for _ in range(5)]
    assert all(kth_largest(x, 20) == np.partition(x, 1980)[1980] for x in rows)
    assert any(too_high(x, 20) != np.partition(x, 1980)[1980] for x in rows)


@pytest.mark.parametrize("kwargs, name", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(top_k=0), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=-0.2), "top_p"),
])
def test_invalid_settings_name_the_argument(kwargs, name):
    # The message starts `name=value`: the command line names its option from it (generate checks once, here).
    with pytest.raises(ValueError, match=f"^{name}={kwargs[name]!r} must be "):
        check_settings(**{"temperature": 1.0, **kwargs})


@pytest.mark.parametrize("settings", [(0, None, None), (1.5, 1, 1.0), (0.7, 3, 0.5), (2, None, 0.9)])
def test_valid_settings_pass(settings):
    """Settings at the edges of what is allowed raise nothing and process logits into distributions."""
    assert check_settings(*settings) is None
    probs = process(np.array([[0.0, 1.0, 2.0, 0.5], [3.0, -np.inf, 3.0, 1.0]]), *settings)
    assert probs.shape == (2, 4) and (probs >= 0).all() and np.allclose(probs.sum(axis=-1), 1.0)


def test_bad_logits_raise():
    with pytest.raises(ValueError, match="NaN"):
        process(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="-inf"):
        process(np.array([-np.inf, -np.inf]))
    with pytest.raises(ValueError, match="shape"):
        process(np.zeros((2, 2, 2)))


def test_rand_coin_and_draw():
    rand = Rand(0)
    assert rand.coin(1.0) and rand.coin(1.5) and not rand.coin(0.0) and not rand.coin(-1)
    probs = np.array([0.0, 2.0, 0.0, 6.0, 0.0])  # not normalised, zeros in between and at the ends
    draws = np.array([rand.draw(probs) for _ in range(20000)])
    assert set(np.unique(draws)) == {1, 3}
    assert abs((draws == 3).mean() - 0.75) < 0.02
    coins = np.array([rand.coin(0.3) for _ in range(20000)])
    assert abs(coins.mean() - 0.3) < 0.02
    with pytest.raises(ValueError):
        rand.draw(np.zeros(3))
    with pytest.raises(ValueError):
        rand.draw(np.array([0.5, -0.1, 0.6]))
    with pytest.raises(ValueError):
        rand.draw(np.array([0.5, np.nan, 0.6]))


def test_a_coin_within_rounding_of_certain_draws_nothing():
    """A probability that is 1 (or 0) up to rounding decides without a uniform number, in Rand and
    in the exact enumerator alike, so rounding cannot shift a seed's later draws; a probability
    merely close to 1 still draws one."""
    from specdec_np.proofs.exact import ScriptedRand

    for p, want in ((1.0 - 1e-15, True), (1.0 + 3e-16, True), (1e-17, False), (-0.0, False)):
        rand = Rand(7)
        assert rand.coin(p) is want
        assert rand.rng.random() == Rand(7).rng.random()  # the generator did not move
        scripted = ScriptedRand([])
        assert scripted.coin(p) is want and scripted.n_options == [1]
    rand = Rand(7)
    rand.coin(1.0 - 1e-9)
    assert rand.rng.random() != Rand(7).rng.random()  # the generator moved: a uniform number was drawn
    scripted = ScriptedRand([])
    scripted.coin(1.0 - 1e-9)
    assert scripted.n_options == [2]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.integers(1, 300), zeros=st.floats(0.0, 0.99))
def test_draw_is_the_inverse_cdf_over_the_whole_vector(seed, size, zeros):
    # draw sums only the nonzero entries: it must return exactly the id that the inverse of the
    # cumulative distribution over every entry gives for the same uniform number.
    rng = np.random.default_rng(seed)
    probs = rng.random(size) * (rng.random(size) >= zeros)
    probs[rng.integers(size)] += 0.1  # at least one positive entry
    u = np.random.default_rng(seed).random() * np.cumsum(probs)[-1]
    want = min(int(np.searchsorted(np.cumsum(probs), u, side="right")), int(np.flatnonzero(probs)[-1]))
    assert Rand(seed).draw(probs) == want


def test_rand_is_reproducible_from_seed_or_generator():
    assert Rand(7).draw(np.ones(10)) == Rand(np.random.default_rng(7)).draw(np.ones(10))
    r1, r2 = Rand(3), Rand(3)
    assert [r1.draw(np.ones(50)) for _ in range(20)] == [r2.draw(np.ones(50)) for _ in range(20)]


@pytest.mark.parametrize("top_k, top_p", [(None, 0.95), (1500, 0.9), (700, None), (None, 0.3)])
def test_wide_vocabulary_matches_reference(top_k, top_p):
    # Wide and flat enough that the nucleus spans far more than the first partition tries (64).
    logits = np.round(np.random.default_rng(0).normal(size=2000), 1)  # many exact ties
    got = process(logits, 0.8, top_k, top_p)
    np.testing.assert_allclose(got, reference(logits.tolist(), 0.8, top_k, top_p), rtol=0, atol=1e-12)


def test_the_enumerators_draw_offers_the_positive_entries_only():
    """exact.ScriptedRand.draw: one option per positive entry, in id order, probability entry / sum;
    a negative, NaN or all-zero vector is refused, as by Rand.draw."""
    from specdec_np.proofs.exact import ScriptedRand, outcomes

    probs = np.zeros(5000)
    probs[[7, 3, 4999]] = [0.5, 0.25, 0.75]
    assert outcomes(lambda rand: rand.draw(probs)) == {3: 0.25 / 1.5, 7: 0.5 / 1.5, 4999: 0.75 / 1.5}
    for bad in ([0.5, -0.1, 0.6], [0.5, np.nan, 0.6], [0.0, 0.0]):
        with pytest.raises(ValueError):
            ScriptedRand([]).draw(np.array(bad))
