"""Cost-aware padding and the cost model, on hand-made cost curves."""

import numpy as np
import pytest

from specdec_np.fastpath import Layout
from specdec_np.tools.costmodel import (OVERHEADS, fit_overheads, interp, loop_scale, nonnegative_fit, pad_size,
                                        padding, record_ms, scaled)

# A curve like the AMD EPYC's: 4- and 8-token blocks are cheaper than the sizes just below them.
CURVE = {"1": 1.0, "2": 2.0, "3": 3.0, "4": 2.5, "5": 3.5, "6": 3.6, "7": 4.0, "8": 3.0, "16": 6.0}


def test_pad_size_picks_the_cheapest_size_at_least_as_large():
    assert [pad_size(CURVE, k) for k in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert pad_size(CURVE, 9) == 9  # interpolated 3.375 beats 16's 6.0: no padding
    assert pad_size(CURVE, 20) == 20  # past the curve: unpadded


def test_pad_size_ignores_a_larger_size_cheaper_by_noise():
    # A calibration of an AMD EPYC Zen 4 whose 5-token pass came out a noise's worth (1%) cheaper than its 4-token
    # pass; interleaved rounds on the same machine measured 5 tokens 10-30% dearer than 4 (docs/performance.md).
    noisy = {"1": 3.91, "2": 4.14, "3": 4.95, "4": 4.65, "5": 4.61, "6": 5.74, "8": 6.31}
    assert [pad_size(noisy, k) for k in range(1, 7)] == [1, 2, 4, 4, 5, 6]  # 3 -> 4: within 3% of 5's cost
    assert pad_size(noisy, 4, slack=0.0) == 5  # the rule without a margin: 4 rows computed as 5
    assert pad_size({"2": 4.18, "4": 4.12}, 2) == 2 and pad_size({"2": 4.18, "4": 3.9}, 2) == 4  # 1% vs 7% cheaper


def test_one_token_is_never_padded():
    # A busy Zen 4's curve: one token 4.84 ms, four 4.16 (16% less). Plain decoding would have run 4-row passes.
    bent = {"1": 4.84, "2": 4.38, "3": 4.72, "4": 4.16, "8": 6.13}
    assert pad_size(bent, 1) == 1 and padding(bent)[:4] == (1, 4, 4, 4)
    assert pad_size({"1": 2.0, "2": 1.0}, 1) == 1  # however much cheaper: Layout.one_row decides one row's way


def test_padding_table_without_a_curve_is_the_identity():
    assert padding(None) == () and [Layout(padding=()).rows(k) for k in (1, 5, 100)] == [1, 5, 100]
    table = padding(CURVE)  # up to 16, the largest measured size: the rows `Layout.rows` computes blocks as
    assert len(table) == 16 and [Layout(padding=table).rows(k) for k in (1, 3, 5, 7, 17)] == [1, 4, 8, 8, 17]


def record(target_cold=(), target_warm=(), draft_cold=(), draft_warm=(), steps=1, draft_dists=0, ngram_queries=0,
           tokens=1):
    """A count record (`acceptance.counts`) from lists of block sizes."""
    def hist(blocks):
        out = {}
        for k in blocks:
            out[k] = out.get(k, 0) + 1
        return out
    return {"tokens": tokens, "steps": steps, "draft_dists": draft_dists, "ngram_queries": ngram_queries,
            "target": {"cold": hist(target_cold), "warm": hist(target_warm)},
            "draft": {"cold": hist(draft_cold), "warm": hist(draft_warm)}}


COLD = {k: 2 * v for k, v in CURVE.items()}
CURVES = {"target": {"warm": CURVE, "cold": COLD}, "draft": {"warm": CURVE, "cold": COLD}}


def test_interp_extends_past_the_last_measured_size():
    assert interp(CURVE, 24) == 6.0 + 8 * (6.0 - 3.0) / 8  # the 8 -> 16 slope, continued
    assert interp(CURVE, 12) == 4.5


def test_a_cold_pass_past_the_curve_is_the_warm_one_plus_the_gap_at_its_largest_size():
    """A prompt's prefill, larger than every measured size: warm's extrapolation plus cold's gap at 16 (6.0), not
    cold's own (whose 8 -> 16 slope is twice warm's); within the curve each state's own."""
    from specdec_np.tools.costmodel import pass_ms

    assert pass_ms(CURVES, "target", "cold", 100) == pytest.approx(interp(CURVE, 100) + 6.0)
    assert pass_ms(CURVES, "target", "cold", 100) < interp(COLD, 100)  # the old price: cold's slope continued
    assert pass_ms(CURVES, "target", "warm", 100) == interp(CURVE, 100)
    assert [pass_ms(CURVES, "draft", "cold", k) for k in (3, 12, 16)] == [interp(COLD, k) for k in (3, 12, 16)]


def test_cost_model_prices_cold_and_warm_passes_padded_and_overheads():
    r = record(target_cold=[5, 3], target_warm=[1], draft_cold=[2], draft_warm=[7, 1], steps=3, draft_dists=4,
               ngram_queries=10)
    forward_ms = record_ms(r, CURVES, {})  # no overheads: the forward passes alone
    assert forward_ms == 2 * (3.5 + 3.0) + 1.0 + 2 * 2.0 + 4.0 + 1.0
    pad = padding(CURVE)  # 5 -> 8, 3 -> 4, 7 -> 8
    assert record_ms(r, CURVES, {}, target_pad=pad, draft_pad=pad) == 2 * (3.0 + 2.5) + 1.0 + 2 * 2.0 + 3.0 + 1.0
    o = {"step": 0.5, "draft_step": 0.25, "draft_dist": 0.125, "ngram_query": 0.01}
    # 3 steps, 1 of them drafting (one cold draft pass), 4 of the 2 + 7 + 1 draft rows processed
    # into distributions (the rest: stage 2's guesses, priced by the curve alone), 10 queries.
    assert record_ms(r, CURVES, o) == pytest.approx(forward_ms + 3 * 0.5 + 0.25 + 4 * 0.125 + 10 * 0.01)
    no_draft = {"target": {"warm": CURVE}}  # plain decoding's passes are all warm; a missing state uses warm
    assert record_ms(record(target_warm=[1, 1]), {**no_draft, "draft": {"warm": CURVE}}, {}) == 2.0


def timed_step(blocks, dists, queries, overheads, pad):
    """A timed step (`calibration.timed_steps`): its draft blocks, distributions, n-gram queries and the ms
    outside the target's pass, here exactly what the cost model charges for them."""
    r = record(draft_cold=list(blocks[:1]), draft_warm=list(blocks[1:]), draft_dists=dists, ngram_queries=queries)
    return list(blocks), dists, queries, record_ms(r, CURVES, overheads, draft_pad=pad)


def test_fit_overheads_recovers_known_overheads_from_steps():
    truth = {"step": 0.3, "draft_step": 0.2, "draft_dist": 0.05, "ngram_query": 0.01}
    pad = padding(CURVE)
    # Steps with stage 2's guesses compute more rows than they process (e.g. 5 + 3 rows, 3 used).
    shapes = [((), 0, 0), ((), 0, 3), ((1, 1, 1), 3, 0), ((2, 1), 2, 4), ((5, 3, 2), 3, 0), ((1,), 1, 12),
              ((7, 1), 2, 1), ((5, 3), 3, 6)]
    steps = [timed_step(blocks, dists, queries, truth, pad) for blocks, dists, queries in shapes]
    got = fit_overheads(steps, CURVES, query_ms=0.01, draft_pad=pad)
    assert set(got) == set(OVERHEADS) and all(abs(got[k] - truth[k]) < 1e-9 for k in truth), got
    # Priced without the padding the steps ran with, the draft's passes no longer account for the
    # time: the same fit comes out wrong (the check can fail).
    wrong = fit_overheads(steps, CURVES, query_ms=0.01)
    assert any(abs(wrong[k] - truth[k]) > 1e-3 for k in truth), wrong


def test_fit_overheads_ignores_steps_the_host_stopped():
    """A few steps that waited 20-90 ms for the CPU (a shared host) are left out of the fit: it recovers the overheads
    the other steps were timed with, where least squares over every step (the control) is pulled far off."""
    truth = {"step": 0.3, "draft_step": 0.2, "draft_dist": 0.05, "ngram_query": 0.01}
    pad = padding(CURVE)
    shapes = [((), 0, 0), ((), 0, 3), ((1, 1, 1), 3, 0), ((2, 1), 2, 4), ((5, 3, 2), 3, 0), ((1,), 1, 12),
              ((7, 1), 2, 1), ((5, 3), 3, 6)] * 5
    steps = [timed_step(blocks, dists, queries, truth, pad) for blocks, dists, queries in shapes]
    for i, wait in ((2, 90.0), (9, 20.0), (21, 45.0)):
        steps[i] = (*steps[i][:3], steps[i][3] + wait)
    got = fit_overheads(steps, CURVES, query_ms=0.01, draft_pad=pad)
    assert all(abs(got[k] - truth[k]) < 1e-9 for k in truth), got
    y = [ms - record_ms(record(draft_cold=list(b[:1]), draft_warm=list(b[1:]), ngram_queries=q), CURVES,
                        {"ngram_query": 0.01}, draft_pad=pad) for b, _, q, ms in steps]
    every = nonnegative_fit(np.array([[1.0, float(bool(b)), float(n)] for b, n, _, _ in steps]), np.array(y))
    assert max(abs(every - [truth["step"], truth["draft_step"], truth["draft_dist"]])) > 0.5, every


def test_fit_overheads_never_returns_a_negative_overhead():
    # Steps faster than what the curves charge: no overhead can explain them, none goes negative.
    steps = [([], 0, 0, 0.0), ([2, 1], 2, 0, 0.5), ([8], 1, 3, 0.1), ([1], 1, 0, 3.0)]
    got = fit_overheads(steps, CURVES, query_ms=0.02)
    assert set(got) == set(OVERHEADS) and all(v >= 0 for v in got.values()), got


def test_loop_scale_is_the_median_ratio_of_in_loop_passes_to_the_curve():
    curves = {"warm": CURVE, "cold": COLD}
    # In the loop, 1-token passes cost 1.5x the curve, 8-token passes 2x (one outlier), cold ones
    # compared with the cold curve; a size with fewer than 3 passes (16) says nothing.
    passes = [("warm", 1, 1.5)] * 5 + [("warm", 8, 6.0)] * 3 + [("cold", 8, 12.0)] * 2 + [("warm", 8, 60.0)] \
        + [("warm", 16, 100.0)] * 2
    scale = loop_scale(passes, curves)
    assert set(scale) == {int(k) for k in CURVE}
    assert scale[1] == 1.5 and scale[8] == 2.0 and scale[16] == 2.0  # held flat past the last seen size
    assert scale[4] == pytest.approx(1.5 + 0.5 * 3 / 7)  # interpolated between 1 and 8
    assert scaled(CURVE, scale)["8"] == 6.0 and scaled(CURVE, scale)["1"] == 1.5
    # A pass between measured sizes counts for the nearest one (7 -> 8), priced at its own size.
    assert loop_scale([("warm", 7, 8.0)] * 3, curves)[8] == 2.0
    assert loop_scale([], curves) == {int(k): 1.0 for k in CURVE}  # nothing timed: the curve as it is


def test_the_read_rate_probe_and_plain_decodings_roofline():
    """`read_gbps` is a positive, finite rate whatever the size; the roofline line divides the target's weight bytes
    by its one-token pass (never padded, though 2 tokens were measured cheaper) and says the share of the probe (or
    that no probe was measured)."""
    from specdec_np.tools.calibration import roofline
    from specdec_np.tools.costcurve import read_gbps
    assert all(0 < read_gbps(n, repeats=2) < float("inf") for n in (1, 3 << 20))

    class Target:
        weight_bytes = 70_000_000
    curves = {"target": {"warm": {"1": 3.5, "2": 3.0, "4": 7.0}}}  # JSON's keys
    line = roofline({"curves": curves, "read_gbps": 40.0}, Target())
    assert line == ("roofline: plain decoding's one-token pass reads the target's 70.0 MB of weights in 3.50 ms, "
                    "20.0 GB/s, 50% of the 40.0 GB/s NumPy reads here")
    assert roofline({"curves": curves}, Target()).endswith("20.0 GB/s (no read rate measured)")


def test_round_robin_reverses_every_other_round_so_no_pass_always_comes_first():
    """Two passes of the same work, the first of a round measured slower (as a pass just after another of the same
    work is measured faster): alternating the order gives both the same median, where one order in every round
    would have measured "a" at 2000 ms and "b" at 1000 ms."""
    from specdec_np.tools.costcurve import round_robin
    calls = []

    def timed(key):
        calls.append(key)
        return 2.0 if len(calls) % 2 == 1 else 1.0  # seconds: the first of each round of two is slower

    ms = round_robin({"a": lambda: timed("a"), "b": lambda: timed("b")}, repeats=4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]  # the warm-up round, then 4 alternating
    assert ms["a"] == ms["b"] == 1500.0
