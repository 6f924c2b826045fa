"""The tools' cache: measured costs, first-use acceptance profiles and fitted trigrams, as files in the user's cache
directory, named by a hash of what they depend on, written whole. One that cannot be written is said; the run goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: nothing is locked (`try_lock`)
    fcntl = None

from ..files import atomic_file, read_json as read_checked
from .writable import check_writable


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/specdec_np, else ~/.cache/specdec_np (the XDG specification ignores a relative one)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "specdec_np"


def cache_path(kind: str, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{kind}-{digest}.json"


def read_json(path: Path):
    """The JSON in the cache file `path`, None if there is none or it is not JSON (it is measured again)."""
    try:
        return read_checked(path)
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")


def writable(path: Path) -> bool:
    """Whether the cache file `path` can be written (`check_writable`, before measuring); if not, says why."""
    try:
        check_writable(path, f"the cache file {path}", made=True)
    except ValueError as e:
        sys.stderr.write(f"note: {e}: what is measured now is used for this run only\n")
        return False
    return True


def store(path: Path, data: dict) -> bool:
    """`write_json` into the cache, and whether it was written: a failure (a full disk) is said in one line."""
    try:
        write_json(path, data)
    except OSError as e:
        sys.stderr.write(f"note: the cache file {path}: cannot write in {path.parent}: {e.strerror or e}: what is "
                         "measured now is used for this run only\n")
        return False
    return True


@contextlib.contextmanager
def locked(path: Path, wait: float, waiting=lambda: None):
    """An exclusive lock on the file `path` (`flock`: released however its holder ends) while the block runs, so that
    processes starting together measure once. Yields True if another held it first (`waiting()` called once), False
    if not (or no lock file can be made), None if it was still held after `wait` seconds."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o666)  # O_NONBLOCK: a FIFO there cannot block
    except OSError:
        fd = None
    waited, deadline = False, time.monotonic() + wait
    try:
        while fd is not None and not try_lock(fd):
            if time.monotonic() > deadline:
                waited = None
                break
            if not waited:
                waiting()
            waited = True
            time.sleep(0.1)
        yield waited
    finally:
        if fd is not None:
            os.close(fd)  # the lock goes with it


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another holds it
        return False
    except (OSError, AttributeError):  # no locks on this file system (or no fcntl: not POSIX): measure alone
        pass
    return True
