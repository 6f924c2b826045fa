"""Cost-aware padding and the cost model, on hand-made cost curves."""

from types import SimpleNamespace

from specdec_np.tuning import block_ms, pad_size, padding, predicted_ms

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


def test_cost_model_charges_padded_blocks():
    stats = SimpleNamespace(target_blocks=[1, 5, 3], draft_blocks=[2, 7])
    curves = {"target": CURVE, "draft": CURVE}
    assert predicted_ms(stats, curves) == (1.0 + 3.0 + 2.5) + (2.0 + 3.0)
