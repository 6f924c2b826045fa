"""Shared test settings: hypothesis without deadlines (noisy 2-core CI), derandomized under CI;
BLAS on one thread.

And the models several tests share, as session-scoped fixtures: each is built once, on first use,
and no test module builds, fits or decodes anything at import time. (Hypothesis `@given` tests may
use them: only function-scoped fixtures are refused there.) The shipped trigram is read once per session
(`shipped_trigram_read_once`), however many command lines the tests run in-process.
"""

import os
import shutil
import signal
import tempfile

import numpy as np
import pytest
import threadpoolctl
from hypothesis import HealthCheck, settings

from helpers import SMALL, TINY, TINY_PROMPT, Models, ar_greedy, exact_target_distribution
from specdec_np import ngram
from specdec_np.gpt2 import GPT2, map_params, random_params

settings.register_profile("dev", deadline=None, max_examples=30,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# BLAS on one thread for the whole session, here and in the command lines the tests start: the
# tests' matrices are small, and on a machine whose other core is busy, OpenBLAS's threads wait
# for each other at every call (the likely cause of a suite that took minutes longer under load).
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
threadpoolctl.threadpool_limits(1)

# The tools cache this machine's measured costs in the user's cache directory: tests (and the
# command lines they start) use a temporary one instead, never the user's, never the repository,
# removed when the session ends.
TEST_CACHE = tempfile.mkdtemp(prefix="specdec_np-test-cache-")
os.environ["XDG_CACHE_HOME"] = TEST_CACHE


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_CACHE, ignore_errors=True)


# A suite started in the background (`make test &`, nohup) inherits an ignored Ctrl-C, and so would the
# processes the interrupt tests start: they get Python's own handler back, as a terminal's run has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def signal_handlers_restored():
    """Each test leaves Ctrl-C and SIGTERM as it found them: a command line run in-process ignores Ctrl-C
    once its work is done, and the processes later tests start would inherit that (and never see theirs)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in before.items():
        if signal.getsignal(s) is not handler:
            signal.signal(s, handler)


_SHIPPED_TRIGRAM = {}  # the shipped file's identity -> the Trigram read from it


@pytest.fixture(autouse=True)
def shipped_trigram_read_once(monkeypatch):
    """`ngram.load` of the shipped trigram (read and derived in about half a second, by every command line a test
    runs in-process) reads it once per session: while the file is unchanged (its device, inode, size and mtime), a
    later load returns the first one's Trigram, its arrays read-only, so that no test can change what the next
    one gets. Any other file (a copy, a hostile one) is read as always."""
    from specdec_np import models, ngram

    real = ngram.load

    def load(path):
        try:
            st, shipped = os.stat(path), os.stat(models.EMBEDDED_NGRAM)
        except (OSError, TypeError, ValueError):
            return real(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key != (shipped.st_dev, shipped.st_ino, shipped.st_size, shipped.st_mtime_ns):
            return real(path)
        if key not in _SHIPPED_TRIGRAM:
            model = real(path)
            for a in (*vars(model).values(), *model.counts.values()):
                if isinstance(a, np.ndarray):
                    a.setflags(write=False)
            _SHIPPED_TRIGRAM[key] = model
        return _SHIPPED_TRIGRAM[key]

    monkeypatch.setattr(ngram, "load", load)


@pytest.fixture(scope="session")
def embedded():
    """(target, draft, trigram, encoding): the shipped tiny models, as `load_embedded()` returns them."""
    from specdec_np.models import load_embedded
    return load_embedded()


@pytest.fixture(scope="session")
def small():
    """A random target, a perturbed copy of it as the draft (often, not always, right), and a trigram
    fitted on the target's own greedy text (so that its guesses are often right)."""
    target = random_params(SMALL, seed=3, dtype=np.float64, scale=0.5)
    noise = np.random.default_rng(7)
    draft = GPT2(SMALL, map_params(lambda a: a + noise.normal(0, 0.03, a.shape), target.params))
    eos = SMALL.n_vocab - 1
    stream = []
    for s in range(12):
        stream += [eos] + list(range(s, s + 3)) + ar_greedy(target, list(range(s, s + 3)), 30)
    return Models(target, draft, ngram.fit(np.array(stream), SMALL.n_vocab))


@pytest.fixture(scope="session")
def tiny():
    """Two different random models over 4 tokens (real rejections; small enough to enumerate) and a
    trigram fitted on random tokens."""
    target = random_params(TINY, seed=11, dtype=np.float64, scale=0.8)
    draft = random_params(TINY, seed=12, dtype=np.float64, scale=0.8)
    trigram = ngram.fit(np.random.default_rng(0).integers(0, TINY.n_vocab, 300), TINY.n_vocab)
    return Models(target, draft, trigram)


@pytest.fixture(scope="session")
def tiny_exact(tiny):
    """{(x1, x2): P_target(x1, x2 | TINY_PROMPT)}: the tiny target's exact distribution of two tokens."""
    return exact_target_distribution(tiny.target, TINY_PROMPT, 2)
