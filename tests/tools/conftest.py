import pytest

from helpers import build_wheel
from specdec_np.tools import calibration, machine


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The package's wheel, built once per session (test_install and test_trace read it)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(autouse=True)
def quiet_load_check(monkeypatch):
    """The load check made before measuring reports a quiet machine, whatever else runs now; a test of
    a busy machine substitutes its own. Each test starts as a new process would: nothing measured yet."""
    monkeypatch.setattr(machine, "load", lambda: 0.0)
    monkeypatch.setattr(calibration, "MEASURED", {})
