"""Cost-aware padding and the cost model, on hand-made cost curves."""

from types import SimpleNamespace

from specdec_np.drafting import padded
from specdec_np.tools.costmodel import (block_ms, draft_ms, fit_overheads, interp, pad_size, padding, predicted_ms,
                                        size_class, target_ms)

# A curve like this machine's: 4- and 8-token blocks are cheaper than the sizes just below them.
CURVE = {"1": 1.0, "2": 2.0, "3": 3.0, "4": 2.5, "5": 3.5, "6": 3.6, "7": 4.0, "8": 3.0, "16": 6.0}


def test_pad_size_picks_the_cheapest_size_at_least_as_large():
    assert [pad_size(CURVE, k) for k in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert pad_size(CURVE, 9) == 9  # interpolated 3.375 beats 16's 6.0: no padding
    assert pad_size(CURVE, 20) == 20  # past the curve: unpadded
    assert block_ms(CURVE, 5) == 3.0 and block_ms(CURVE, 1) == 1.0


def test_padding_table_without_a_curve_is_the_identity():
    assert padding(None) == () and [padded((), k) for k in (1, 5, 100)] == [1, 5, 100]
    table = padding(CURVE, limit=16)
    assert len(table) == 16 and [padded(table, k) for k in (1, 3, 5, 7, 17)] == [1, 4, 8, 8, 17]


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
