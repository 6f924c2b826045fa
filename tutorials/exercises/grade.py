"""Grade the exercises exactly: `make exercises`, or `python tutorials/exercises/grade.py [DIR]`.

One line per exercise: not yet written (the stub still raises NotImplementedError), correct, or
wrong at the smallest failing case. Under a wrong line: what differs (the distribution of the first
token your code emits beside the target's, the node or position where it departs) and a command
that reruns that case alone, printing it in full. Exit 0 when every exercise is correct, 1 otherwise.

- The rules (chain_rule.py, recursive_rejection.py) are graded by exact enumeration
  (`specdec_np.proofs.exact`): over a fixed list of small p/q tables and tree shapes, smallest
  first, the draft tree is drawn from q, your rule verifies it, the target continues where the step
  emitted fewer tokens, and the distribution of the tokens must equal the target's own (total
  variation < 1e-12). No sampling noise: a wrong rule fails on a definite case. Where it fails, yours
  and the library's rule (`specdec_np.verify`) walk the same tree with the same coin outcomes: the
  first coin, draw or returned path that differs is named.
- The mask and positions (tree_attention.py) are graded on random trees, smallest first: a tiny
  random GPT-2 in float64 scores the tree in one pass with your mask and positions, and each node's
  logits must equal those of its root-to-node path fed alone as a chain (difference < 1e-9).
- The loop (write_the_loop.py) runs a tiny random target and draft in float64: at temperature 0 it
  must emit the tokens of `generate(method="speculative")`; sampled, its first tokens must be
  distributed exactly as the target's (exact enumeration, TV < 1e-12), and with a seed it must emit
  generate's very tokens (the same random numbers, drawn in the same order).

Each exercise runs in a process of its own with a time limit: an exit, an endless loop or an
exception in your code makes that exercise wrong, with the reason, and leaves the others graded.
The grader checks honest attempts; it does not police cheating. A solution could call the library's
rules (`specdec_np.verify.RULES`) or patch the tolerance or `exact.total_variation` in its own
process and be graded correct: the exercises are for you to learn from, nothing rests on the grade.

DIR (default: this folder) holds the four files; `solutions/` holds reference solutions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from itertools import zip_longest
from pathlib import Path

try:
    import numpy as np

    from specdec_np import build
    from specdec_np.decode import generate
    from specdec_np.gpt2 import GPT2Config, forward, new_cache, random_params
    from specdec_np.plan import Plan
    from specdec_np.proofs import exact
    from specdec_np.sampling import SURE, Rand, process
    from specdec_np.tree import Tree, path_to
    from specdec_np.verify import verify_chain, verify_recursive_wor
    MISSING = None
except ImportError as e:  # a Python without the venv's packages: main() says which Python to use
    MISSING = e.name or str(e)
except KeyboardInterrupt:
    print("grade.py: interrupted", file=sys.stderr)
    sys.exit(130)

HERE = Path(__file__).resolve().parent
MAX_TV = 1e-12
MAX_LOGIT_DIFF = 1e-9
TIME_LIMIT = 60.0  # seconds each exercise may run (--time-limit)
USAGE = """usage: grade.py [DIR] [--case E:N] [--time-limit SECONDS]

Grade the exercises in DIR (default: tutorials/exercises/), one line each: not yet written, correct,
or wrong at the smallest failing case, with what differs and a command that reruns that case.

  DIR                   a folder with chain_rule.py, tree_attention.py, recursive_rejection.py and
                        write_the_loop.py (tutorials/exercises/solutions/ holds reference solutions)
  --case E:N            rerun case N of exercise E alone and print it in full; your code's output
                        and tracebacks show (grading hides them)
  --time-limit SECONDS  how long each exercise may run before it counts as wrong (default 60)
  -h, --help            this help

Exit status: 0 when every exercise is correct, 1 otherwise, 2 for a usage error, 130 on Ctrl-C."""


class Wrong(Exception):
    """A case the learner's code fails: the verdict, the lines that diagnose it, and more for --case."""

    def __init__(self, line: str, diagnosis=(), detail=()):
        super().__init__(line)
        self.line, self.diagnosis, self.detail = line, list(diagnosis), list(detail)


def show(dist) -> str:
    """{token: probability} (or a [V] array) as '{0: 0.25, 2: 0.75}', zero entries left out."""
    items = dist.items() if isinstance(dist, dict) else enumerate(np.asarray(dist).tolist())
    return "{" + ", ".join(f"{int(t)}: {p:.3g}" for t, p in sorted(items) if p > MAX_TV) + "}"


def same(a: dict, b: dict, tol: float = 1e-9) -> bool:
    return all(abs(a.get(x, 0.0) - b.get(x, 0.0)) <= tol for x in set(a) | set(b))


# -- exercises 1 and 3, the rules: exact enumeration over small tables ---------------------------
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


# (V, draft tokens in the chain, seed) and (V, widths, seed), smallest first. The second case of each
# is two levels deep, with a q row per level that differs from the others: a rule that reads another
# node's q (the root's at every level, the child's) fails there. A chain's first case has p and q
# with full support; later ones have zeros, and q rows that are a single token.
CHAIN_CASES = [(2, 1, 4), (3, 2, 1), (2, 1, 0), (2, 2, 1), (3, 1, 2), (4, 2, 4), (3, 3, 5)]
TREE_CASES = [(2, (2,), 0), (3, (2, 1), 1), (3, (2,), 1), (3, (3,), 2), (4, (2,), 4), (3, (2, 2), 5),
              (4, (3, 1), 6)]


def checked_step(tree, path, token, V: int) -> tuple:
    """(path, token) as ints, if path is a root-to-node path of the tree and token a token id."""
    path = [int(i) for i in path]
    steps = zip(path, path[1:])
    if not path or path[0] != 0 or any(not 0 < b < len(tree) or tree.parents[b] != a for a, b in steps):
        raise Wrong(f"the returned path {path} is not a root-to-node path of the tree with parents "
                    f"{tree.parents.tolist()}")
    if not 0 <= int(token) < V:
        raise Wrong(f"the returned token {token} is not a token id (0 to {V - 1})")
    return tuple(path), int(token)


def rule_outcomes(rule, P, Q, widths, replacement: bool) -> tuple[dict, dict]:
    """({(tree tokens, tree parents, path, token): probability} over every tree drawn from Q and every
    random choice of `rule` on it, {(tree tokens, tree parents): the tree})."""
    trees = {}

    def run(rand):
        tree = build.build_fixed(0, lambda tokens, parents, nodes: Q[tokens[nodes]], widths, rand=rand,
                                 replacement=replacement)
        key = tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())
        trees[key] = copy_tree(tree)
        path, token = rule(tree, P[tree.tokens], rand)
        return key + checked_step(tree, path, token, len(P))

    return enumerate_outcomes(run), trees


def enumerate_outcomes(fn) -> dict:
    """exact.outcomes(fn), with a word for the learner when fn takes randomness from elsewhere than rand."""
    try:
        return exact.outcomes(fn)
    except RuntimeError as e:
        if "not deterministic" not in str(e):
            raise
        raise Wrong("given the same answers from rand your code did not make the same calls: take every random "
                    "choice from rand (rand.coin, rand.draw), nothing else") from None


def emitted_distribution(outcomes: dict, P, m: int) -> dict:
    """{m tokens: probability}: each step's tokens (the accepted drafts, then the rule's token),
    continued by the target where the step emitted fewer than m."""
    dist = {}
    for (tokens, _, path, token), pr in outcomes.items():
        head = tuple(tokens[i] for i in path[1:]) + (token,)
        for tail, pt in exact.sequence_distribution(lambda ctx: P[ctx[-1]], head, m - len(head)).items():
            dist[head + tail] = dist.get(head + tail, 0.0) + pr * pt
    return dist


def first_token(dist: dict, target) -> str:
    """The diagnosis line: the first emitted token's distribution beside the target's."""
    mine = exact.marginal(dist, lambda seq: seq[0])
    verdict = "the same" if same(mine, dict(enumerate(np.asarray(target).tolist()))) else "they differ"
    return f"first token: yours {show(mine)}, the target's {show(target)} ({verdict})"


class Walk:
    """The rand of one scripted walk through a rule: coins answer from `script` (beyond it, yes where
    possible), a draw returns its likeliest token, and every call is logged."""

    def __init__(self, script):
        self.script, self.log = list(script), []  # log: ("coin", probability, answer) or ("draw", [V] or None)

    def coin(self, prob) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        i = sum(e[0] == "coin" for e in self.log)
        ok = self.script[i] if i < len(self.script) else prob > SURE
        self.log.append(("coin", prob, ok))
        return ok

    def draw(self, probs) -> int:
        w = np.asarray(probs, dtype=np.float64)
        good = w.sum() > 0 and (w >= 0).all()
        self.log.append(("draw", w / w.sum() if good else None, None))
        return int(np.argmax(w))


def describe(event) -> str:
    if event is None:
        return "end the step there"
    if event[0] == "coin":
        return f"toss a coin of probability {event[1]:.3g}"
    return "draw from weights that are not a distribution" if event[1] is None else f"draw from {show(event[1])}"


def first_difference(rule, reference, tree: Tree, P, name: str):
    """The first coin, draw or returned path where `rule` departs from the library's `reference` on
    `tree`, over every way the library's coins can fall (None if it never does)."""
    todo = [()]
    while todo:
        script = todo.pop()
        lib = Walk(script)
        verdict = reference(copy_tree(tree), P[tree.tokens], lib)
        lib_path, tested = verdict.path, [(c.node, c.token) for c in verdict.tests if c.test != "draw"]
        coins = [e for e in lib.log if e[0] == "coin"]
        answers = [ok for _, _, ok in coins]
        for i in range(len(script), len(coins)):  # the other way each new coin could fall
            if SURE < coins[i][1] < 1 - SURE:
                todo.append(tuple(answers[:i]) + (not answers[i],))
        mine = Walk(script)
        try:
            my_path, _ = rule(copy_tree(tree), P[tree.tokens], mine)
        except Exception as e:
            return f"{walked(tested, answers)}: your rule raises {failure(e)}"
        n_coins = 0
        for a, b in zip_longest(mine.log, lib.log):
            where = walked(tested[:n_coins], answers[:n_coins])
            if b is None:
                return f"{where}: the library's {name} ends the step; you {describe(a)}"
            if a is None or a[0] != b[0] or (b[0] == "coin" and not abs(a[1] - b[1]) <= 1e-9) or (
                    b[0] == "draw" and (a[1] is None or not np.allclose(a[1], b[1], rtol=0, atol=1e-9))):
                if b[0] == "coin":
                    node, token = tested[n_coins]
                    lib_does = f"tests node {node} (token {token}) with a coin of probability {b[1]:.3g}"
                else:
                    lib_does = f"draws from {show(b[1])}"
                return f"{where}: the library's {name} {lib_does}; you {describe(a)}"
            n_coins += b[0] == "coin"
        if [int(i) for i in my_path] != [int(i) for i in lib_path]:
            return (f"{walked(tested, answers)}: your path is {[int(i) for i in my_path]}, the library's "
                    f"{name}'s {[int(i) for i in lib_path]}")
    return None


def walked(tested, answers) -> str:
    """Where a walk is: 'at the first test', or 'with node 1 accepted, node 2 rejected'."""
    if not tested:
        return "at the first test"
    return "with " + ", ".join(f"node {node} {'accepted' if ok else 'rejected'}"
                               for (node, _), ok in zip(tested, answers))


def copy_tree(tree: Tree) -> Tree:
    """A copy a rule may change without harm."""
    return Tree(tree.tokens.copy(), tree.parents.copy(), tree.q.copy(), tree.kind, tree.draft_dists.copy())


def rule_case(name: str, reference, V: int, widths, seed: int, replacement: bool):
    """The check of one rule case: TV to the target and, if wrong, where the rule departs from the library's."""
    P, Q = tables(V, seed)
    m = len(widths) + 1

    def check(funcs):
        mine, trees = rule_outcomes(funcs[name], P, Q, widths, replacement)
        emitted = emitted_distribution(mine, P, m)
        tv = exact.total_variation(emitted, exact.sequence_distribution(lambda ctx: P[ctx[-1]], (0,), m))
        if tv < MAX_TV:
            return
        diagnosis = [first_token(emitted, P[0])]
        detail = [f"target P (row t: after token t):\n{np.round(P, 3)}", f"draft Q:\n{np.round(Q, 3)}"]
        drawn = exact.marginal(mine, lambda outcome: outcome[:2])  # {tree: its probability}
        for key in sorted(drawn, key=lambda key: -drawn[key]):  # the likeliest tree where the rules part
            line = first_difference(funcs[name], reference, trees[key], P, reference.__name__)
            if line:
                diagnosis.append(f"on the tree with tokens {list(key[0])} and parents {list(key[1])} (drawn with "
                                 f"probability {drawn[key]:.3g}), {line}")
                detail += [f"node {i}: token {t}, parent {parent}, p after it {show(P[t])}"
                           + (f", its children drawn from q = {show(Q[t])}" if i in key[1] else "")
                           for i, (t, parent) in enumerate(zip(*key))]
                break
        raise Wrong(f"TV {tv:.3g} from the target's distribution", diagnosis, detail)

    return check


def chain_cases():
    return [(f"V={V}, a chain of {k}", rule_case("verify_chain", verify_chain, V, [1] * k, seed, True))
            for V, k, seed in CHAIN_CASES]


def tree_cases():
    return [(f"V={V}, widths {','.join(map(str, w))}", rule_case("verify_recursive_wor", verify_recursive_wor, V, w,
                                                                  seed, False))
            for V, w, seed in TREE_CASES]


# -- exercise 2, the mask and positions: each node against its path fed alone --------------------
TINY = dict(n_vocab=16, n_ctx=32, n_embd=16, n_layer=2, n_head=2)  # a GPT2Config
CONTEXT = [3, 1, 4]


def random_trees(count: int = 14, seed: int = 0) -> list[Tree]:
    """Random trees of 2 to 8 nodes, smallest first (parents[i] drawn below i, tokens at random)."""
    rng = np.random.default_rng(seed)
    trees = []
    for i in range(count):
        n = 2 + i // 2
        parents = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]
        trees.append(Tree(rng.integers(0, TINY["n_vocab"], n), parents, np.ones(n)))
    return trees


def mask_case(model, tree: Tree):
    def check(funcs):
        mask = np.asarray(funcs["attention_mask"](tree))
        pos = np.asarray(funcs["positions"](tree, len(CONTEXT)))
        n = len(tree)
        if mask.shape != (n, n):
            raise Wrong(f"attention_mask returned shape {mask.shape} for a tree of {n} nodes, expected ({n}, {n})")
        if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer):
            raise Wrong(f"positions returned {pos.dtype} shape {pos.shape} for a tree of {n} nodes, "
                        f"expected ({n},) ints")
        cache = new_cache(model)
        forward(model, CONTEXT, cache)
        logits = forward(model, tree.tokens, cache, positions=pos, mask=mask.astype(bool))  # [n, V]
        diffs = []
        for i in range(n):
            chain = CONTEXT + [int(t) for t in tree.tokens[path_to(tree, i)]]
            alone = forward(model, chain, new_cache(model))[-1]  # [V]
            diffs.append(float(np.abs(logits[i] - alone).max()))
        node = int(np.argmax(np.array(diffs) >= MAX_LOGIT_DIFF))
        if diffs[node] < MAX_LOGIT_DIFF:
            return
        path = [int(j) for j in path_to(tree, node)]
        raise Wrong(f"node {node}'s logits differ by {diffs[node]:.3g} from its path fed alone as a chain",
                    [f"node {node}'s path is {' -> '.join(map(str, path))}; your mask lets it see nodes "
                     f"{np.flatnonzero(mask[node]).tolist()}; your positions along its path: {pos[path].tolist()} "
                     f"(the cache holds {len(CONTEXT)} tokens, positions 0 to {len(CONTEXT) - 1})"],
                    [f"tokens {tree.tokens.tolist()}, parents {tree.parents.tolist()}",
                     f"your mask:\n{mask.astype(int)}", f"your positions: {pos.tolist()}",
                     "largest logit difference per node: " + ", ".join(f"{d:.3g}" for d in diffs)])

    return check


def mask_cases():
    model = random_params(GPT2Config(**TINY), seed=0, dtype=np.float64, scale=0.3)
    return [(f"the tree with parents {t.parents.tolist()}", mask_case(model, t)) for t in random_trees()]


# -- exercise 4, the loop: a tiny target and draft, against generate and the target --------------
LOOP = dict(n_vocab=16, n_ctx=64, n_embd=16, n_layer=2, n_head=2)  # a GPT2Config
PROMPT = [3, 1, 4]


def loop_models():  # -> target, draft
    """A tiny random target and a draft from the same random numbers at a smaller scale: the draft's
    guesses are often the target's, not always (rejections, and steps where all are accepted)."""
    config = GPT2Config(**LOOP)
    return (random_params(config, seed=1, dtype=np.float64, scale=1.0),
            random_params(config, seed=1, dtype=np.float64, scale=0.7))


def run_loop(funcs, target, draft, n: int, k: int, rand, settings) -> list[int]:
    tokens = funcs["speculative_decode"](target, draft, list(PROMPT), n, k, rand, settings)
    tokens = [int(t) for t in tokens]
    if len(tokens) != n:
        raise Wrong(f"speculative_decode returned {len(tokens)} tokens, expected n_new = {n}")
    return tokens


def tokens_case(target, draft, n: int, k: int, seed: int, settings, after_exact: bool):
    """Your loop's tokens against generate(method="speculative")'s, with the same seed."""
    temperature, top_k, top_p = settings

    def check(funcs):
        mine = run_loop(funcs, target, draft, n, k, Rand(seed), settings)
        lib = generate(target, PROMPT, n, method="speculative", draft=draft, plan=Plan(chain=k), eos=None,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed).tokens
        if mine == lib:
            return
        i = next(i for i, (a, b) in enumerate(zip(mine, lib)) if a != b)
        diagnosis = [f"yours:      {mine}", f"generate's: {lib}"]
        if temperature == 0:
            diagnosis.append("at temperature 0 p and q are one-hot: a guess is kept if it is the target's argmax, "
                             "and a rejection's token is the target's argmax: the tokens are plain greedy decoding's, "
                             "whatever the draft guesses")
        elif after_exact:
            diagnosis.append("your tokens passed the exact checks (distributed as the target's), so your loop "
                             "uses the random numbers otherwise than generate: per step the k draws of the guesses, "
                             "then rand.coin(min(1, p/q)) per guess (True keeps it) up to the first rejection, then "
                             "one draw; or the draft's cache holds other tokens than generate's, so it guesses "
                             "differently")
        raise Wrong(f"token {i + 1} of {n} differs: yours {mine[i]}, generate's {lib[i]}", diagnosis)

    return check


def exact_case(target, draft, n: int, k: int, settings):
    """The distribution of your loop's first n tokens, enumerated exactly, against the target's."""
    def check(funcs):
        mine = enumerate_outcomes(lambda rand: tuple(run_loop(funcs, target, draft, n, k, rand, settings)))
        ref = exact.sequence_distribution(
            lambda ctx: process(forward(target, list(ctx), new_cache(target))[-1], *settings), tuple(PROMPT), n)
        tv = exact.total_variation(mine, ref)
        if tv < MAX_TV:
            return
        tokens = [(exact.marginal(mine, lambda s: s[j]), exact.marginal(ref, lambda s: s[j])) for j in range(n)]
        i = next(j for j, (a, b) in enumerate(tokens) if not same(a, b))
        diagnosis = [first_token(mine, tokens[0][1])]
        if i:
            diagnosis.append(f"the first token whose distribution differs: token {i + 1}, yours {show(tokens[i][0])}, "
                             f"the target's {show(tokens[i][1])}")
        first = [process(forward(model, PROMPT, new_cache(model))[-1], *settings) for model in (target, draft)]
        detail = [f"after the prompt {PROMPT}: the target's p {show(first[0])}, the draft's q {show(first[1])}",
                  f"{len(ref)} possible sequences; yours gives {len(mine)}"]
        detail += [f"token {j + 1}: yours {show(a)}, the target's {show(b)}" for j, (a, b) in enumerate(tokens)]
        raise Wrong(f"TV {tv:.3g} from the target's distribution of {n} tokens", diagnosis, detail)

    return check


def loop_cases():
    """Greedy first (a wrong cache shows as a wrong token), then the exact distributions (a wrong rule),
    then seeded runs (the order of the random numbers), smallest first within each."""
    target, draft = loop_models()
    greedy, same_draft = (0.0, None, None), "the draft = the target"  # every guess kept: the bonus token's path
    return [
        (f"temperature 0, k=2, {same_draft}, 8 tokens", tokens_case(target, target, 8, 2, 0, greedy, False)),
        ("temperature 0, k=3, 12 tokens", tokens_case(target, draft, 12, 3, 0, greedy, False)),
        ("exact, temperature 1 top-k 2, k=1, 3 tokens", exact_case(target, draft, 3, 1, (1.0, 2, None))),
        ("exact, temperature 1 top-k 2, k=2, 3 tokens", exact_case(target, draft, 3, 2, (1.0, 2, None))),
        ("exact, temperature 1 top-k 3, k=1, 3 tokens", exact_case(target, draft, 3, 1, (1.0, 3, None))),
        ("seed 0, temperature 1 top-k 8, k=3, 20 tokens", tokens_case(target, draft, 20, 3, 0, (1.0, 8, None), True)),
        (f"seed 1, temperature 1, k=2, {same_draft}, 16 tokens",
         tokens_case(target, target, 16, 2, 1, (1.0, None, None), True)),
        ("seed 2, temperature 0.8 top-p 0.9, k=4, 24 tokens",
         tokens_case(target, draft, 24, 4, 2, (0.8, None, 0.9), True)),
    ]


# -- the exercises, each graded apart ------------------------------------------------------------
EXERCISES = [  # (title, file, the functions it defines, its cases)
    ("chain rule with its residual", "chain_rule.py", ("verify_chain",), chain_cases),
    ("tree attention mask and positions", "tree_attention.py", ("attention_mask", "positions"), mask_cases),
    ("recursive rejection without replacement", "recursive_rejection.py", ("verify_recursive_wor",), tree_cases),
    ("the speculative decoding loop", "write_the_loop.py", ("speculative_decode",), loop_cases),
]


def load(path: Path, names) -> dict:
    """The named functions of the file at `path` (Wrong if it cannot be imported or lacks one)."""
    if not path.is_file():
        raise Wrong(f"{path} is missing")
    try:
        spec = importlib.util.spec_from_file_location(f"exercise_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit and KeyboardInterrupt too: importing a solution must not end the grading
        raise Wrong(f"importing {path.name} raised {failure(e)}") from None
    missing = [n for n in names if not callable(getattr(module, n, None))]
    if missing:
        raise Wrong(f"{path.name} defines no function {missing[0]}")
    return {n: getattr(module, n) for n in names}


def failure(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def rerun_command(n: int, i: int, folder: Path) -> str:
    """The command that reruns case i of exercise n alone, paths relative to here where shorter."""
    def short(path) -> str:
        rel = os.path.relpath(path)
        return rel if not rel.startswith("..") else str(path)

    where = [] if Path(folder).resolve() == HERE else [short(folder)]
    return shlex.join([short(sys.executable), short(HERE / "grade.py"), *where, "--case", f"{n}:{i}"])


def grade(n: int, folder: Path) -> tuple[str, str, list]:
    """(status, line, diagnosis lines) of exercise n on the files in `folder`, in this process:
    status is "not yet written", "correct" or "wrong"; the learner's exceptions become "wrong"."""
    title, filename, names, make_cases = EXERCISES[n - 1]
    try:
        funcs = load(Path(folder) / filename, names)
        cases = make_cases()
        for i, (name, check) in enumerate(cases, 1):
            where = f"case {i} of {len(cases)} ({name})"
            try:
                with np.errstate(all="ignore"):  # a wrong rule's 1/0: the verdict says what matters (--case shows it)
                    check(funcs)
            except NotImplementedError:
                raise
            except Wrong as e:
                raise Wrong(f"{where}: {e.line}", e.diagnosis + [f"rerun: {rerun_command(n, i, folder)}"]) from None
            except BaseException as e:  # anything the learner's code raised or ended with: one line, no traceback
                raise Wrong(f"{where}: {failure(e)}", [f"rerun: {rerun_command(n, i, folder)}"]) from None
        return "correct", f"correct ({len(cases)} cases)", []
    except NotImplementedError:
        return "not yet written", "not yet written", []
    except Wrong as e:
        return "wrong", f"wrong: {e.line}", e.diagnosis


def rerun(n: int, i: int, folder: Path) -> int:
    """--case n:i: run one case in this process and print it in full (the learner's output and tracebacks show)."""
    title, filename, names, make_cases = EXERCISES[n - 1]
    cases = make_cases()
    if not 1 <= i <= len(cases):
        print(f"grade.py: --case {n}:{i}: exercise {n} has cases 1 to {len(cases)}", file=sys.stderr)
        return 2
    name, check = cases[i - 1]
    print(f"exercise {n}, {title} ({filename}), case {i} of {len(cases)} ({name})", flush=True)
    try:
        check(load(Path(folder) / filename, names))
    except NotImplementedError:
        print("not yet written")
        return 1
    except Wrong as e:
        print(f"wrong: {e.line}", *e.diagnosis, *e.detail, sep="\n")
        return 1
    print("correct")
    return 0


def worker(n: int, folder: Path, result: Path, time_limit: float) -> None:
    """The grading process of one exercise: its verdict goes to `result` as JSON, then it ends at once
    (a thread or exit handler the learner's code left behind cannot hold it). Should the grader die
    without stopping it, its own alarm ends it soon after the time limit."""
    signal.alarm(int(time_limit) + 10)
    status, line, diagnosis = grade(n, folder)
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
    """Kill the grading process and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def grade_apart(n: int, folder: Path, time_limit: float) -> tuple[str, str, list]:
    """grade(n, folder) in a process of its own, at most `time_limit` seconds; an exit, a hang or a
    crash of the learner's code is a "wrong" with its reason."""
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        result = Path(tmp) / "result.json"
        proc = subprocess.Popen([sys.executable, str(HERE / "grade.py"), "--worker", str(n), str(folder), str(result),
                                 str(time_limit)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # Ctrl-C reaches only the grader
        tail = Tail(proc.stdout)
        try:
            proc.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:
            stop(proc)
            return "wrong", (f"wrong: no verdict within {time_limit:g} s: an endless loop? (--time-limit SECONDS "
                             "allows more)"), []
        except BaseException:
            stop(proc)
            raise
        tail.join(timeout=5)
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


def parse(argv) -> dict:
    """The command line as a dict; ValueError with a one-line message for a bad one."""
    opts = {"folder": None, "case": None, "time_limit": TIME_LIMIT}
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("--case", "--time-limit") or a.startswith(("--case=", "--time-limit=")):
            name, _, value = a.partition("=")
            if not value:
                if not args:
                    raise ValueError(f"{name} needs a value")
                value = args.pop(0)
            if name == "--case":
                e, _, i = value.partition(":")
                if not (e.isdigit() and i.isdigit() and 1 <= int(e) <= len(EXERCISES)):
                    raise ValueError(f"--case wants EXERCISE:CASE with EXERCISE 1 to {len(EXERCISES)}, e.g. "
                                     f"--case 1:2, got {value!r}")
                opts["case"] = int(e), int(i)
            else:
                try:
                    opts["time_limit"] = float(value)
                except ValueError:
                    opts["time_limit"] = 0.0
                if not 0 < opts["time_limit"] <= 86400:
                    raise ValueError(f"--time-limit wants a number of seconds above 0 (at most 86400), got {value!r}")
        elif a.startswith("-") and a != "-":
            raise ValueError(f"unknown option {a} (see --help)")
        elif opts["folder"] is not None:
            raise ValueError(f"give one folder of exercises, got two: {opts['folder']} and {a}")
        else:
            opts["folder"] = a
    folder = Path(opts["folder"]) if opts["folder"] is not None else HERE
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder (give the folder that holds the exercise files)")
    opts["folder"] = folder.resolve()
    return opts


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if MISSING:
        print(f"grade.py: this Python ({sys.executable}) cannot import {MISSING}: run `make exercises`, or "
              "`.venv/bin/python tutorials/exercises/grade.py` (`make venv` creates .venv)", file=sys.stderr)
        return 2
    if argv[:1] == ["--worker"] and len(argv) == 5:  # grade_apart's process: --worker N DIR RESULT SECONDS
        worker(int(argv[1]), Path(argv[2]), Path(argv[3]), float(argv[4]))
    try:
        opts = parse(argv)
    except ValueError as e:
        print(f"grade.py: {e}", file=sys.stderr)
        return 2
    if opts["case"]:
        return rerun(*opts["case"], opts["folder"])
    for sig in (signal.SIGTERM, signal.SIGHUP):  # killed politely: stop the worker on the way out (grade_apart)
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    statuses = []
    for n, (title, filename, _, _) in enumerate(EXERCISES, 1):
        status, line, diagnosis = grade_apart(n, opts["folder"], opts["time_limit"])
        statuses.append(status)
        print(f"exercise {n}, {title} ({filename}): {line}", *(f"    {d}" for d in diagnosis), sep="\n", flush=True)
    return 0 if all(s == "correct" for s in statuses) else 1


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the goodbye
        print("grade.py: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:  # `grade.py | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
