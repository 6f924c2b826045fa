"""How grade.py runs a learner's exercise: in a process of its own, its answers judged by the grader.

What it gives:

- The verdict is the grader's own. A worker process (grade.py --worker) imports the learner's file and
  answers calls: the grader sends each call's arguments over a pipe, the worker runs the learner's
  function and sends back what it returned (or the exception it raised), and the grader compares that
  with its reference (checks.py). Nothing the worker sends can say "correct": a reply is a return value,
  which the grader judges, or a failure, which can only make the exercise wrong. Replies are JSON with
  numeric arrays, decoded and checked, never unpickled; the only methods of the grader's objects the
  worker can call are rand's `coin` and `draw`.
- The worker runs in a scratch folder outside the clone (a temporary folder, removed afterwards), in a
  session of its own (Ctrl-C reaches only the grader), stdin from /dev/null, its output kept as a
  bounded tail (the last 4 KB), each file it writes at most 64 MB (RLIMIT_FSIZE), no core files.
- After every verdict (correct, wrong, a time limit, Ctrl-C) the worker's whole process group is
  killed (SIGKILL) and reaped: processes it started do not outlive its grading.
- A signal the graded code sends the grader (SIGTERM, SIGINT, SIGHUP, SIGUSR1/2, SIGALRM, SIGQUIT from
  the worker or its group) is caught and named, the exercise counted wrong; the grader carries on.
- The clone's files (but .git, .venv and caches) are listed before and after each exercise: files
  created, changed or deleted meanwhile are named under its verdict (named, not judged: another
  program, an editor saving, may have changed them).

What it does not give: a sandbox. The learner's code runs with the learner's rights: it can read and
write any file the learner can (a change to the clone is named afterwards, not prevented), use the
network, start processes that leave its group (setsid) or stop the grader with SIGKILL, or write to
the pipe itself (a reply judged like any return value). It guards against mistakes, not against an
adversary on your own account.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

STARTUP = 120.0  # seconds the worker may take to start, before the learner's file is imported
KEEP = 4096  # bytes of the worker's output kept (its last ones)
MAX_MESSAGE = 64 << 20  # bytes: a longer message is the worker's fault
MAX_FILE = 64 << 20  # bytes: RLIMIT_FSIZE of the worker
REMOTE_METHODS = ("coin", "draw")  # the grader's methods the worker may call (rand's)
CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
          signal.SIGQUIT)
SKIP = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache",
        ".ipynb_checkpoints"}


class Failed(Exception):
    """No answer from the worker, or its own diagnosis (`in_case`: made during a case by a harness): what
    went wrong in one line, and diagnosis lines."""

    def __init__(self, line: str, diagnosis=(), in_case: bool = False):
        super().__init__(line)
        self.line, self.diagnosis, self.in_case = line, list(diagnosis), in_case


class Raised(Exception):
    """The learner's function raised: its type's name and first line (grade.py prints them)."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


class Aborted(BaseException):
    """In the worker: the grader stopped the call (its check failed while the learner's code ran)."""


# -- messages: length-prefixed JSON, arrays as (dtype, shape, base64) ---------------------------
def printable(text, limit: int = 300) -> str:
    """A string from the worker, safe to print: one line, no control characters, at most `limit` chars."""
    text = str(text)
    return "".join(c if c.isprintable() else "?" for c in text)[:limit]


def encode(x, shared: dict):
    """`x` as JSON-able data; objects in `shared` (id -> name) by name, rand by reference."""
    if isinstance(x, np.generic):
        x = x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if id(x) in shared:
        return {"shared": shared[id(x)]}
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "biuf":
            raise TypeError(f"an array of {x.dtype}")
        return {"nd": [x.dtype.str, list(x.shape), base64.b64encode(np.ascontiguousarray(x).tobytes()).decode()]}
    if isinstance(x, (list, tuple)):
        return [encode(v, shared) for v in x]
    if type(x).__name__ == "Tree":
        return {"tree": [encode(getattr(x, f), shared) for f in ("tokens", "parents", "q", "kind", "draft_dists")]}
    if type(x).__name__ == "KVCache":
        return {"cache": [encode(x.k, shared), encode(x.v, shared), x.length, shared[id(x.config)]]}
    if all(callable(getattr(x, m, None)) for m in REMOTE_METHODS):
        return {"remote": True}
    raise TypeError(f"cannot send a {type(x).__name__}")


def decode(x, shared: dict, remote=None):
    """The value `encode` made (shared: name -> object); ValueError for anything else."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [decode(v, shared, remote) for v in x]
    if not isinstance(x, dict) or len(x) != 1:
        raise ValueError("not a value")
    (tag, value), = x.items()
    if tag == "nd":
        dtype, shape, data = value
        dtype = np.dtype(str(dtype))
        shape = tuple(int(n) for n in shape)
        if dtype.kind not in "biuf" or any(n < 0 for n in shape):
            raise ValueError(f"an array of {dtype}")
        raw = base64.b64decode(data)
        if len(raw) != dtype.itemsize * int(np.prod(shape)):
            raise ValueError("an array of the wrong size")
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if tag == "shared" and value in shared:
        return shared[value]
    if tag == "tree":
        from specdec_np.tree import Tree

        tokens, parents, q, kind, dists = (decode(v, shared) for v in value)
        return Tree(tokens, parents, q, kind, dists)
    if tag == "cache":
        from specdec_np.kvcache import KVCache

        k, v, length, config = value
        k, v = decode(k, shared), decode(v, shared)
        if k.ndim != 4 or k.shape != v.shape or k.dtype != v.dtype:
            raise ValueError("a cache whose keys and values differ in shape")
        cache = KVCache(shared[config], capacity=k.shape[2], dtype=k.dtype)
        cache.k[...], cache.v[...], cache.length = k, v, int(length)
        return cache
    if tag == "remote" and remote is not None:
        return remote
    raise ValueError(f"an unknown value {printable(tag, 40)}")


def send(fd: int, message: dict) -> None:
    data = json.dumps(message).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def read_exactly(fd: int, n: int, wait) -> bytes:
    """n bytes from fd; `wait()` is called before each read (the grader's deadline and signals)."""
    out = b""
    while len(out) < n:
        wait()
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return out


def receive(fd: int, wait=lambda: None) -> dict:
    n, = struct.unpack(">I", read_exactly(fd, 4, wait))
    if n > MAX_MESSAGE:
        raise ValueError(f"a message of {n} bytes")
    message = json.loads(read_exactly(fd, n, wait))
    if not isinstance(message, dict):
        raise ValueError("a message that is not an object")
    return message


# -- the worker: import the learner's file, answer calls -----------------------------------------
class Remote:
    """In the worker: the grader's rand; each call is a question over the pipe."""

    def __init__(self, link):
        self.link = link

    def coin(self, prob) -> bool:
        return bool(self.link.ask("coin", prob))

    def draw(self, probs) -> int:
        return int(self.link.ask("draw", probs))


class Link:
    def __init__(self, rfd: int, wfd: int, shared: dict):
        self.rfd, self.wfd, self.shared = rfd, wfd, shared
        self.ids = {id(v): k for k, v in shared.items()}

    def ask(self, method: str, *args):
        send(self.wfd, {"op": "callback", "method": method, "args": encode(list(args), self.ids)})
        reply = receive(self.rfd)
        if reply.get("op") != "reply":
            raise Aborted
        return decode(reply["value"], self.shared)


def worker(path: str, names, rfd: int, wfd: int, shared: dict, harnesses: dict, diagnosed, time_limit: float) -> None:
    """In the worker process (its cwd a scratch folder): import the file at `path`, say whether it defines
    `names`, then run the calls the grader sends until it says "end"; then end at once (a thread or exit
    handler the learner's code left behind cannot hold it). Its own alarm ends it should the grader die."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, CAUGHT)  # the grader blocks them; its worker must not
    limit_resources()
    link = Link(rfd, wfd, shared)
    send(wfd, {"op": "started"})  # the grader's own start-up is done: the time limit starts now
    signal.alarm(int(time_limit) + 10)
    import importlib.util

    try:
        spec = importlib.util.spec_from_file_location(f"exercise_{Path(path).stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        missing = [n for n in names if not callable(getattr(module, n, None))]
        send(wfd, {"op": "ready", "missing": missing})
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: one line
        send(wfd, {"op": "import failed", "error": failure(e)})
        os._exit(0)
    while True:
        message = receive(rfd)
        if message.get("op") != "call":
            break
        fn = getattr(module, message["name"])
        harness = harnesses.get(message.get("harness"))
        try:
            args = decode(message["args"], shared, Remote(link))
            value = harness(module, fn, args) if harness else fn(*args)
            after = [encode(a, link.ids) if type(a).__name__ == "KVCache" else None for a in args]
            reply = {"op": "return", "value": encode(value, link.ids), "after": after}
        except Aborted:
            reply = {"op": "aborted"}
        except diagnosed as e:  # a diagnosis made here (a harness): it can only make the exercise wrong
            reply = {"op": "wrong", "line": e.line, "diagnosis": e.diagnosis}
        except BaseException as e:  # anything the learner's code raised or ended with
            if os.environ.get("GRADE_SHOW_TRACEBACKS"):
                traceback.print_exc()
            reply = {"op": "raised", "type": type(e).__name__, "message": str(e).splitlines()[0] if str(e) else ""}
        except_sending(wfd, reply)
    os._exit(0)


def except_sending(wfd: int, reply: dict) -> None:
    try:
        send(wfd, reply)
    except TypeError as e:  # a return value that cannot travel (an object, a generator)
        send(wfd, {"op": "raised", "type": "TypeError", "message": f"your function returned something the grader "
                   f"cannot read ({e}): return numbers, lists or NumPy arrays"})


def failure(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).splitlines()[0] if str(e) else ""
    name = getattr(e, "name", None) if isinstance(e, Raised) else type(e).__name__
    return f"{name}: {text}" if text else name


# -- the grader's side ----------------------------------------------------------------------------
class Tail(threading.Thread):
    """Reads a pipe to its end, keeping only its last bytes (a solution may print without end)."""

    def __init__(self, pipe, keep: int = KEEP):
        super().__init__(daemon=True)
        self.pipe, self.keep, self.data = pipe, keep, b""
        self.start()

    def run(self):
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            self.data = (self.data + chunk)[-self.keep:]

    def last_line(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return printable(lines[-1].strip(), 200) if lines else ""


class Signals:
    """The grader's terminating signals, blocked and read by a thread of their own: one from the graded
    code (its worker's process group) is noted and ignored; any other reaches the main thread as usual."""

    def __init__(self, install: bool = True):
        self.groups, self.caught = set(), {}  # the workers' process groups; {group: the first signal it sent}
        if not install:  # grading from another program (the tests): its signals are its own
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):  # killed politely: stop the worker on the way out
            signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
        signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)  # before any thread starts: every thread blocks them
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        import _thread

        while True:
            info = signal.sigwaitinfo(CAUGHT)
            if (group := self.group_of(info.si_pid)) is not None:
                self.caught.setdefault(group, signal.Signals(info.si_signo).name)
                stop_group(group)
            elif info.si_signo in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                _thread.interrupt_main(info.si_signo)
            else:  # SIGUSR1 and the like from elsewhere: their default, to end the grader
                _thread.interrupt_main(signal.SIGTERM)


    def group_of(self, pid: int):
        """The worker's process group `pid` belongs to (None: not a worker's, or gone)."""
        if pid in self.groups:
            return pid
        try:
            group = os.getpgid(pid)
        except OSError:
            return None
        return group if group in self.groups else None


def stop_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def clone_files(root: Path) -> dict:
    """{path: (size, mtime)} of the clone's files, but .git, .venv and caches (what the graded code may change)."""
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        for name in names:
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            files[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
    return files


def changes(before: dict, after: dict) -> str:
    """The clone's changes in words ("" if none)."""
    said = []
    for what, paths in (("created", sorted(set(after) - set(before))), ("deleted", sorted(set(before) - set(after))),
                        ("changed", sorted(p for p in set(before) & set(after) if before[p] != after[p]))):
        if paths:
            said.append(f"{what} {', '.join(paths[:3])}" + (f" and {len(paths) - 3} more" if len(paths) > 3 else ""))
    return "; ".join(said)


class Worker:
    """One exercise's worker process, seen from the grader: `call` sends a call and serves rand's questions
    until the answer comes; every wait is bounded by the time limit and watches for signals."""

    def __init__(self, command: list, path: Path, names, time_limit: float, shared: dict, signals: Signals,
                 show_output: bool = False):
        self.deadline, self.time_limit = time.monotonic() + time_limit, time_limit
        self.names, self.shared, self.signals = shared, {id(v): k for k, v in shared.items()}, signals
        self.scratch = tempfile.TemporaryDirectory(prefix="grade-scratch-")
        to_w, self.wfd = os.pipe()
        self.rfd, from_w = os.pipe()
        env = dict(os.environ, GRADE_SHOW_TRACEBACKS="1" if show_output else "")
        self.proc = subprocess.Popen(
            [*command, str(path), ",".join(names), str(to_w), str(from_w), str(time_limit)],
            stdin=subprocess.DEVNULL, stdout=None if show_output else subprocess.PIPE,
            stderr=None if show_output else subprocess.STDOUT, start_new_session=True, pass_fds=(to_w, from_w),
            cwd=self.scratch.name, env=env)
        os.close(to_w)
        os.close(from_w)
        signals.groups.add(self.proc.pid)
        self.tail = None if show_output else Tail(self.proc.stdout)
        try:
            self.handshake(path, names, time_limit)
        except BaseException:  # a wrong file, or the grader stopped meanwhile: the worker ends here
            self.close()
            raise

    def handshake(self, path: Path, names, time_limit: float) -> None:
        """Wait for the worker to start and to import the learner's file; Failed if it cannot."""
        self.deadline = time.monotonic() + STARTUP  # its imports (NumPy, the checks' models), not yet the learner's
        if self.receive().get("op") != "started":
            raise self.protocol()
        self.deadline = time.monotonic() + time_limit
        ready = self.receive()
        if ready.get("op") == "import failed":
            raise Failed(f"importing {path.name} raised {printable(ready.get('error'))}")
        missing = ready.get("missing")
        if ready.get("op") != "ready" or not isinstance(missing, list):
            raise self.protocol()
        if missing:
            raise Failed(f"{path.name} defines no function {printable(missing[0])}")

    def wait(self):
        """Before each read: the signals the graded code sent, the time limit, a worker that ended."""
        while True:
            if self.signalled():
                raise Failed(self.signalled())
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise Failed(f"no verdict within {self.time_limit:g} s: an endless loop? (--time-limit "
                             "SECONDS allows more)")
            if select.select([self.rfd], [], [], min(left, 0.05))[0]:
                return

    def signalled(self) -> str:
        """The line saying the graded code signalled the grader ("" if it did not)."""
        name = self.signals.caught.get(self.proc.pid)
        return (f"your code sent the grader {name}: the grader ignored it and stopped your code (it may not "
                "signal the grader)") if name else ""

    def receive(self) -> dict:
        try:
            return receive(self.rfd, self.wait)
        except (EOFError, OSError):
            raise self.ended() from None
        except (ValueError, UnicodeDecodeError):
            raise self.protocol() from None

    def protocol(self) -> Failed:
        return Failed("the grading process sent something that is not an answer: does your code write to "
                      "the grader's pipe?")

    def ended(self) -> Failed:
        self.proc.wait()
        if self.signalled():
            return Failed(self.signalled())
        if self.tail is not None:
            self.tail.join(timeout=2)  # its last output, read to the end (unless a process it started holds the pipe)
        code = self.proc.returncode
        how = (f"killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
               else f"exit status {code}")
        said = f"; its last output: {self.tail.last_line()}" if self.tail and self.tail.last_line() else ""
        return Failed(f"the grading process ended ({how}) before a verdict: does your code end the process "
                      f"(os._exit, a crash)?{said}")

    def call(self, name: str, args, harness: str | None = None):
        """The learner's `name`(*args) in the worker: its return value; Raised, or Failed for a worker's failure."""
        try:
            send(self.wfd, {"op": "call", "name": name, "args": encode(list(args), self.shared), "harness": harness})
        except OSError:
            raise self.ended() from None
        error = None  # an exception of the grader's own objects (rand), raised here once the worker has stopped
        while True:
            message = self.receive()
            op = message.get("op")
            if op == "callback" and message.get("method") in REMOTE_METHODS:
                reply = {"op": "abort"}
                if error is None:
                    try:
                        remote = next(a for a in args if all(callable(getattr(a, m, None)) for m in REMOTE_METHODS))
                        value = getattr(remote, message["method"])(*decode(message.get("args"), {}))
                        reply = {"op": "reply", "value": encode(value, {})}
                    except Exception as e:  # the check's own verdict (Wrong) or the enumerator's: stop the call
                        error = e
                try:
                    send(self.wfd, reply)
                except OSError:
                    raise self.ended() from None
                continue
            if error is not None and op in ("return", "aborted", "raised", "wrong"):
                raise error
            if op == "return":
                try:
                    for a, state in zip(args, message.get("after") or []):
                        if state is not None and type(a).__name__ == "KVCache":  # the learner's changes, copied back
                            copy = decode(state, self.names)
                            a.k, a.v, a.length = copy.k, copy.v, copy.length
                    return decode(message.get("value"), self.names)
                except (ValueError, TypeError, KeyError, IndexError):
                    raise self.protocol() from None
            if op == "raised":
                name, text = printable(message.get("type"), 60), printable(message.get("message"))
                if name == "NotImplementedError":
                    raise NotImplementedError(text)
                raise Raised(name, text)
            if op == "wrong":
                diagnosis = message.get("diagnosis")
                raise Failed(printable(message.get("line")),
                             [printable(d) for d in diagnosis] if isinstance(diagnosis, list) else [], in_case=True)
            raise self.protocol()

    def close(self) -> None:
        """End the worker and everything in its process group, reap it, remove its scratch folder."""
        stop_group(self.proc.pid)
        self.proc.wait()
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.tail is not None:
            self.tail.join(timeout=5)
            if not self.tail.is_alive():  # else a process that left the group still writes to the pipe
                self.proc.stdout.close()
        self.scratch.cleanup()


def limit_resources() -> None:
    """In the worker: no core files, files of at most MAX_FILE bytes."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE if hard == resource.RLIM_INFINITY else min(MAX_FILE, hard),
                                               hard))
