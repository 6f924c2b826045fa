"""`python -m specdec_np weights gpt2 distilgpt2`: real GPT-2 checkpoints from the Hugging Face hub into
`specdec_np/weights/NAME/`. Each file streams into `FILE.part`, resumed with an HTTP Range request; only a file whose
sha256 matches what the hub reports (an LFS file's `X-Linked-Etag`) and whose content parses gets its final name.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .. import checkpoint
from ..checkpoint import CONFIG_FILE, HUB_REPOS, MODEL_FILE
from ..files import WEIGHTS_DIR
from ..gpt2 import GPT2_SHAPES
from .options import at_least, shown
from .progress import Progress
from .writable import check_writable

HUB_URL = "https://huggingface.co"
FILES = (CONFIG_FILE, MODEL_FILE)
CHUNK = 1 << 20
SHA256_RE = re.compile(r"[0-9a-f]{64}")
CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
HEADERS = {"User-Agent": "specdec_np-download/0.1"}


class DownloadError(RuntimeError):
    """A download that failed: the message names the URL and what went wrong."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Let 3xx answers through as HTTPError: the hub puts an LFS file's sha256 on its redirect."""
    def redirect_request(self, *args, **kwargs):
        return None


def file_info(url: str, timeout: float) -> tuple[str | None, int | None]:
    """(sha256, size) the hub reports for a file (None if none): HEADs that stop at each redirect, whose `X-Linked-Etag`
    (an LFS file's sha256) and `X-Linked-Size` they read; a git hash ETag is not a sha256."""
    opener = urllib.request.build_opener(_NoRedirect)
    sha = size = None
    for _ in range(5):  # a few redirects at most
        try:
            with opener.open(urllib.request.Request(url, method="HEAD", headers=HEADERS), timeout=timeout) as resp:
                status, headers = resp.status, resp.headers
        except urllib.error.HTTPError as e:
            status, headers = e.code, e.headers
            if status not in (301, 302, 303, 307, 308):
                raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
        except OSError as e:
            raise DownloadError(f"{url}: {e}") from None
        etag = (headers.get("X-Linked-Etag") or headers.get("ETag") or "").removeprefix("W/").strip('"').lower()
        sha = sha or (etag if SHA256_RE.fullmatch(etag) else None)  # the first reported is the file's
        length = headers.get("X-Linked-Size") or (headers.get("Content-Length") if status == 200 else None)
        size = size or (int(length) if length and length.isdigit() else None)
        if status == 200:
            return sha, size
        url = urllib.parse.urljoin(url, headers.get("Location", ""))
    raise DownloadError(f"{url}: too many redirects")


def most_bytes(name: str, file: str) -> int:
    """The most bytes `file` of checkpoint `name` may have: a model file, less than twice its float32 parameters."""
    return 2 * 4 * GPT2_SHAPES[name].n_params if file == MODEL_FILE else 1 << 20


def fetch_once(url: str, part: Path, total: int | None, timeout: float, show, most: int) -> tuple[int, int | None]:
    """Append what is missing of `url` to `part` (Range: bytes=N-; a 200 answer ignored it: start over), up to its
    size, or `most` bytes when none is announced (a size over `most` is refused unread) -> (bytes in part, total)."""
    check_size(url, total, most)
    offset = part.stat().st_size if part.exists() else 0
    if total is not None and offset >= total:
        if offset == total:
            return offset, total
        part.unlink()  # longer than the file: not a prefix of it
        offset = 0
    headers = HEADERS | ({"Range": f"bytes={offset}-"} if offset else {})
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416:  # range not satisfiable: our .part is not a prefix of this file
            part.unlink()
            return 0, total
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    with resp:
        if resp.status == 206:
            m = CONTENT_RANGE_RE.fullmatch(resp.headers.get("Content-Range", ""))
            if not m or int(m[1]) != offset:
                raise DownloadError(f"{url}: asked for bytes {offset}- and got Content-Range "
                                    f"{resp.headers.get('Content-Range')!r}")
            total = int(m[3]) if m[3] != "*" else total
        else:
            length = resp.headers.get("Content-Length")
            total, offset = int(length) if length and length.isdigit() else total, 0
        check_size(url, total, most)
        end = most if total is None else total  # never more: a server that sends on for ever fills no disk
        with open(part, "ab" if offset else "wb") as f:
            while offset < end and (chunk := resp.read(min(CHUNK, end - offset))):
                f.write(chunk)
                offset += len(chunk)
                show(offset, total)
        if total is None and offset == most and resp.read(1):
            part.unlink()
            raise DownloadError(f"{url}: no size announced, and more than {most} bytes, more than this file can be: "
                                "stopped (partial file deleted)")
    return offset, total


def check_size(url: str, total: int | None, most: int) -> None:
    if total is not None and total > most:  # e.g. 10 TB announced for a model of 500 MB
        raise DownloadError(f"{url}: the server announces {total} bytes, more than this file can be (at most "
                            f"{most}, twice its float32 parameters): not downloaded")


def download_file(url: str, dest: Path, most: int, retries: int = 3, timeout: float = 60.0,
                  progress: bool | None = None) -> None:
    """Download `url` to `dest` via `dest.part` (at most `most` bytes): resumed, size and sha256 checked, renamed."""
    sha, size = file_info(url, timeout)
    part = dest.with_name(dest.name + ".part")
    show = Progress(f"{dest.parent.name}/{dest.name}", tty=progress,
                    unit=lambda n: f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB")
    error = None
    for _ in range(retries + 1):
        try:
            got, total = fetch_once(url, part, size, timeout, show, most)
        except (OSError, http.client.HTTPException) as e:  # a dropped or timed-out connection: resume
            error = f"{type(e).__name__}: {e}"
            continue
        if total is None or got == total:
            break
        error = f"connection closed at byte {got} of {total}"
    else:
        raise DownloadError(f"{url}: incomplete after {retries + 1} attempts ({error}); "
                            f"{part} is kept, run again to resume")
    show.end()
    if size is not None and got != size:
        part.unlink()
        raise DownloadError(f"{url}: got {got} bytes, the hub reports {size}")
    digest = hashlib.sha256()
    with open(part, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    if sha is not None and digest.hexdigest() != sha:
        part.unlink()
        raise DownloadError(f"{url}: sha256 mismatch: got {digest.hexdigest()}, the hub reports {sha} "
                            "(partial file deleted)")
    try:  # a safetensors header (every tensor inside the file) or a config that parses
        (checkpoint.read_header if dest.suffix == ".safetensors" else checkpoint.read_config)(part)
    except (ValueError, FileNotFoundError) as e:
        part.unlink()
        raise DownloadError(f"{url}: the downloaded file is not valid: {e}") from None
    os.replace(part, dest)


def download(name: str, dest_root=None, base_url: str | None = None, retries: int = 3,
             timeout: float = 60.0, progress: bool | None = None) -> Path:
    """Download checkpoint `name` into `dest_root/name/` (files already complete kept), checked against its config."""
    if name not in HUB_REPOS:
        raise ValueError(f"unknown model '{name}': known names are {', '.join(HUB_REPOS)}")
    base_url = (base_url or os.environ.get("SPECDEC_NP_HUB_URL") or HUB_URL).rstrip("/")
    dest = Path(WEIGHTS_DIR if dest_root is None else dest_root) / name
    created = [d for d in (dest, *dest.parents) if not d.exists()]  # made here: removed again if left empty
    try:
        try:
            dest.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DownloadError(f"cannot make the directory {dest}: {e.strerror or e}") from None
        for file in FILES:
            if not (dest / file).is_file():
                download_file(f"{base_url}/{HUB_REPOS[name]}/resolve/main/{file}", dest / file,
                              most_bytes(name, file), retries, timeout, progress)
    except BaseException:
        for d in created:  # nothing fetched: leave no empty directory behind (dest first, then its parents)
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
    try:
        header, _ = checkpoint.read_header(dest / MODEL_FILE)
        checkpoint.match_tensors(dest / MODEL_FILE, header, checkpoint.read_config(dest / CONFIG_FILE))
    except ValueError as e:  # each file valid, but not of one model: keeping them would stop every later download
        for file in FILES:
            (dest / file).unlink(missing_ok=True)
        raise DownloadError(f"{e}; the hub's {CONFIG_FILE} and {MODEL_FILE} do not belong together: both deleted, "
                            "run again to download them again") from None
    return dest


def main(argv: list[str] | None = None) -> int:
    """`python -m specdec_np weights NAME [NAME...]`: argv is what follows `weights`."""
    ap = argparse.ArgumentParser(prog="python -m specdec_np weights",
                                 description="Download real GPT-2 checkpoints from the Hugging Face hub.")
    ap.add_argument("names", nargs="+", metavar="NAME", help=", ".join(HUB_REPOS))
    ap.add_argument("--dest", default=None, help=f"root directory (default {WEIGHTS_DIR})")
    ap.add_argument("--base-url", default=None, help=f"hub URL (default $SPECDEC_NP_HUB_URL or {HUB_URL})")
    ap.add_argument("--retries", type=int, default=3, help="resumed attempts after a dropped connection")
    args = ap.parse_args(argv)
    unknown = ", ".join(repr(name) for name in args.names if name not in HUB_REPOS)
    dest = str(args.dest or WEIGHTS_DIR)
    try:  # before any download: a typo should not cost the models named before it
        if unknown:
            raise ValueError(f"unknown model {unknown}: known names are {', '.join(HUB_REPOS)}")
        at_least(0, retries=args.retries)
        if not os.path.isdir(dest):  # its directories are to be made: in the nearest one that exists
            check_writable(Path(dest, args.names[0]), f"--dest {shown(dest)}", made=True)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = []
    for name in args.names:  # every model is tried, whatever happened to the ones before
        try:
            print(download(name, args.dest, args.base_url, retries=args.retries))
        except (DownloadError, ValueError, OSError) as e:
            print(f"error: {name}: {e}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(f"error: not fetched: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
