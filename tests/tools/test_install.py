"""The package installed from its wheel, away from the clone: the embedded models, trigram, BPE files,
profile and calibration prompts ship as package data, so `generate`, the demo, `load_embedded()` and the
`specdec-np` console script work from any directory.

Built offline from a copy of the sources (the session's `wheel` fixture, tests/tools/conftest.py), installed with
`pip install --target` into a temporary directory and run from another one with only that directory on
PYTHONPATH; the checkout gets no build directory."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import SHIPPED, not_shipped
from specdec_np.files import WEIGHTS_ENV

ROOT = Path(__file__).resolve().parents[2]


def pip(*args):
    r = subprocess.run([sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "-q",
                        "--disable-pip-version-check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel):
    """(the wheel, the directory it is installed in, an empty directory to run from, their environment)."""
    tmp = tmp_path_factory.mktemp("install")
    pip("install", "--target", str(tmp / "site"), str(wheel))
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (WEIGHTS_ENV, "PYTHONPATH")}
    env["PYTHONPATH"] = str(tmp / "site")
    return wheel, tmp / "site", elsewhere, env


def run(installed, *argv, timeout=120):
    _, _, elsewhere, env = installed
    return subprocess.run(argv, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_holds_every_shipped_file(installed):
    """Every file of specdec_np/weights/ (but downloaded checkpoints) is in the wheel, byte for byte."""
    wheel = installed[0]
    shipped = [p for p in SHIPPED.rglob("*") if p.is_file() and not not_shipped(p.parent, [p.name])
               and not not_shipped(SHIPPED, [p.relative_to(SHIPPED).parts[0]])]
    assert {"model.safetensors", "tiny-trigram.npz", "vocab.bpe", "profile.json"} <= {p.name for p in shipped}
    modules = [p for p in (ROOT / "specdec_np").rglob("*.py") if "__pycache__" not in p.parts]
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert {p.relative_to(ROOT).as_posix() for p in modules} <= names  # every module, gpt2.py included
        assert any(n.endswith(".dist-info/THIRD_PARTY_NOTICES.md") for n in names)  # the BPE files' licence
        for p in shipped:
            name = "specdec_np/weights/" + p.relative_to(SHIPPED).as_posix()
            assert name in names, name
            if p.stat().st_size < 4 * 2 ** 20:  # the small ones compared whole
                assert z.read(name) == p.read_bytes(), name


def test_the_installed_package_runs_from_another_directory(installed):
    """From an empty directory, with only the install on the path: the package is the installed one,
    `load_embedded()` finds its files there, a short demo (every method) runs; `generate`: below."""
    _, site, _, _ = installed
    r = run(installed, sys.executable, "-c", "import sys, specdec_np, specdec_np.files as f, specdec_np.models as m\n"
            "t, d, g, e = m.load_embedded()\nprint(specdec_np.__file__, f.SHIPPED_DIR, t.config.n_vocab, sep='\\n')\n"
            "print(sorted(x.__file__ for n, x in sys.modules.items() if n.startswith('specdec_np')))")
    assert r.returncode == 0, r.stderr
    module, shipped, n_vocab, modules = r.stdout.split("\n")[:4]
    assert Path(module).is_relative_to(site) and Path(shipped) == site / "specdec_np" / "weights"
    assert n_vocab == "8193" and all(Path(m).is_relative_to(site) for m in eval(modules))  # none from the clone
    r = run(installed, sys.executable, "-m", "specdec_np", "demo", "--plan", "default", "--max-new-tokens", "4",
            "--no-sampled")
    assert r.returncode == 0 and "count_words" in r.stdout, r.stderr


def test_the_console_script_runs(installed):
    """`specdec-np generate`, the console script pyproject.toml declares (specdec_np.__main__:main), from another
    directory."""
    _, site, _, _ = installed
    script = site / "bin" / "specdec-np"
    assert script.is_file()
    r = run(installed, sys.executable, str(script), "generate", "def f(x):", "--method", "staged", "--plan",
            "default", "--max-new-tokens", "3")
    assert r.returncode == 0 and r.stdout.startswith("def f(x):"), r.stderr
