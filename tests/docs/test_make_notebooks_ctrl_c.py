"""Ctrl-C during `make notebooks` says one line and exits 130. nbclient makes Ctrl-C its own while a kernel runs
(an asyncio signal handler that shuts the kernel down: the cell then fails with DeadKernelError, ZMQError and
AssertionError tracebacks, exit 1); make_notebooks takes it back in nbclient's on_notebook_start hook. The first
test runs make_notebooks.main with a stand-in nbclient that does what nbclient does (no Jupyter needed), with a
negative control that ignores the hook; the second runs the real nbclient and kernel where they are installed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "tutorials"
INTERRUPTED = "make_notebooks: interrupted (the notebooks already written are whole)"

LIKE_NBCLIENT = """
import asyncio, signal, sys, types
sys.path.insert(0, sys.argv[1])
mode, lesson = sys.argv[2], sys.argv[3]


class NotebookClient:  # nbclient's: while the kernel runs, SIGINT is an asyncio handler that stops the kernel
    def __init__(self, nb, **kwargs):
        self.on_notebook_start = kwargs.get("on_notebook_start")

    def execute(self, **kwargs):
        async def run():
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            loop.add_signal_handler(signal.SIGINT, task.cancel)
            try:
                if mode == "hook":
                    self.on_notebook_start(notebook=None)
                print("started", flush=True)
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                print("zmq.error.ZMQError: Socket operation on non-socket", file=sys.stderr)
                raise RuntimeError("DeadKernelError: Kernel died") from None
            finally:
                loop.remove_signal_handler(signal.SIGINT)
        asyncio.new_event_loop().run_until_complete(run())


sys.modules["nbclient"] = types.SimpleNamespace(NotebookClient=NotebookClient)
sys.modules["jupytext"] = types.SimpleNamespace(read=lambda path: types.SimpleNamespace(metadata={}, cells=[]))
sys.modules["nbformat"] = types.SimpleNamespace()
import make_notebooks
sys.exit(make_notebooks.main([lesson, "--out", sys.argv[4]], load_check=lambda: "", register=lambda name: None))
"""


def interrupt(command, started: str, after: float = 0.5, timeout: float = 60):
    """Run `command` in a process group of its own; once a line starting `started` is out, Ctrl-C it as a terminal
    does (SIGINT to the whole group): (exit status, stdout, stderr)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        out.append(line)
        if not line or line.startswith(started):
            break
    time.sleep(after)
    os.killpg(proc.pid, signal.SIGINT)
    rest, err = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(out) + rest, err


@pytest.mark.parametrize("mode", ["hook", "no hook"])
def test_ctrl_c_while_nbclient_runs_a_kernel_is_one_line(tmp_path, mode):
    lesson = tmp_path / "01_slow.py"
    lesson.write_text("# %%\nimport time\ntime.sleep(30)\n")
    code, out, err = interrupt([sys.executable, "-c", LIKE_NBCLIENT, str(TUTORIALS), mode, str(lesson),
                                str(tmp_path / "out")], "started")
    assert "started" in out
    if mode == "hook":
        assert code == 130 and err.splitlines() == [INTERRUPTED], (code, err)
    else:  # the negative control: nbclient's handler keeps Ctrl-C, and the run ends in its tracebacks
        assert code == 1 and "ZMQError" in err and "Kernel died" in err, (code, err)
    assert not (tmp_path / "out").exists()  # nothing written


def test_ctrl_c_during_a_real_notebook_build_is_one_line(tmp_path):
    """With Jupyter installed (the notebooks extra, not the test extra): a real kernel runs a slow lesson."""
    pytest.importorskip("nbclient")
    pytest.importorskip("jupytext")
    kernelspec = pytest.importorskip("jupyter_client.kernelspec")
    if "python3" not in kernelspec.find_kernel_specs():
        pytest.skip("no python3 Jupyter kernel here")
    lesson = tmp_path / "01_slow.py"
    lesson.write_text("# %%\nimport time\nprint('running', flush=True)\ntime.sleep(60)\n")
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import make_notebooks as m; sys.exit(m.main(sys.argv[2:], "
              "load_check=lambda: ''))")
    code, out, err = interrupt([sys.executable, "-c", script, str(TUTORIALS), str(lesson), "--out",
                                str(tmp_path / "out"), "--kernel", "python3"], "machine:", after=8)
    assert code == 130 and err.splitlines() == [INTERRUPTED], (code, out, err)
    assert not (tmp_path / "out").exists()
