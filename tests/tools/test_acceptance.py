"""The shipped acceptance profile (specdec_np/weights/profile.json) belongs to the shipped pair."""

from specdec_np.tools import acceptance


def test_shipped_profile_is_this_pair_and_this_format(embedded):
    """specdec_np/weights/profile.json loads with the current code and belongs to the shipped models: a new
    count format or retrained models without a new profile would make every first run measure one."""
    target, draft, trigram, _ = embedded
    shipped = acceptance.load(acceptance.PROFILE_FILE)  # raises on another format or version
    assert shipped["models"] == acceptance.pair_key(target, draft, trigram)
    for setting, records in shipped["settings"].items():
        assert {"ar", "lookup", "speculative", "staged"} <= {r["method"] for r in records}, setting
        assert all(r["tokens"] > 0 and r["steps"] > 0 for r in records)
