"""Helpers shared by several test files (pytest puts tests/ on sys.path: `from helpers import ...`).

- The small random model configurations behind conftest's `small` and `tiny` fixtures, the target's
  greedy text and its exact sampling distribution.
- Lazily generated probability tables (one distribution per context tuple) and `callback`, which
  serves a table to the tree builders as their `dist_fn`.
- `always_accept`, a deliberately broken verification rule for the negative controls.
- `processed`, a table served top-k / top-p processed, as the decode loop's distributions are.
- `assert_lossless`: the exact check of one speculative step against the target
  (`exact.step_error`, also the exercise grader's), asserted below the tolerance `TOL`.
- `build_wheel`: the package's wheel, built offline from a copy of the sources (behind tests/tools'
  session-scoped `wheel` fixture, built once for test_install and test_trace).
"""

import itertools
import shutil
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import NamedTuple

import numpy as np

from specdec_np import verify
from specdec_np.build import build_fixed
from specdec_np.decode import generate
from specdec_np.gpt2 import GPT2, GPT2Config, forward, new_cache
from specdec_np.methods import METHODS
from specdec_np.ngram import Trigram
from specdec_np.proofs import exact
from specdec_np.proofs.exact import context, target_rows  # noqa: F401  (the tests' names)
from specdec_np.sampling import keep_top_p, process
from specdec_np.tree import path_to

# ----------------------------------------------------------------------------- small random models

SMALL = GPT2Config(n_vocab=40, n_ctx=64, n_embd=16, n_layer=2, n_head=2)  # conftest's `small`
TINY = GPT2Config(n_vocab=4, n_ctx=16, n_embd=8, n_layer=1, n_head=2)  # conftest's `tiny`: enumerable
TINY_PROMPT = [1, 2]  # conftest's `tiny_exact` is the tiny target's distribution after it


class Models(NamedTuple):
    """A target, its draft and a trigram over the same vocabulary."""
    target: GPT2
    draft: GPT2
    trigram: Trigram


def models_for(method, draft=None, ngram=None) -> dict:
    """generate's draft and ngram for `method`: those it reads (generate refuses a model a method never reads)."""
    m = METHODS[method]
    return dict(draft=draft if m.drafts_with else None, ngram=ngram if m.needs_ngram else None)


def ar_greedy(model, prompt, n):
    """The model's own greedy continuation: what every decoding method must emit at temperature 0."""
    return generate(model, prompt, n, method="ar", eos=None).tokens


def exact_target_distribution(model, prompt, m):
    """P_target(x_1..x_m | prompt) at temperature 1, by enumerating the model autoregressively."""
    out = {}
    for xs in itertools.product(range(model.config.n_vocab), repeat=m):
        logits = forward(model, prompt + list(xs), new_cache(model))
        probs = process(logits[len(prompt) - 1:], 1.0)
        out[xs] = float(np.prod([probs[i, x] for i, x in enumerate(xs)]))
    return out


# ----------------------------------------------------------------------------- draft and target tables

TIES = np.array([0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 0.5])  # zeros and exact ties are common
NEAR_TIES = np.append(TIES, [1e-3, 1.0 + 1e-12])  # ... and near-ties
DRAFT_MODES = ("independent", "same", "disjoint", "near", "one_hot")


def weights(rng, V, values=NEAR_TIES, allowed=None):  # -> [V] a distribution with mass only where `allowed`
    w = rng.choice(values, size=V)
    if allowed is not None:
        w = np.where(allowed, w, 0.0)
    if w.sum() == 0:
        w[rng.choice(np.flatnonzero(allowed)) if allowed is not None else rng.integers(V)] = 1.0
    return w / w.sum()


def table(seed: int, V: int, values=TIES):
    """ctx tuple -> [V] distribution, generated lazily and deterministically per context."""
    memo = {}

    def dist(ctx):
        if ctx not in memo:
            memo[ctx] = weights(np.random.default_rng([seed, len(ctx), *ctx]), V, values)
        return memo[ctx]
    return dist


def tables(seed: int, V: int, modes=DRAFT_MODES):
    """target(ctx), draft(ctx) -> [V]: lazily generated per context tuple, deterministic in (seed, ctx).

    The draft at each context is, at random: independent of the target, equal to it, on the
    complement of its support (disjoint), a 1e-9 perturbation of it (near), or one-hot.
    """
    memo = {}

    def pair(ctx):
        if ctx not in memo:
            rng = np.random.default_rng([seed, len(ctx), *ctx])
            p = weights(rng, V)
            mode = modes[rng.integers(len(modes))]
            if mode == "same":
                q = p.copy()
            elif mode == "disjoint" and (p == 0).any():
                q = weights(rng, V, allowed=p == 0)
            elif mode == "near":
                q = p * (1 + 1e-9 * rng.random(V))
                q = q / q.sum()
            elif mode == "one_hot":
                q = np.eye(V)[rng.integers(V)]
            else:
                q = weights(rng, V)
            memo[ctx] = (p, q)
        return memo[ctx]

    return (lambda ctx: pair(ctx)[0]), (lambda ctx: pair(ctx)[1])


def callback(dist, calls=None):
    """dist_fn for the builders: the table's distribution after each requested node of the partial tree
    (`exact.callback`), recording (tokens, parents, nodes) of every call if `calls` is a list."""
    if calls is None:
        return exact.callback(dist)

    def dist_fn(tokens, parents, nodes):
        calls.append((list(tokens), list(parents), list(nodes)))
        return exact.callback(dist)(tokens, parents, nodes)
    return dist_fn


# ----------------------------------------------------------------------------- a broken rule

def always_accept(tree, p, rand):
    """Broken, for the negative controls: accept the first child down to a leaf, untested, then a
    bonus token from the target's distribution there."""
    node = 0
    while len(kids := np.flatnonzero(tree.parents == node)):
        node = int(kids[0])
    return verify.Verdict(path_to(tree, node), rand.draw(p[node]))


def keep_top_k(probs, k: int):  # [V] -> [V]
    """A distribution's k most probable tokens (ties to the lower id), renormalised: `process`'s
    top-k applied to log-probabilities (the one top-k path of the library)."""
    with np.errstate(divide="ignore"):
        return process(np.log(probs), 1.0, k)


def processed(dist, top_k=None, top_p=None):
    """A table as sampling would serve it: top-k, then top-p, renormalised (both distributions of a
    step are processed alike; the draft's processed rows are what its children are drawn from)."""
    def out(ctx):
        probs = np.asarray(dist(ctx), dtype=np.float64)
        if top_k is not None:
            probs = keep_top_k(probs, top_k)
        if top_p is not None:
            probs = keep_top_p(probs, top_p)
        return probs
    return out


# ----------------------------------------------------------------------------- the exact check of one step

TOL = 1e-12


def assert_lossless(build, rule, draft, target, root, m):
    err = exact.step_error(build, rule, draft, target, root, m)
    assert err < TOL, f"total variation {err:.3g} from the target"


def sampled(widths, replacement=True):
    """A builder of fixed-width trees whose children are sampled from the draft."""
    return lambda root, dist_fn, rand: build_fixed(root, dist_fn, widths, rand=rand, replacement=replacement)


def dense_tables(seed: int, V: int):
    """target(ctx), draft(ctx) -> [V]: independent Dirichlet(1) rows, every token possible.

    The negative controls use these: with sparse rows a bug can be invisible (e.g. when p > q on a
    single token, the residual is one-hot and every residual variant agrees).
    """
    memo = {}

    def pair(ctx):
        if ctx not in memo:
            rng = np.random.default_rng([seed, len(ctx), *ctx])
            memo[ctx] = (rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V)))
        return memo[ctx]

    return (lambda ctx: pair(ctx)[0]), (lambda ctx: pair(ctx)[1])



SHIPPED = Path(__file__).resolve().parents[1] / "specdec_np" / "weights"  # files.SHIPPED_DIR of this checkout
DOWNLOADED = ("gpt2*", "distilgpt2")  # `make weights` checkpoints in the package's weights/: not package data


def not_shipped(folder, names) -> set:
    """What the copy of the sources leaves out: caches, temporary files, downloaded checkpoints."""
    downloaded = Path(folder) == SHIPPED and {n for n in names if any(fnmatch(n, d) for d in DOWNLOADED)}
    return set(downloaded or ()) | {n for n in names if n == "__pycache__" or n.endswith((".tmp", ".part"))}


def build_wheel(tmp: Path) -> Path:
    """The package's wheel, built offline (setuptools and wheel are in the test extra) from a copy of the
    sources in `tmp`, so that the checkout gets no build directory."""
    root, src = SHIPPED.parents[1], tmp / "src"
    shutil.copytree(root / "specdec_np", src / "specdec_np", ignore=not_shipped)
    for name in ("pyproject.toml", "README.md", "LICENSE", "THIRD_PARTY_NOTICES.md"):
        shutil.copy(root / name, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "-q", "--no-build-isolation",
                        "--disable-pip-version-check", "-w", str(tmp / "dist"), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (wheel,) = (tmp / "dist").glob("specdec_np-*.whl")
    return wheel


def grader_with_its_worker_started(folder, pid_file, timeout: float):
    """tutorials/exercises/grade.py started on `folder` (a Popen, text pipes), once the learner's file there has
    written its worker's pid to `pid_file` (or `timeout` seconds have passed): ready for a signal."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, str(root / "tutorials" / "exercises" / "grade.py"), str(folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    deadline = time.monotonic() + timeout
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def head_race_profile() -> dict:
    """A greedy profile ("head" "H") of plain decoding, and of tree and eagle with the same counts (100 steps, a chain
    of 4: a 5-token target pass, 4 drafting passes): which of the two is faster is its drafter's cost alone."""
    def record(method, tokens, target, draft):
        return {"method": method, "shape": {"shape": "fixed", "widths": (1, 1, 1, 1)} if draft else {},
                "tokens": tokens, "steps": 100, "draft_dists": 4 * draft, "ngram_queries": 0, "target": target,
                "draft": {"cold": {1: draft}, "warm": {1: 3 * draft}} if draft else {"cold": {}, "warm": {}}}
    deep = {"cold": {5: 100}, "warm": {}}
    return {"models": "pair", "head": "H", "settings": {"greedy": [
        record("ar", 100, {"cold": {}, "warm": {1: 100}}, 0), record("tree", 250, deep, 100),
        record("eagle", 250, deep, 100)]}}


def pass_curve(fixed: float) -> dict:  # ms of a pass of k tokens, warm and cold: blocks nearly free (memory-bound)
    return {s: {k: fixed + 0.01 * k for k in (1, 2, 4, 8)} for s in ("warm", "cold")}
