"""Where the shipped files live, how files are written, and which can be read (`check_regular`).

WEIGHTS_DIR: the directory of the embedded models, the n-gram, the tokenizer's BPE files and downloaded
checkpoints (the package data `specdec_np/weights/`, SHIPPED_DIR, unless SPECDEC_NP_WEIGHTS names another); every
module reads it from here. The embedded pair's acceptance profile and calibration prompts are read from
WEIGHTS_DIR when it holds them, else from SHIPPED_DIR (`weights_file`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

WEIGHTS_ENV = "SPECDEC_NP_WEIGHTS"
SHIPPED_DIR = Path(__file__).resolve().parent / "weights"  # package data: there in the clone and in any install
WEIGHTS_DIR = Path(os.environ[WEIGHTS_ENV]) if WEIGHTS_ENV in os.environ else SHIPPED_DIR


def check_weights_dir(directory: Path) -> Path:
    """`directory` (WEIGHTS_DIR), or a FileNotFoundError naming SPECDEC_NP_WEIGHTS when that variable
    is set but empty or not a directory: a lookup by name there would otherwise blame the name."""
    value = os.environ.get(WEIGHTS_ENV)
    if value is not None and not (value and Path(directory).is_dir()):
        problem = "is empty" if not value else "is a file" if Path(value).exists() else "does not exist"
        raise FileNotFoundError(f"{WEIGHTS_ENV}={value!r} {problem}: it must name the weights directory "
                                f"(unset it to use {SHIPPED_DIR})")
    return Path(directory)


def weights_file(name: str) -> Path:
    """WEIGHTS_DIR / name if there is one, else the shipped SHIPPED_DIR / name."""
    here = WEIGHTS_DIR / name
    return here if WEIGHTS_DIR != SHIPPED_DIR and here.is_file() else SHIPPED_DIR / name


def check_regular(path, name: str, hint: str = "") -> None:
    """Before reading `path`: a ValueError `name is not a regular file ...` if it is a FIFO, a device or a
    socket (a FIFO blocks open(), a device may never end); a missing file or a directory is left to the
    reader, whose own error names it."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        raise ValueError(f"{name} is not a regular file (a FIFO, a device or a socket)" + (f": {hint}" if hint else ""))


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """`with atomic_file(path) as f:` writes a temporary file beside `path`, renamed on success: a reader
    never sees a half-written file, a failed write (or SIGTERM) leaves the old one in place."""
    path = Path(path)
    with terminated_as_exit():
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


@contextlib.contextmanager
def terminated_as_exit():
    """While the block runs, SIGTERM raises SystemExit(143) in the main thread (when nothing else handles
    it), so that cleanup clauses run as they do for Ctrl-C rather than leave a temporary file behind."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # sys.exit raises SystemExit
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
