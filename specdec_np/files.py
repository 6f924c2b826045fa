"""Where the shipped files live (WEIGHTS_DIR: the embedded models, the n-gram, the BPE files and downloaded
checkpoints), how every file is read (`check_regular` first, or `read_regular`, `read_text`, `read_json` with a size
bound: a directory, a device, a FIFO, a dangling link or a symlink loop is named as such, never read) and written
(`atomic_files`, the one writer). Text is UTF-8 whatever the locale.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import math
import os
import re
import signal
import stat
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import numpy as np

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
    """WEIGHTS_DIR / name if there is one (any kind of file: a broken one is named when read), else SHIPPED_DIR's."""
    here = WEIGHTS_DIR / name
    return here if WEIGHTS_DIR != SHIPPED_DIR and os.path.lexists(here) else SHIPPED_DIR / name


def check_regular(path, name: str | None = None, hint: str = "") -> Path:
    """`path` if it is a regular file (through links). Else, before anything opens it: what open() would raise for
    a missing file ("a dangling symlink to X" when a link names nothing) or a directory, so each reader words them
    as it does; a ValueError for a FIFO (open() would block), a device (it may never end), a socket or a loop."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        why = f"a dangling symlink to {os.readlink(path)}" if os.path.islink(path) else os.strerror(errno.ENOENT)
        raise FileNotFoundError(errno.ENOENT, why, str(path)) from None
    except OSError as e:
        if e.errno != errno.ELOOP:  # unreadable, a name too long: the system's own error
            raise
        mode = None
    if mode is not None and stat.S_ISREG(mode):
        return path
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    kind = ("a symlink loop" if mode is None else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device")
    raise ValueError(f"{name or path} is not a regular file ({kind})" + (f": {hint}" if hint else ""))


def read_regular(path, name: str | None = None, limit: int | None = None, hint: str = "") -> bytes:
    """The bytes of the regular file `path` (`check_regular`), refused past `limit` bytes (at least 1 MB) unread."""
    path = check_regular(path, name, hint)
    with open(path, "rb") as f:
        data = f.read(-1 if limit is None else limit + 1)
    if limit is not None and len(data) > limit:
        raise ValueError(f"{name or path} is over {limit >> 20} MB, more than specdec_np reads of such a file")
    return data


def utf8(data: bytes, what: str) -> str:
    """`data` as UTF-8 text, or a ValueError naming `what` and the first byte that is not; a byte-order mark at the
    start (some Windows editors write one) is dropped: the one rule for every text specdec_np reads."""
    text = data.removeprefix(codecs.BOM_UTF8)
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start + len(data) - len(text)
        raise ValueError(f"{what} is not UTF-8 text: byte {at} is {data[at:at + 1]!r}") from None


def read_text(path, name: str | None = None, limit: int | None = None) -> str:
    """`utf8` of the regular file `path` (`read_regular`, at most `limit` bytes)."""
    return utf8(read_regular(path, name, limit), name or str(path))


# A prompt is read up to this size (GPT-2's longest context, 1024 tokens, holds at most 128 kB): a device or a
# pipe that never ends is refused before memory runs out, a long file before it is tokenized.
PROMPT_MAX_BYTES = 1 << 24
JSON_MAX_DEPTH = 32  # deeper than any file specdec_np writes: 100,000 levels would be a RecursionError
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def parse_json(text, name: str):
    """JSON `text` (str or UTF-8 bytes) of the file `name`, or a one-line ValueError naming it and the line: not
    UTF-8, not JSON, nested deeper than JSON_MAX_DEPTH, a number that is not finite (NaN, 1e999), a repeated key."""
    try:
        text = utf8(text, "the file") if isinstance(text, bytes) else text
        lines = "\n" in text.rstrip("\n")  # a line of its own is named by its reader (a JSONL file's)
        bare = np.frombuffer(_JSON_STRING.sub('""', text).encode(), np.uint8)  # [bytes] strings hold no brackets
        depth = np.cumsum(np.isin(bare, (91, 123)).astype(np.int64) - np.isin(bare, (93, 125)))  # [bytes]
        if depth.size and depth.max() > JSON_MAX_DEPTH:
            line = bare[:int(np.argmax(depth > JSON_MAX_DEPTH))].tobytes().count(b"\n") + 1
            raise ValueError(f"line {line}: " * lines + f"nested deeper than {JSON_MAX_DEPTH} levels")
        return json.loads(text, parse_constant=_finite, parse_float=_finite, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: " + f"line {e.lineno}: " * lines + f"not JSON ({e.msg})") from None
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def _finite(text):  # a JSON number, or NaN, Infinity, -Infinity
    if not math.isfinite(x := float(text)):
        raise ValueError(f"{text} is not a finite number")
    return x


def _no_repeats(pairs):
    if len(out := dict(pairs)) < len(pairs):
        raise ValueError(f"the key {Counter(k for k, _ in pairs).most_common(1)[0][0]!r} appears twice")
    return out


def read_json(path, name: str | None = None, limit: int = 1 << 26):
    """`parse_json` of the regular file `path` (`read_regular`, at most `limit` bytes)."""
    return parse_json(read_regular(path, name, limit), name or str(path))


@contextlib.contextmanager
def atomic_file(path, mode="wb"):
    """`with atomic_file(path) as f:` the one file of `atomic_files`."""
    with atomic_files([path], mode) as (f,):
        yield f


@contextlib.contextmanager
def atomic_files(paths, mode="wb"):
    """`with atomic_files([a, b], "w") as (fa, fb):` the one way specdec_np writes a file: each to a temporary file
    beside it, all renamed into place on success with Ctrl-C and SIGTERM held until the last rename: a reader never
    sees a half-written file, several change together or not at all, and a failed write (a full disk, SIGTERM)
    leaves the old ones and no temporary file. An OSError names the file it was for (the block's: the first)."""
    paths, tmps, files = [Path(p) for p in paths], [], []
    at = paths[0]
    with terminated_as_exit():
        try:
            for at in paths:
                fd, tmp = tempfile.mkstemp(dir=at.parent, prefix=at.name + ".", suffix=".tmp")
                tmps.append(tmp)
                files.append(os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8"))
            at = paths[0]
            yield files
            umask = os.umask(0)
            os.umask(umask)
            for at, f, tmp in zip(paths, files, tmps):
                f.close()
                os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
            with signals_held():
                for at, tmp in zip(paths, tmps):
                    os.replace(tmp, at)
        except OSError as e:
            if e.filename is not None and not str(e.filename).endswith(".tmp"):
                raise
            raise OSError(e.errno, e.strerror or str(e), str(at)) from None
        finally:
            for f, tmp in zip(files, tmps):  # those not renamed (a failed write) are removed
                with contextlib.suppress(OSError):
                    f.close()
                Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def signals_held():
    """While the block runs, Ctrl-C and SIGTERM are noted, not acted on; the first one that came is raised
    again when it ends, so that its own handler acts then (in the main thread: elsewhere nothing is held)."""
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if main and signal.getsignal(s) is not None]
    came = []
    before = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if came:
            signal.raise_signal(came[0])


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
