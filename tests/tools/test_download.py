"""The hub downloader against a local HTTP server on 127.0.0.1 that behaves like the hub.

Like huggingface.co, the server answers `{repo}/resolve/main/model.safetensors` with a redirect
carrying `X-Linked-Etag` (sha256) and `X-Linked-Size`, and serves the bytes from a "CDN" path
that honours Range requests with 206. It can drop the connection mid-file, ignore Range, or
serve wrong bytes. No test touches the network.
"""

import contextlib
import hashlib
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from specdec_np import checkpoint
from specdec_np.tools import download as dl
from specdec_np.gpt2 import GPT2Config, iter_params, random_params


@pytest.fixture(scope="module")
def model():
    return random_params(GPT2Config(n_vocab=29, n_ctx=8, n_embd=8, n_layer=1, n_head=2), seed=5)


@pytest.fixture(scope="module")
def files(model, tmp_path_factory):
    """The bytes of a small checkpoint of `model`: {file name: bytes}."""
    d = checkpoint.save(model, tmp_path_factory.mktemp("src"), dtype=np.float32)
    return {name: (d / name).read_bytes() for name in dl.FILES}


class Hub:
    """What the server serves and what it saw; tests change the fields."""

    def __init__(self, files, repo="openai-community/gpt2"):
        self.files = {f"/{repo}/resolve/main/{k}": v for k, v in files.items()}
        self.sha = {p: hashlib.sha256(b).hexdigest() for p, b in self.files.items()}
        self.drops = 0  # how many GETs of the weights to cut off halfway
        self.honour_range = True
        self.endless = self.announce = False  # the weights followed by bytes without end; their size in the HEAD
        self.log = []  # (method, path, Range header)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_HEAD(self):
        self.respond(body=False)

    def do_GET(self):
        self.respond(body=True)

    def respond(self, body):
        hub = self.server.hub
        hub.log.append((self.command, self.path, self.headers.get("Range")))
        if self.path.startswith("/cdn/"):
            return self.serve_blob(hub, self.path.removeprefix("/cdn"), body)
        if self.path not in hub.files:
            return self.send_error(404)
        if self.path.endswith(".safetensors"):  # an LFS file: a redirect carrying its sha256 and size
            self.send_response(302)
            self.send_header("Location", "/cdn" + self.path)
            self.send_header("X-Linked-Etag", f'"{hub.sha[self.path]}"')
            if hub.announce or not hub.endless:
                self.send_header("X-Linked-Size", str(len(hub.files[self.path])))
            self.send_header("Content-Length", "0")
            return self.end_headers()
        data = hub.files[self.path]  # a small git file: its ETag is a 40-digit git hash
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def serve_blob(self, hub, path, body):
        data = hub.files[path]
        if hub.endless:  # no Content-Length, and more bytes until the client hangs up (64 MB at most)
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(data)
                for _ in range(64):
                    self.wfile.write(bytes(1 << 20))
            return
        rng = self.headers.get("Range")
        start = int(rng.removeprefix("bytes=").removesuffix("-")) if rng and hub.honour_range else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if not body:
            return
        if hub.drops and self.command == "GET":
            hub.drops -= 1
            self.wfile.write(data[start:start + (len(data) - start) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # drop the connection mid-file
            return
        self.wfile.write(data[start:])


@pytest.fixture
def hub(files):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.hub = Hub(files)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    server.hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield server.hub
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def get(tmp_path, hub, **kw):
    return dl.download("gpt2", dest_root=tmp_path, base_url=hub.url, timeout=5, progress=False, **kw)


def blob_gets(hub):
    return [(p, r) for m, p, r in hub.log if m == "GET" and p.startswith("/cdn/")]


def test_full_download(tmp_path, hub, files, model):
    dest = get(tmp_path, hub)
    assert dest == tmp_path / "gpt2"
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]
    for name, data in files.items():
        assert (dest / name).read_bytes() == data
    loaded = checkpoint.load(dest)
    for a, b in zip(iter_params(loaded.params), iter_params(model.params), strict=True):
        np.testing.assert_array_equal(a, b)
    assert blob_gets(hub) == [("/cdn/openai-community/gpt2/resolve/main/model.safetensors", None)]
    get(tmp_path, hub)  # already there: nothing fetched again
    assert len(blob_gets(hub)) == 1


def test_base_url_from_environment(tmp_path, hub, files, monkeypatch):
    hub.files = {p.replace("openai-community/gpt2", "distilbert/distilgpt2"): b for p, b in hub.files.items()}
    hub.sha = {p.replace("openai-community/gpt2", "distilbert/distilgpt2"): s for p, s in hub.sha.items()}
    monkeypatch.setenv("SPECDEC_NP_HUB_URL", hub.url)
    dest = dl.download("distilgpt2", dest_root=tmp_path, timeout=5, progress=False)
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_sha256_mismatch_writes_nothing(tmp_path, hub):
    path = "/openai-community/gpt2/resolve/main/model.safetensors"
    hub.sha[path] = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(dl.DownloadError, match=r"model\.safetensors: sha256 mismatch"):
        get(tmp_path, hub)
    assert not (tmp_path / "gpt2" / "model.safetensors").exists()
    assert not (tmp_path / "gpt2" / "model.safetensors.part").exists()


def test_interrupted_transfer_resumes_with_range(tmp_path, hub, files):
    hub.drops = 1
    dest = get(tmp_path, hub)
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]
    half = len(files["model.safetensors"]) // 2
    assert [r for _, r in blob_gets(hub)] == [None, f"bytes={half}-"]  # resumed where it stopped


def test_interrupted_transfer_resumes_on_next_run(tmp_path, hub, files):
    hub.drops = 1
    with pytest.raises(dl.DownloadError, match=r"incomplete after 1 attempts.*run again to resume"):
        get(tmp_path, hub, retries=0)
    part = tmp_path / "gpt2" / "model.safetensors.part"
    n = len(files["model.safetensors"]) // 2
    assert part.stat().st_size == n and not (tmp_path / "gpt2" / "model.safetensors").exists()
    dest = get(tmp_path, hub, retries=0)
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert blob_gets(hub)[-1][1] == f"bytes={n}-" and not part.exists()


def test_connection_that_always_drops_gives_up(tmp_path, hub):
    hub.drops = 100
    with pytest.raises(dl.DownloadError, match="incomplete after 3 attempts"):
        get(tmp_path, hub, retries=2)
    assert len(blob_gets(hub)) == 3  # bounded
    assert not (tmp_path / "gpt2" / "model.safetensors").exists()


def test_server_ignoring_range_restarts_from_zero(tmp_path, hub, files):
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "model.safetensors.part").write_bytes(b"x" * 100)  # a stale partial file
    hub.honour_range = False
    dest = get(tmp_path, hub, retries=0)  # in one attempt, not via a retry
    assert blob_gets(hub)[0][1] == "bytes=100-"  # asked to resume, got a 200: started over
    assert (dest / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_truncated_file_detected(tmp_path, hub, files):
    """A file that arrives whole as served but is cut short (no sha256 reported) fails its header check."""
    path = "/openai-community/gpt2/resolve/main/model.safetensors"
    hub.files[path] = files["model.safetensors"][:-100]
    hub.sha[path] = "not-a-sha256"
    with pytest.raises(dl.DownloadError, match=r"not valid: .*truncated or corrupt file: tensor '[\w.]+'"):
        get(tmp_path, hub)
    assert sorted(p.name for p in (tmp_path / "gpt2").iterdir()) == ["config.json"]


def test_http_errors_and_unknown_names(tmp_path, hub, capsys):
    with pytest.raises(dl.DownloadError, match=r"gpt2-medium/resolve/main/config\.json: HTTP 404"):
        dl.download("gpt2-medium", dest_root=tmp_path, base_url=hub.url, timeout=5, progress=False)
    with pytest.raises(ValueError, match="unknown model 'gpt5'.*distilgpt2"):
        dl.download("gpt5", dest_root=tmp_path, base_url=hub.url)
    capsys.readouterr()
    # Named before any download, in one line: the valid name before it is not fetched either.
    assert dl.main(["gpt2", "gpt5", "--dest", str(tmp_path), "--base-url", hub.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'gpt5'" in err[0] and "distilgpt2" in err[0]
    assert not (tmp_path / "gpt2").exists()
    assert dl.main(["gpt2", "--retries", "-1", "--dest", str(tmp_path), "--base-url", hub.url]) == 2
    assert "--retries must be >= 0" in capsys.readouterr().err


def test_main(tmp_path, hub, files, capsys):
    assert dl.main(["gpt2", "--dest", str(tmp_path), "--base-url", hub.url]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == str(tmp_path / "gpt2")
    assert "gpt2/model.safetensors" in out.err  # one closing line per file when not a terminal
    assert json.loads((tmp_path / "gpt2" / "config.json").read_bytes()) == json.loads(files["config.json"])


def test_an_offline_download_leaves_no_directory_it_made(tmp_path, capsys):
    # Nothing listens on port 9 (discard): the download fails at once, and --dest NEW/deeper is gone again.
    rc = dl.main(["gpt2", "--dest", str(tmp_path / "NEW" / "deeper"), "--base-url", "http://127.0.0.1:9",
                  "--retries", "0"])
    assert rc == 1 and "gpt2" in capsys.readouterr().err
    assert not (tmp_path / "NEW").exists()


def test_a_config_and_model_that_do_not_match_are_deleted_and_said(tmp_path, hub, files):
    # A hub serving a config.json of another model: each file is valid, together they are not a checkpoint.
    other = json.loads(files[dl.CONFIG_FILE])
    other["n_layer"] = 2
    hub.files["/openai-community/gpt2/resolve/main/config.json"] = json.dumps(other).encode()
    with pytest.raises(dl.DownloadError, match=r"n_layer=2.*both deleted, run again"):
        get(tmp_path, hub)
    assert not any((tmp_path / "gpt2").iterdir())
    hub.files["/openai-community/gpt2/resolve/main/config.json"] = files[dl.CONFIG_FILE]
    assert (get(tmp_path, hub) / dl.MODEL_FILE).is_file()  # the next run downloads both again


def test_a_dest_under_a_regular_file_is_named_before_any_download(tmp_path, hub, capsys):
    (tmp_path / "FILE").write_text("x")
    assert dl.main(["gpt2", "--dest", str(tmp_path / "FILE" / "sub"), "--base-url", hub.url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --dest {tmp_path / 'FILE' / 'sub'}: {tmp_path / 'FILE'} is a file"]
    assert hub.log == []


@pytest.mark.parametrize("announce", [True, False])
def test_a_server_that_sends_bytes_without_end_fills_no_disk(tmp_path, hub, files, monkeypatch, announce):
    hub.endless, hub.announce = True, announce
    monkeypatch.setattr(dl, "most_bytes", lambda name, file: 1 << 20)  # the ceiling when no size is announced
    if announce:  # the announced size is read, no more: the file is whole
        assert (get(tmp_path, hub) / dl.MODEL_FILE).read_bytes() == files[dl.MODEL_FILE]
        return
    with pytest.raises(dl.DownloadError, match=r"model\.safetensors: no size announced, and more than 1048576 bytes, "
                                               r"more than this file can be: stopped \(partial file deleted\)"):
        get(tmp_path, hub)
    assert [p.name for p in (tmp_path / "gpt2").iterdir()] == [dl.CONFIG_FILE]  # no part file left


def test_the_ceiling_of_a_model_file_holds_the_hubs_own():
    # The hub's model.safetensors sizes as it lists them, rounded up (float32, with old attention buffers).
    hub_sizes = {"distilgpt2": 353e6, "gpt2": 548e6, "gpt2-medium": 1.52e9, "gpt2-large": 3.25e9, "gpt2-xl": 6.43e9}
    for name, size in hub_sizes.items():
        assert size < dl.most_bytes(name, dl.MODEL_FILE) < 2.5 * size
    assert len(json.dumps(checkpoint.hf_config(checkpoint.GPT2Config()))) < dl.most_bytes("gpt2", dl.CONFIG_FILE)


@pytest.mark.parametrize("dest, needle", [
    ("/proc/x", "error: --dest /proc/x: cannot write in /proc: "),  # was a bare [Errno 2]
    ("/proc", "error: gpt2: cannot make the directory /proc/gpt2: "),
    ("a" * 6000, f"error: --dest {'a' * 60}... (6000 characters): cannot write there: File name too long"),
], ids=["in /proc", "/proc", "6000 characters"])
def test_a_dest_where_nothing_can_be_made_is_named(capsys, dest, needle):
    if dest.startswith("/proc") and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc")
    assert dl.main(["gpt2", "--dest", dest, "--base-url", "http://127.0.0.1:9", "--retries", "0"]) in (1, 2)
    assert capsys.readouterr().err.startswith(needle)


def test_an_announced_size_over_the_ceiling_is_refused_unread(tmp_path, hub, files, monkeypatch):
    # Issue 58: a server announcing 10 TB was believed. The file's real size, over a ceiling of 1000 bytes.
    monkeypatch.setattr(dl, "most_bytes", lambda name, file: 1000 if file == dl.MODEL_FILE else 1 << 20)
    size = len(files[dl.MODEL_FILE])
    with pytest.raises(dl.DownloadError, match=rf"model\.safetensors: the server announces {size} bytes, more than "
                                               r"this file can be \(at most 1000, twice its float32 parameters\)"):
        get(tmp_path, hub)
    assert blob_gets(hub) == [] and [p.name for p in (tmp_path / "gpt2").iterdir()] == [dl.CONFIG_FILE]
    monkeypatch.setattr(dl, "most_bytes", lambda name, file: size)  # the negative control: a ceiling it fits
    assert (get(tmp_path, hub) / dl.MODEL_FILE).read_bytes() == files[dl.MODEL_FILE]
