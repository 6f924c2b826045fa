import pytest

from specdec_np.tools import machine


@pytest.fixture(autouse=True)
def quiet_load_check(monkeypatch):
    """The load check made before measuring reports a quiet machine, whatever else runs now; a test of
    a busy machine substitutes its own."""
    monkeypatch.setattr(machine, "load", lambda: 0.0)
