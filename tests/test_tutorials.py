"""Every tutorial runs top to bottom with the venv's python: they cannot rot. They run in a temporary
folder, so the files they write (`out/`) do not land in the repository.

Each tutorial checks its own lesson with asserts (exact distributions, equal logits, identical
trees and tokens), so a tutorial that runs to the end has passed its checks.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def test_all_lessons_present():
    assert [t.name[:2] for t in TUTORIALS] == [f"{i:02d}" for i in range(1, 10)]


@pytest.mark.parametrize("path", TUTORIALS, ids=[t.stem for t in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))  # works uninstalled too
    env.setdefault("NO_COLOR", "1")
    # On a busy machine multi-threaded OpenBLAS stalls on small blocks (threads wait for each other),
    # which only costs time: the tutorials' checks do not depend on the thread count.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr


def test_readme_images_exist_and_parse():
    """Every image the README shows is in the repository, and a hand-written SVG is well-formed XML."""
    import re
    import xml.dom.minidom

    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/loop.svg" in images  # the picture of the whole loop, in "The paper in a few lines"
    for image in images:
        assert (ROOT / image).is_file(), f"README shows {image}, which is missing"
        if image.endswith(".svg"):
            xml.dom.minidom.parse(str(ROOT / image))
