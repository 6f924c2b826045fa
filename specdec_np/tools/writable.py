"""The one probe of where the tools write (--out, bench's results, the cache, `weights --dest`), made before any
work: what cannot be written is a one-line error naming it, not a traceback after the run."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from ..files import check_regular


def check_writable(path, name: str, made: bool = False, example: str = "") -> Path:
    """The file to write at `path`: new, or a writable regular file (a symlink written through), in a directory that
    takes a temporary file (with `made`: the nearest existing one). Anything else: ValueError `name: why`."""
    if not str(path).strip():
        raise ValueError(f"{name.strip()} is empty: give a file name")
    if str(path) == "-":
        raise ValueError(f"{name}: give a file name (it writes a file, not standard output)"
                         + (f", e.g. {example}" if example else ""))
    given, folder = Path(path), None
    try:
        path = Path(os.path.realpath(given)) if given.is_symlink() else given  # a loop stays a link
        if os.path.lexists(path):  # a FIFO, a device, a socket or a loop named (`check_regular`)
            try:
                check_regular(path, name, "give a file to write")
            except IsADirectoryError:
                raise ValueError(f"{name} is a directory" + (f": give the file to write, e.g. {given / example}"
                                                             if example else "")) from None
        if path.is_file() and not path.stat().st_mode & stat.S_IWUSR:
            raise ValueError(f"{name} is read-only: make it writable to replace it, or give another file")
        folder = next(p for p in path.absolute().parents if p.exists()) if made else path.parent
        if not folder.is_dir():
            raise ValueError(f"{name}: " + (f"{folder} is a file" if folder.exists() else
                                             f"the directory {folder} does not exist"))
        tempfile.TemporaryFile(dir=folder).close()  # tried: os.access says yes to root on a read-only mount
    except OSError as e:  # e.g. a read-only or full file system, a name too long for it
        raise ValueError(f"{name}: cannot write {f'in {folder}' if folder else 'there'}: {e.strerror or e}") from None
    return path
