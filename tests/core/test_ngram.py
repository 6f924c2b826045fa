"""The Katz backoff trigram and the prompt-lookup drafter: hand-computed numbers, every fallback,
distributions that sum to one, top-k against a full sort, save/load, bad input."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import ngram, ngram_file
from specdec_np.ngram import dist, fit, greedy_continuation, katz_discounts, load, save, top_k
from specdec_np.lookup import lookup_by_match, prompt_lookup


def all_contexts(V):
    """Every context shape a query can take: empty, one token, two tokens."""
    return [[]] + [[a] for a in range(V)] + [[a, b] for a in range(V) for b in range(V)]


def reference_dist(tokens, V, context, k=5, min_count=1):
    """Katz backoff written out with dicts and loops, straight from the module docstring's formulas."""
    t = [int(x) for x in tokens]
    c1 = Counter(t)
    p1 = [(c1[w] + 1) / (len(t) + V) for w in range(V)]
    c2, c3 = Counter(zip(t, t[1:])), Counter(zip(t, t[1:], t[2:]))

    def level(counts, hist, lower, min_keep):
        d, D = katz_discounts(np.array(list(counts.values()) or [0], np.int64), k)
        total = sum(c for g, c in counts.items() if g[:-1] == hist)          # c(h), pruned ones included
        seen = {g[-1]: c for g, c in counts.items() if g[:-1] == hist and c >= min_keep}
        if not seen:
            return lower
        if all(c > k for c in seen.values()) and sum(seen.values()) == total:  # fallback 2
            disc = {w: c - D for w, c in seen.items()}
        else:
            disc = {w: d[min(c, k + 1)] * c for w, c in seen.items()}
        p_star = {w: x / total for w, x in disc.items()}
        beta = 1 - sum(p_star.values())
        lower_seen = sum(lower[w] for w in seen)
        if len(seen) == V or 1 - lower_seen <= 1e-12:                        # fallback 3
            return [p_star.get(w, 0.0) + beta * lower[w] for w in range(V)]
        return [p_star[w] if w in seen else beta / (1 - lower_seen) * lower[w] for w in range(V)]

    context = [int(x) for x in context[-2:]]
    p = p1
    if context:
        p = level(c2, (context[-1],), p1, 1)
    if len(context) == 2:
        p = level(c3, tuple(context), p, min_count)
    return np.array(p)


# ----------------------------------------------------------------------------- hand-computed numbers

def test_katz_discounts_good_turing_by_hand():
    # counts of 9 n-grams: n1 = 6, n2 = 2, n3 = 1; k = 2
    # A = (k+1) n3 / n1 = 3 * 1 / 6 = 1/2
    # r=1: r* = 2 n2 / n1 = 4/6 = 2/3,  d1 = (2/3 - 1/2) / (1 - 1/2) = 1/3
    # r=2: r* = 3 n3 / n2 = 3/2,        d2 = (3/2 / 2 - 1/2) / (1/2) = 1/2
    # counts > k are not discounted: d[3] = 1. Ney's D = n1 / (n1 + 2 n2) = 6 / 10.
    d, D = katz_discounts(np.array([1, 1, 1, 1, 1, 1, 2, 2, 3]), 2)
    np.testing.assert_allclose(d, [0, 1 / 3, 1 / 2, 1], rtol=1e-15)
    assert D == pytest.approx(0.6, rel=1e-15)


def test_katz_discounts_fallbacks_by_hand():
    # Good-Turing ratio outside (0, 1): n1 = 10, n2 = 1, n3 = 3, k = 2 -> A = 3 * 3 / 10 = 0.9
    # d1 = (2 * 1 / 10 - 0.9) / 0.1 = -7, d2 = (3 * 3 / 1 / 2 - 0.9) / 0.1 = 36: both fall back to
    # absolute discounting with D = 10 / (10 + 2) = 5/6: d1 = 1 - 5/6 = 1/6, d2 = (2 - 5/6) / 2 = 7/12.
    d, D = katz_discounts(np.array([1] * 10 + [2] + [3] * 3), 2)
    np.testing.assert_allclose(d, [0, 1 / 6, 7 / 12, 1], rtol=1e-15)
    # A >= 1 (n1 = 1, n6 = 1, k = 5: A = 6 * 1 / 1 = 6) and n2 = 0 so D = 0.5: d_r = (r - 0.5) / r.
    d, D = katz_discounts(np.array([1, 6]), 5)
    assert D == 0.5
    np.testing.assert_allclose(d[1:6], [(r - 0.5) / r for r in range(1, 6)], rtol=1e-15)
    # n_1 = 0: Good-Turing (and Ney's D) undefined.
    d, D = katz_discounts(np.array([2, 2, 3]), 5)
    assert D == 0.5 and d[2] == 0.75 and d[3] == pytest.approx(2.5 / 3, rel=1e-15)
    # No n-grams at all (a one-token stream has no bigrams).
    d, D = katz_discounts(np.zeros(0, np.int64), 5)
    assert D == 0.5 and d[1] == 0.5


def test_small_stream_by_hand():
    """Stream 0 1 0 1 2, V = 3, k = 5: counts, discounts (all fallback 1), backoff weights, distributions."""
    m = fit(np.array([0, 1, 0, 1, 2]), 3)
    # Unigram: c = [2, 2, 1], N = 5 -> P1 = (c + 1) / (5 + 3) = [3/8, 3/8, 2/8]
    np.testing.assert_array_equal(m.counts["uni_count"], [2, 2, 1])
    np.testing.assert_allclose(dist(m, []), [3 / 8, 3 / 8, 2 / 8], rtol=1e-15)
    # Bigrams: (0,1) x2, (1,0) x1, (1,2) x1 -> n1 = 2, n2 = 1, n3 = 0; D = 2 / (2 + 2 * 1) = 0.5
    # d1: r* = 2 * n2 / n1 = 1 -> ratio 1 is not < 1 -> (1 - 0.5) / 1 = 0.5;  d2: n3 = 0 -> (2 - 0.5) / 2 = 0.75
    np.testing.assert_array_equal(m.counts["bi_ctx"], [0, 1])
    np.testing.assert_array_equal(m.counts["bi_ctx_count"], [2, 2])
    np.testing.assert_array_equal(m.counts["bi_tok"], [1, 0, 2])
    np.testing.assert_array_equal(m.counts["bi_count"], [2, 1, 1])
    np.testing.assert_allclose(m.counts["bi_discount"][1:3], [0.5, 0.75], rtol=1e-15)
    # History 0: P*(1|0) = 0.75 * 2 / 2 = 0.75, beta = 0.25, unseen P1 mass = 1 - 3/8 = 5/8
    #   alpha(0) = 0.25 / (5/8) = 0.4 -> P2(.|0) = [0.4 * 3/8, 0.75, 0.4 * 2/8] = [0.15, 0.75, 0.1]
    # History 1: P*(0|1) = P*(2|1) = 0.5 * 1 / 2 = 0.25, beta = 0.5, unseen mass = P1(1) = 3/8
    #   alpha(1) = 0.5 / (3/8) = 4/3 -> P2(1|1) = 4/3 * 3/8 = 0.5
    np.testing.assert_allclose(m.bi_bow, [0.4, 4 / 3], rtol=1e-14)
    np.testing.assert_allclose(dist(m, [0]), [0.15, 0.75, 0.1], rtol=1e-14)
    np.testing.assert_allclose(dist(m, [1]), [0.25, 0.5, 0.25], rtol=1e-14)
    # History 2 is the last token, never followed: P2(.|2) = P1.
    np.testing.assert_array_equal(dist(m, [2]), dist(m, []))
    # Trigrams: (0,1,0), (1,0,1), (0,1,2), once each -> n1 = 3, n2 = 0 -> D = 0.5, d1 = 0.5
    np.testing.assert_array_equal(m.counts["tri_count"], [1, 1, 1])
    # History (0,1), c = 2: P*(0) = P*(2) = 0.5 / 2 = 0.25, beta = 0.5, lower seen mass P2(0|1) + P2(2|1) = 0.5
    #   alpha = 0.5 / (1 - 0.5) = 1 -> P3(1|0,1) = P2(1|1) = 0.5
    # History (1,0), c = 1: P*(1) = 0.5, beta = 0.5, lower seen mass P2(1|0) = 0.75
    #   alpha = 0.5 / 0.25 = 2 -> P3(0|1,0) = 2 * 0.15 = 0.3, P3(2|1,0) = 2 * 0.1 = 0.2
    np.testing.assert_allclose(m.tri_bow, [1, 2], rtol=1e-14)
    np.testing.assert_allclose(dist(m, [0, 1]), [0.25, 0.5, 0.25], rtol=1e-14)
    np.testing.assert_allclose(dist(m, [1, 0]), [0.3, 0.5, 0.2], rtol=1e-14)
    # Unseen histories back off: (2,0) -> P2(.|0); (1,2) -> P2(.|2) = P1; longer contexts use the last two.
    np.testing.assert_array_equal(dist(m, [2, 0]), dist(m, [0]))
    np.testing.assert_array_equal(dist(m, [1, 2]), dist(m, []))
    np.testing.assert_array_equal(dist(m, [2, 2, 1, 0]), dist(m, [1, 0]))


def test_fallback_no_mass_left_by_hand():
    # Stream 0 0 0, V = 2, k = 1. Bigram (0,0) seen twice > k: Katz would keep all of P2(.|0) on token 0
    # and give token 1 nothing. Fallback 2: discount absolutely, D = 0.5 (n1 = 0):
    #   P*(0|0) = (2 - 0.5) / 2 = 0.75, beta = 0.25; P1 = (c + 1) / (3 + 2) = [4/5, 1/5]
    #   alpha(0) = 0.25 / (1/5) = 1.25 -> P2(1|0) = 1.25 * 1/5 = 0.25
    # Trigram (0,0,0) once (<= k): d1 = 0.5 (n2 = 0 -> D = 0.5), P*(0|0,0) = 0.5, beta = 0.5,
    #   alpha = 0.5 / (1 - 0.75) = 2 -> P3(1|0,0) = 2 * 0.25 = 0.5
    m = fit(np.array([0, 0, 0]), 2, katz_k=1)
    np.testing.assert_allclose(dist(m, [0]), [0.75, 0.25], rtol=1e-15)
    np.testing.assert_allclose(dist(m, [0, 0]), [0.5, 0.5], rtol=1e-15)
    np.testing.assert_allclose(dist(m, [1]), [0.8, 0.2], rtol=1e-15)   # 1 never a history: P1


def test_fallback_history_saw_every_token_by_hand():
    # Stream 0 1 1 0 0, V = 2: bigrams (0,1), (1,1), (1,0), (0,0) once each -> n1 = 4, n2 = 0, D = 0.5, d1 = 0.5.
    # History 0 (c = 2) saw both tokens: P* = 0.5 / 2 = 0.25 each, beta = 0.5, nothing unseen to back off to.
    # Fallback 3 interpolates with P1 = (c + 1) / (5 + 2) = [4/7, 3/7]:
    #   P2(0|0) = 0.25 + 0.5 * 4/7 = 15/28,  P2(1|0) = 0.25 + 0.5 * 3/7 = 13/28
    m = fit(np.array([0, 1, 1, 0, 0]), 2)
    np.testing.assert_allclose(dist(m, [0]), [15 / 28, 13 / 28], rtol=1e-15)
    np.testing.assert_allclose(dist(m, [1]), [15 / 28, 13 / 28], rtol=1e-15)   # same counts after 1
    # Trigram history (1,1) saw only 0 (once, c = 1): P* = 0.5, lower seen mass P2(0|1) = 15/28,
    #   alpha = 0.5 / (13/28) = 14/13 -> P3(1|1,1) = 14/13 * 13/28 = 0.5
    np.testing.assert_allclose(dist(m, [1, 1]), [0.5, 0.5], rtol=1e-14)


def test_min_count_prunes_trigrams_into_the_backoff():
    # Stream 0 1 0 1 2 with min_count = 2: every trigram is seen once, so all are dropped and each
    # trigram history backs off fully (P3 = P2); bigrams and unigrams are untouched.
    full, pruned = fit(np.array([0, 1, 0, 1, 2]), 3), fit(np.array([0, 1, 0, 1, 2]), 3, min_count=2)
    assert len(pruned.tri_tok) == 0 and len(full.tri_tok) == 3
    for ctx in all_contexts(3):
        np.testing.assert_array_equal(dist(pruned, ctx), dist(full, ctx[-1:]))
    # A pruned trigram's mass goes to the backoff: (0,1,0) twice is kept, (0,1,2) once is dropped, and
    # c(0,1) = 3 still counts it, so beta(0,1) > what an unpruned history with only (0,1,0) x2 would get.
    m = fit(np.array([0, 1, 0, 1, 0, 1, 2]), 3, min_count=2)
    np.testing.assert_array_equal(m.counts["tri_ctx_count"], [3, 2])   # histories (0,1), (1,0)
    np.testing.assert_array_equal(m.counts["tri_count"], [2, 2])
    np.testing.assert_allclose(dist(m, [0, 1]), reference_dist([0, 1, 0, 1, 0, 1, 2], 3, [0, 1], min_count=2),
                               rtol=1e-13)


# ----------------------------------------------------------------------------- properties

streams = st.integers(3, 12).flatmap(
    lambda V: st.tuples(st.just(V), st.lists(st.integers(0, V - 1), min_size=1, max_size=200)))


@given(streams, st.integers(1, 3), st.data())
@settings(max_examples=30)
def test_every_distribution_sums_to_one_and_matches_reference(stream, min_count, data):
    V, tokens = stream
    m = fit(np.array(tokens), V, min_count=min_count)
    contexts = [[], tokens[-1:], tokens[-2:], tokens[:2]]               # seen histories
    contexts += [data.draw(st.lists(st.integers(0, V - 1), max_size=3)) for _ in range(4)]   # any
    for ctx in contexts:
        p = dist(m, ctx)                                                # [V]
        assert p.shape == (V,) and p.dtype == np.float64
        assert (p > 0).all()
        assert abs(p.sum() - 1) <= 1e-9
        np.testing.assert_allclose(p, reference_dist(tokens, V, ctx, min_count=min_count), rtol=1e-12, atol=0)


def test_histories_that_saw_every_token_sum_to_one():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 3, 500)
    m = fit(tokens, 3)
    saw_all = [ctx for ctx in all_contexts(3)[4:] if (m.tri_key == ctx[0] * 3 + ctx[1]).any()
               and np.diff(m.tri_ptr)[np.searchsorted(m.tri_key, ctx[0] * 3 + ctx[1])] == 3]
    assert len(saw_all) >= 5                                            # the case is really exercised
    for ctx in all_contexts(3):
        p = dist(m, ctx)
        assert (p > 0).all() and abs(p.sum() - 1) <= 1e-12
        np.testing.assert_allclose(p, reference_dist(tokens, 3, ctx), rtol=1e-12)


@given(streams, st.integers(1, 2), st.data())
@settings(max_examples=30)
def test_top_k_agrees_with_sorting_the_full_distribution(stream, min_count, data):
    V, tokens = stream
    m = fit(np.array(tokens), V, min_count=min_count)
    for _ in range(4):
        ctx = data.draw(st.lists(st.integers(0, V - 1), max_size=3) | st.just(tokens[-2:]))
        k = data.draw(st.integers(1, V + 2))
        p = dist(m, ctx)
        want = np.argsort(-p, kind="stable")[:k]                        # ties: lower id first
        toks, probs = top_k(m, ctx, k)
        np.testing.assert_array_equal(toks, want)
        np.testing.assert_array_equal(probs, p[want])                   # bit-identical to dist()


@given(streams, st.data())
@settings(max_examples=20)
def test_memoised_top_k_equals_a_fresh_query(stream, data):
    # top_k memoises by (histories, k): asking again, or asking a context with the same last two
    # tokens, must give what an empty memo computes.
    V, tokens = stream
    m = fit(np.array(tokens), V)
    queries = data.draw(st.lists(st.tuples(st.lists(st.integers(0, V - 1), max_size=4), st.integers(1, V)),
                                 min_size=1, max_size=8))
    for ctx, k in queries + queries[::-1]:
        toks, probs = top_k(m, ctx, k)
        saved = dict(m.memo)
        m.memo.clear()
        want_toks, want_probs = top_k(m, ctx, k)
        m.memo.update(saved)
        np.testing.assert_array_equal(toks, want_toks)
        np.testing.assert_array_equal(probs, want_probs)


def test_top_k_breaks_ties_by_token_id():
    # Stream 0 1 0 1 2: P(.|0,1) = [0.25, 0.5, 0.25] ties tokens 0 and 2.
    m = fit(np.array([0, 1, 0, 1, 2]), 3)
    toks, probs = top_k(m, [0, 1], 2)
    np.testing.assert_array_equal(toks, [1, 0])
    np.testing.assert_allclose(probs, [0.5, 0.25])
    np.testing.assert_array_equal(top_k(m, [0, 1], 3)[0], [1, 0, 2])


def test_greedy_continuation_follows_argmax():
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 7, 300)
    m = fit(tokens, 7)
    ctx = [int(x) for x in tokens[:5]]
    got = greedy_continuation(m, ctx, 6)
    for t in got:
        assert t == int(np.argmax(dist(m, ctx)))                        # argmax takes the lowest id on ties
        ctx.append(t)
    assert len(got) == 6 and greedy_continuation(m, ctx, 0) == []


# ----------------------------------------------------------------------------- save / load

def test_save_load_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 9, 400)
    for min_count in (1, 2):
        m = fit(tokens, 9, min_count=min_count)
        path = tmp_path / f"tri{min_count}.npz"
        save(m, path)
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []   # no leftovers
        m2 = load(path)
        assert (m2.n_vocab, m2.katz_k, m2.min_count) == (9, 5, min_count)
        for ctx in all_contexts(9):
            np.testing.assert_array_equal(dist(m2, ctx), dist(m, ctx))
            for a, b in zip(top_k(m2, ctx, 4), top_k(m, ctx, 4)):
                np.testing.assert_array_equal(a, b)
        with np.load(path) as z:                                        # counts stored as small ints
            assert str(z["format"]) == ngram_file.FORMAT and int(z["n_vocab"]) == 9
            assert z["tri_count"].dtype == np.uint8 and z["bi_tok"].dtype == np.uint8


def test_load_rejects_wrong_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="junk.npz is not a specdec_np n-gram model"):
        load(junk)
    other = tmp_path / "other.npz"
    np.savez(other, x=np.zeros(3))
    with pytest.raises(ValueError, match="no 'specdec_np.ngram' format tag"):
        load(other)
    m = fit(np.array([0, 1, 0, 1, 2]), 3)
    save(m, tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as z:
        arrays = dict(z)
    np.savez(tmp_path / "v2.npz", **{**arrays, "version": np.array(2)})
    with pytest.raises(ValueError, match="format version 2"):
        load(tmp_path / "v2.npz")
    del arrays["tri_count"]
    np.savez(tmp_path / "cut.npz", **arrays)
    with pytest.raises(ValueError, match="missing arrays \\['tri_count'\\]"):
        load(tmp_path / "cut.npz")


# ----------------------------------------------------------------------------- bad input

def test_fit_rejects_bad_streams():
    with pytest.raises(ValueError, match="empty token stream"):
        fit(np.array([], np.int64), 5)
    with pytest.raises(ValueError, match="id 5, outside the vocabulary 0..4"):
        fit(np.array([0, 5, 1]), 5)
    with pytest.raises(ValueError, match="id -1, outside"):
        fit(np.array([0, -1]), 5)
    with pytest.raises(ValueError, match="1-D"):
        fit(np.zeros((2, 2), np.int64), 5)
    with pytest.raises(ValueError, match="integer token ids"):
        fit(np.array([0.0, 1.0]), 5)
    with pytest.raises(ValueError, match="min_count=0"):
        fit(np.array([0, 1]), 5, min_count=0)
    for k in (10**30, 10**9, 0):  # B9: an OverflowError, a 7.45 GiB table
        with pytest.raises(ValueError, match=rf"katz_k={k} must be in 1..7 \(no n-gram of a stream of 7 tokens"):
            fit(np.arange(7) % 5, 5, katz_k=k)
    assert fit(np.arange(7) % 5, 5, katz_k=7).katz_k == 7  # the bound itself fits


def test_queries_reject_out_of_vocabulary_ids():
    m = fit(np.array([0, 1, 0, 1, 2]), 3)
    for query in (lambda c: dist(m, c), lambda c: top_k(m, c, 2), lambda c: greedy_continuation(m, c, 2)):
        with pytest.raises(ValueError, match="context token id 3 is outside the vocabulary 0..2"):
            query([0, 3])
        with pytest.raises(ValueError, match="context token id -1 is outside"):
            query([-1, 0])
    with pytest.raises(ValueError, match="k=0"):
        top_k(m, [0], 0)


# ----------------------------------------------------------------------------- prompt lookup

def test_prompt_lookup_proposes_continuation_of_most_recent_match():
    #          0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6]
    # Suffix [5, 6] occurs at 0 and 4; the most recent is 4, followed by 8, 2, 5, 6.
    assert prompt_lookup(tokens, max_ngram=2, k=3) == [8, 2, 5]
    # Past the end of the sequence the proposal goes round the loop it found (period 4 here).
    assert prompt_lookup(tokens, max_ngram=2, k=10) == [8, 2, 5, 6, 8, 2, 5, 6, 8, 2]
    # Longest match first: suffix [1, 5, 6] occurs once (at 3), beating the more recent [5, 6].
    tokens = [1, 5, 6, 9, 4, 5, 6, 3, 1, 5, 6]
    assert prompt_lookup(tokens, max_ngram=3, k=2) == [9, 4]
    assert prompt_lookup(tokens, max_ngram=2, k=2) == [3, 1]
    # min_ngram bounds how short a match may be: [7] occurs earlier, [2, 7] does not.
    assert prompt_lookup([7, 1, 2, 7], max_ngram=2, min_ngram=1, k=2) == [1, 2]
    assert prompt_lookup([7, 1, 2, 7], max_ngram=2, min_ngram=2, k=2) == []


def test_prompt_lookup_nothing_to_propose():
    assert prompt_lookup([1, 2, 3, 4]) == []                            # last token never seen before
    assert prompt_lookup([]) == [] and prompt_lookup([3]) == []
    # A repeated token matches its own earlier copy; overlapping matches are fine.
    assert prompt_lookup([3, 3], k=4) == [3, 3, 3, 3]
    assert prompt_lookup([4, 4, 4, 4], max_ngram=3, k=4) == [4, 4, 4, 4]  # [4,4,4] at 0: a loop of one token
    assert prompt_lookup([1, 2, 3, 1, 2], max_ngram=2, k=5) == [3, 1, 2, 3, 1]  # a loop of three
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        prompt_lookup([1, 2], max_ngram=1, min_ngram=2)


def test_lookup_by_match_sets_the_length_by_the_match():
    #          0  1  2  3  4  5  6  7  8
    tokens = [1, 5, 6, 9, 4, 5, 6, 3, 1, 5, 6]
    assert lookup_by_match(tokens, (3, 2, 1)) == [9, 4, 5]    # [1, 5, 6] matched: 3 tokens
    assert lookup_by_match(tokens[:-1] + [7, 5, 6], (3, 2, 1)) == [3, 1]  # only [5, 6]: 2 tokens
    assert lookup_by_match([7, 1, 2, 7], (3, 2, 1)) == [1]    # only [7]: 1 token
    assert lookup_by_match([7, 1, 2, 7], (3, 2, 0)) == []     # 0: nothing after a one-token match
    # A zero length stops the search at that match: a shorter match is not tried instead.
    assert lookup_by_match(tokens[:-1] + [7, 5, 6], (3, 0, 4)) == []
    assert lookup_by_match([1, 2, 3, 4], (3, 2, 1)) == []     # nothing matches


@given(st.lists(st.integers(0, 4), max_size=40), st.integers(1, 5))
@settings(max_examples=30)
def test_lookup_by_match_with_equal_lengths_is_prompt_lookup(tokens, k):
    assert lookup_by_match(tokens, (k, k, k)) == prompt_lookup(tokens, k=k)


@given(st.lists(st.integers(0, 4), max_size=40), st.integers(1, 4), st.integers(1, 5))
@settings(max_examples=30)
def test_prompt_lookup_matches_brute_force(tokens, max_ngram, k):
    want = []
    for n in range(max_ngram, 0, -1):
        starts = [i for i in range(len(tokens) - n) if tokens[i:i + n] == tokens[len(tokens) - n:]]
        if starts:
            ext = list(tokens)  # the proposal continues the sequence: copy token by token
            for j in range(k):
                ext.append(ext[starts[-1] + n + j])
            want = ext[len(tokens):]
            break
    assert prompt_lookup(tokens, max_ngram=max_ngram, k=k) == want




def test_top_k_ties_among_many_tokens():
    # V = 60 with only 3 distinct tokens in the stream: 57 tokens tie in every distribution (unseen, same
    # unigram count), more than a sort's small-array (stable) path handles.
    m = fit(np.array([0, 1, 2, 0, 1, 2, 2]), 60)
    for ctx in ([], [2], [1, 2], [59, 59]):
        p = dist(m, ctx)
        toks, probs = top_k(m, ctx, 50)
        np.testing.assert_array_equal(toks, np.argsort(-p, kind="stable")[:50])
        np.testing.assert_array_equal(probs, p[toks])


def test_top_k_candidates_cover_values_that_tie_only_after_scaling():
    # Two stored values one ulp apart, the smaller on the lower token id: scaled by 0.1 both round to
    # the same probability, so the later token 1 must win the tie against token 5 (stored first).
    a = 0.7
    tok, val = np.array([5, 1, 7]), np.array([a, np.nextafter(a, 0), 0.1])
    assert 0.1 * val[0] == 0.1 * val[1]
    toks, probs = ngram._group_top(tok, val, [0.1], np.zeros(8, bool), 0, 1)
    assert 1 in toks.tolist() and 5 in toks.tolist() and 7 not in toks.tolist()


def saved_arrays(tmp_path) -> dict:
    path = tmp_path / "m.npz"
    save(fit(np.array([0, 1, 0, 1, 2, 1, 0]), 3), path)
    with np.load(path) as z:
        return dict(z)


def write_npz(path, arrays: dict, raw: dict = {}):
    """An .npz of `arrays` plus members of `raw` bytes (name -> bytes), as np.savez writes them."""
    import io
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        for name, a in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.asanyarray(a))
            z.writestr(name + ".npy", buf.getvalue())
        for name, data in raw.items():
            z.writestr(name, data)
    return path


def test_an_npz_member_is_checked_from_its_header_before_it_is_read(tmp_path, monkeypatch):
    arrays = saved_arrays(tmp_path)
    # A member whose header declares 2**30 int32 (4 GB) followed by a few bytes: refused from the header,
    # before anything of its size is read (read_array is never called for it).
    header = io_bytes(lambda f: np.lib.format.write_array_header_1_0(
        f, {"descr": "<i4", "fortran_order": False, "shape": (2**30,)}))
    read = []
    real = np.lib.format.read_array
    monkeypatch.setattr(np.lib.format, "read_array", lambda f, **kw: read.append(f.name) or real(f, **kw))
    path = write_npz(tmp_path / "huge.npz", {k: v for k, v in arrays.items() if k != "tri_tok"},
                     {"tri_tok.npy": header + bytes(64)})
    with pytest.raises(ValueError, match=r"huge.npz is not a specdec_np n-gram model \(tri_tok's header declares "
                                         r"1073741824 entries of int32, more than such a model holds \(at most 64\)\)"):
        load(path)
    assert "tri_tok.npy" not in read and "uni_count.npy" in read


@pytest.mark.parametrize("raw, needle", [({"notes.txt": b"hello"}, "member 'notes.txt' is not a .npy array"),
                                         ({"tri_tok.npy": b"raw bytes, no header"}, "not a specdec_np n-gram model")])
def test_an_npz_member_that_is_not_npy_is_one_line(tmp_path, raw, needle):
    arrays = saved_arrays(tmp_path)
    path = write_npz(tmp_path / "odd.npz", {k: v for k, v in arrays.items() if k + ".npy" not in raw}, raw)
    with pytest.raises(ValueError, match="odd.npz") as e:
        load(path)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_model_of_no_tokens_is_refused(tmp_path):
    arrays = saved_arrays(tmp_path)
    arrays["uni_count"] = np.zeros_like(arrays["uni_count"])
    with pytest.raises(ValueError, match="uni_count is all zeros: a model fitted on no tokens"):
        load(write_npz(tmp_path / "empty.npz", arrays))
    load(write_npz(tmp_path / "kept.npz", saved_arrays(tmp_path)))  # the negative control: as written, it loads


def io_bytes(write) -> bytes:
    import io
    buf = io.BytesIO()
    write(buf)
    return buf.getvalue()


def test_the_entries_order_is_lexsorts():
    """_build orders each history's entries by (p desc, token asc) with a stable sort of complex keys where the
    tokens are ascending (as counted): the same order as np.lexsort, on ties of p too, and lexsort's own where
    they are not."""
    from specdec_np.ngram import _by_p_then_token

    rng = np.random.default_rng(0)
    unchecked_differs = False  # control: the complex keys alone, tokens not ascending, give another order
    for _ in range(300):
        of = np.sort(rng.integers(0, int(rng.integers(1, 6)), int(rng.integers(1, 45))))  # [E] history ids
        tok = np.zeros(len(of), np.int64)
        for h in np.unique(of):
            tok[of == h] = np.sort(rng.choice(50, np.count_nonzero(of == h), replace=False))
        p = rng.choice([0.1, 0.2, 0.5, 1e-300, 1.0], len(of))   # many ties
        for t in (tok, rng.permutation(tok)):
            np.testing.assert_array_equal(_by_p_then_token(of, p, t), np.lexsort((t, -p, of)))
            unchecked_differs |= not np.array_equal(np.argsort(of - 1j * p, kind="stable"), np.lexsort((t, -p, of)))
    assert unchecked_differs
