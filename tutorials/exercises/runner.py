"""The grader's sandbox: one exercise graded in a process of its own, with a time limit.

A learner's code may exit, hang, crash, print without end or leave threads behind. Run in a worker
process (in a session of its own, so Ctrl-C reaches only the grader), it can end nothing but its
own grading, which then reads as "wrong" with the reason. The worker writes its verdict, a
(status, line, diagnosis lines) triple, as JSON to a file the grader reads once it has ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path


def worker(grade, result: Path, time_limit: float) -> None:
    """In the worker process: write grade()'s verdict to `result`, then end at once (a thread or exit
    handler the learner's code left behind cannot hold it). Should the grader die without stopping
    the worker, its own alarm ends it soon after the time limit."""
    signal.alarm(int(time_limit) + 10)
    status, line, diagnosis = grade()
    result.write_text(json.dumps({"status": status, "line": line, "diagnosis": diagnosis}))
    os._exit(0)


class Tail(threading.Thread):
    """Reads a pipe to its end, keeping only its last bytes (a solution may print without end)."""

    def __init__(self, pipe, keep: int = 4096):
        super().__init__(daemon=True)
        self.pipe, self.keep, self.data = pipe, keep, b""
        self.start()

    def run(self):
        for chunk in iter(lambda: self.pipe.read1(65536), b""):
            self.data = (self.data + chunk)[-self.keep:]

    def last_line(self) -> str:
        lines = self.data.decode(errors="replace").strip().splitlines()
        return lines[-1].strip() if lines else ""


def stop(proc) -> None:
    """Kill the worker and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_apart(command: list, time_limit: float) -> tuple[str, str, list]:
    """Run `command RESULT SECONDS` (a worker) for at most `time_limit` seconds and return its verdict;
    an exit, a hang or a crash before the verdict is a "wrong" with its reason."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        result = Path(tmp) / "result.json"
        proc = subprocess.Popen([*command, str(result), str(time_limit)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        tail = Tail(proc.stdout)
        try:
            proc.wait(timeout=time_limit)
        except BaseException as e:  # the time limit, or Ctrl-C or SIGTERM reaching the grader
            stop(proc)
            if not isinstance(e, subprocess.TimeoutExpired):
                raise
            return "wrong", (f"wrong: no verdict within {time_limit:g} s: an endless loop? (--time-limit SECONDS "
                             "allows more)"), []
        finally:
            tail.join(timeout=5)
            if not tail.is_alive():  # else a process the worker started still writes to the pipe
                proc.stdout.close()
        try:
            verdict = json.loads(result.read_text())
            return verdict["status"], verdict["line"], verdict["diagnosis"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
    code = proc.returncode
    how = (f"killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
           else f"exit status {code}")
    said = f"; its last output: {tail.last_line()[:200]}" if tail.last_line() else ""
    return "wrong", (f"wrong: the grading process ended ({how}) before a verdict: does your code end the process "
                     f"(os._exit, a crash)?{said}"), []
