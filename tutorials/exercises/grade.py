"""Grade the exercises exactly: `make exercises`, or `python tutorials/exercises/grade.py [DIR]`.

One line per exercise: not yet written (the stub still raises NotImplementedError), correct, or
wrong with the first failing case. Exit 0 when every exercise is correct, 1 otherwise.

- The rules (chain_rule.py, recursive_rejection.py) are graded by exact enumeration
  (`specdec_np.proofs.exact`): over a fixed list of small p/q tables and tree shapes, smallest
  first, the draft tree is drawn from q, your rule verifies it, the target continues where the step
  emitted fewer tokens, and the distribution of the first tokens must equal the target's own
  (total variation < 1e-12). No sampling noise: a wrong rule fails on a definite case.
- The mask and positions (tree_attention.py) are graded on random trees, smallest first: a tiny
  random GPT-2 in float64 scores the tree in one pass with your mask and positions, and each node's
  logits must equal those of its root-to-node path fed alone as a chain (difference < 1e-9).

DIR (default: this folder) holds the three files; `solutions/` holds reference solutions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from specdec_np import build
from specdec_np.gpt2 import GPT2Config, forward, new_cache, random_params
from specdec_np.proofs import exact
from specdec_np.tree import Tree, path_to

HERE = Path(__file__).resolve().parent
MAX_TV = 1e-12
MAX_LOGIT_DIFF = 1e-9


class Wrong(Exception):
    """A case the learner's code fails, with what to say about it."""


# -- the cases, smallest first ------------------------------------------------------------------
def tables(V: int, seed: int):  # -> P [V, V], Q [V, V]
    """Target and draft next-token tables (row t: the distribution after token t), with zeros where
    one model has mass and the other has none, the cases a rule most often gets wrong."""
    rng = np.random.default_rng(seed)
    P, Q = rng.random((V, V)) ** 2, rng.random((V, V)) ** 2
    P[rng.random((V, V)) < 0.2] = 0
    Q[rng.random((V, V)) < 0.2] = 0
    for M in (P, Q):
        empty = M.sum(axis=1) == 0
        M[empty, rng.integers(V)] = 1.0
    return P / P.sum(axis=1, keepdims=True), Q / Q.sum(axis=1, keepdims=True)


CHAIN_CASES = [(2, 1, 0), (2, 2, 1), (3, 1, 2), (3, 2, 3), (4, 2, 4), (3, 3, 5)]  # (V, guesses, seed)
TREE_CASES = [(2, (2,), 0), (3, (2,), 1), (3, (3,), 2), (3, (2, 1), 3), (4, (2,), 4), (3, (2, 2), 5),
              (4, (3, 1), 6)]  # (V, widths, seed)
TINY = GPT2Config(n_vocab=16, n_ctx=32, n_embd=16, n_layer=2, n_head=2)


def random_trees(count: int = 14, seed: int = 0) -> list[Tree]:
    """Random trees of 2 to 8 nodes, smallest first (parents[i] drawn below i, tokens at random)."""
    rng = np.random.default_rng(seed)
    trees = []
    for i in range(count):
        n = 2 + i // 2
        parents = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]
        trees.append(Tree(rng.integers(0, TINY.n_vocab, n), parents, np.ones(n)))
    return trees


# -- grading the rules by exact enumeration -----------------------------------------------------
def emitted_then_target(tree, path, token, P, rand, m: int) -> tuple:
    """The step's tokens (accepted path, then the rule's token), continued by the target to m tokens."""
    path = [int(i) for i in path]
    if not path or path[0] != 0 or any(tree.parents[b] != a for a, b in zip(path, path[1:])):
        raise Wrong(f"the returned path {path} is not a root-to-node path of the tree")
    out = [int(t) for t in tree.tokens[path[1:]]] + [int(token)]
    while len(out) < m:
        out.append(rand.draw(P[out[-1]]))
    return tuple(out[:m])


def rule_tv(rule, P, Q, widths, replacement: bool) -> float:
    """TV between what `rule` emits on trees of `widths` drawn from Q and the target P's own tokens."""
    m = len(widths) + 1

    def run(rand):
        tree = build.build_fixed(0, lambda tokens, parents, nodes: Q[tokens[nodes]], widths, rand=rand,
                                 replacement=replacement)
        path, token = rule(tree, P[tree.tokens], rand)
        return emitted_then_target(tree, path, token, P, rand, m)

    return exact.total_variation(exact.outcomes(run), exact.sequence_distribution(lambda ctx: P[ctx[-1]], (0,), m))


def grade_chain(funcs) -> str:
    for i, (V, k, seed) in enumerate(CHAIN_CASES, 1):
        P, Q = tables(V, seed)
        tv = case(lambda: rule_tv(funcs["verify_chain"], P, Q, [1] * k, True), i, f"V={V}, a chain of {k}")
        if tv >= MAX_TV:
            raise Wrong(f"case {i} of {len(CHAIN_CASES)} (V={V}, a chain of {k}, tables(V={V}, seed={seed})): "
                        f"TV {tv:.3g} from the target's distribution")
    return f"correct ({len(CHAIN_CASES)} cases)"


def grade_recursive(funcs) -> str:
    for i, (V, widths, seed) in enumerate(TREE_CASES, 1):
        P, Q = tables(V, seed)
        shape = ",".join(map(str, widths))
        tv = case(lambda: rule_tv(funcs["verify_recursive_wor"], P, Q, widths, False), i, f"V={V}, widths {shape}")
        if tv >= MAX_TV:
            raise Wrong(f"case {i} of {len(TREE_CASES)} (V={V}, widths {shape}, tables(V={V}, seed={seed})): "
                        f"TV {tv:.3g} from the target's distribution")
    return f"correct ({len(TREE_CASES)} cases)"


# -- grading the mask and positions against chains ----------------------------------------------
def tree_logit_diff(funcs, model, tree: Tree, context) -> tuple[float, int]:
    """(largest |difference|, the node where it is) between the tree pass and each path fed alone."""
    mask = np.asarray(funcs["attention_mask"](tree))
    pos = np.asarray(funcs["positions"](tree, len(context)))
    n = len(tree)
    if mask.shape != (n, n):
        raise Wrong(f"attention_mask returned shape {mask.shape} for a tree of {n} nodes, expected ({n}, {n})")
    if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer):
        raise Wrong(f"positions returned {pos.dtype} shape {pos.shape} for a tree of {n} nodes, expected ({n},) ints")
    cache = new_cache(model)
    forward(model, context, cache)
    logits = forward(model, tree.tokens, cache, positions=pos, mask=mask.astype(bool))  # [n, V]
    diffs = []
    for i in range(n):
        chain = list(context) + [int(t) for t in tree.tokens[path_to(tree, i)]]
        alone = forward(model, chain, new_cache(model))[-1]  # [V]
        diffs.append(float(np.abs(logits[i] - alone).max()))
    return max(diffs), int(np.argmax(diffs))


def grade_tree_attention(funcs) -> str:
    model = random_params(TINY, seed=0, dtype=np.float64, scale=0.3)
    context = [3, 1, 4]
    trees = random_trees()
    for i, tree in enumerate(trees, 1):
        name = f"the tree with parents {tree.parents.tolist()}"
        diff, node = case(lambda: tree_logit_diff(funcs, model, tree, context), i, name)
        if not diff < MAX_LOGIT_DIFF:
            raise Wrong(f"case {i} of {len(trees)} ({name}): node {node}'s logits differ by {diff:.3g} from its path "
                        "fed alone as a chain")
    return f"correct ({len(trees)} random trees)"


def case(fn, i: int, name: str):
    """Run one case; the learner's exception becomes a Wrong naming the case (NotImplementedError passes)."""
    try:
        return fn()
    except (NotImplementedError, Wrong):
        raise
    except Exception as e:  # anything the learner's code raised: one line, no traceback
        raise Wrong(f"case {i} ({name}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None


# -- the exercises ------------------------------------------------------------------------------
EXERCISES = [  # (title, file, the functions it defines, grader)
    ("chain rule with its residual", "chain_rule.py", ("verify_chain",), grade_chain),
    ("tree attention mask and positions", "tree_attention.py", ("attention_mask", "positions"), grade_tree_attention),
    ("recursive rejection without replacement", "recursive_rejection.py", ("verify_recursive_wor",), grade_recursive),
]


def load(path: Path, names) -> dict:
    """The named functions of the file at `path` (Wrong if it cannot be imported or lacks one)."""
    try:
        spec = importlib.util.spec_from_file_location(f"exercise_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except FileNotFoundError:
        raise Wrong(f"{path} is missing") from None
    except Exception as e:
        raise Wrong(f"cannot import {path.name}: {type(e).__name__}: {e}") from None
    missing = [n for n in names if not callable(getattr(module, n, None))]
    if missing:
        raise Wrong(f"{path.name} defines no function {missing[0]}")
    return {n: getattr(module, n) for n in names}


def grade(title: str, funcs, grader) -> tuple[str, str]:
    """(status, its one line): status is "not yet written", "correct" or "wrong"."""
    try:
        return "correct", grader(funcs)
    except NotImplementedError:
        return "not yet written", "not yet written"
    except Wrong as e:
        return "wrong", f"wrong: {e}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else HERE
    if not folder.is_dir():
        print(f"grade.py: {folder} is not a folder of exercises")
        return 1
    statuses = []
    for n, (title, filename, names, grader) in enumerate(EXERCISES, 1):
        try:
            status, line = grade(title, load(folder / filename, names), grader)
        except Wrong as e:
            status, line = "wrong", f"wrong: {e}"
        statuses.append(status)
        print(f"exercise {n}, {title} ({filename}): {line}", flush=True)
    return 0 if all(s == "correct" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
