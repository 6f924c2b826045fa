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


def test_the_shipped_profile_is_read_once_until_it_changes(tmp_path, monkeypatch):
    """shipped() reads an unchanged file once per process (the tools ask for it several times a run), and reads it
    again once it changes (control: the new content comes back, not the remembered one)."""
    import json
    import os

    path = tmp_path / "profile.json"
    data = json.loads(acceptance.PROFILE_FILE.read_text())
    path.write_text(json.dumps(data))
    monkeypatch.setattr(acceptance, "PROFILE_FILE", path)
    first = acceptance.shipped()
    assert acceptance.shipped() is first
    data["models"] = "another pair"
    path.write_text(json.dumps(data))
    os.utime(path, ns=(1, 1))  # a new mtime even on a coarse clock
    again = acceptance.shipped()
    assert again is not first and again["models"] == "another pair"
