"""The tools' cache: measured costs, first-use acceptance profiles and fitted trigrams, as files in
the user's cache directory, named by a hash of everything they depend on (a key), never in the
repository (which may be read-only). Written whole: a temporary file renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..files import atomic_file


def cache_dir() -> Path:
    """The user's cache directory for specdec_np (XDG_CACHE_HOME, else ~/.cache): never the repository."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec_np"


def cache_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{kind}-{digest}.json"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
