"""Where the shipped files live, and how files are written.

WEIGHTS_DIR: the directory of the embedded models, the n-gram, the tokenizer's BPE files and
downloaded checkpoints (`weights/` beside the package; the environment variable
SPECDEC_NP_WEIGHTS names another). Every module reads it from here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

WEIGHTS_DIR = Path(os.environ.get("SPECDEC_NP_WEIGHTS", Path(__file__).resolve().parent.parent / "weights"))


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """`with atomic_file(path) as f:` writes a temporary file beside `path`, renamed on success, so
    a reader never sees a half-written file and a failed write leaves the old one in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
