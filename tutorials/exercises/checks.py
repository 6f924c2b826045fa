"""What each exercise is checked against (grade.py runs these checks and prints their verdicts).

- The rules (exercises 1 and 3) by the library's exact one-step check (`specdec_np.proofs.exact`):
  over small p/q tables and tree shapes, smallest first, every tree drawn from q and every random
  choice of the rule enumerated, the emitted tokens (continued by the target where a step emitted
  fewer) must be distributed as the target's: total variation < 1e-12, no sampling noise. Exercise 1
  must also keep what block verification keeps (the same distribution of trees, paths and tokens as
  `verify_block`'s: lesson 3's token-wise rule is lossless but keeps fewer). Where a rule fails, yours
  and the library's (`specdec_np.verify`) walk the same tree with the same coin outcomes, and the first
  coin, draw or returned path that differs is named.
- The accepted path kept in the cache (exercise 2), on random trees, smallest first: a tiny random
  GPT-2 in float64 scores the tree in one pass (the library's mask and positions), your keep_path
  keeps a root-to-node path, and the cache's length, keys and values must be those of a plain prefill
  of the prefix and the path (difference < 1e-9); the first slot that differs is named, with the node
  whose rows it holds.
- The loop (exercise 4), on a tiny random target and draft in float64: at temperature 0 it must emit
  the tokens of `generate(method="speculative")`; sampled, its first tokens must be distributed
  exactly as the target's (TV < 1e-12), and with a seed it must emit generate's very tokens (the same
  random numbers, drawn in the same order). After each step, when a cache is next used, it must hold
  what lesson 4's loop's does (the target's every committed token but the last, the draft's at most
  as many, each row the committed token's): the first step and cache that differ are named, before any
  draw is compared. Where the draws differ, lesson 4's loop (the solution, its one home) is replayed
  with your outcomes and the first coin or draw that differs is named with its step.
- The EAGLE head's step (exercise 5), on the embedded target and head in float64, over a few greedy
  chain steps after a prompt: each step your q after the root and each node must be the library's
  drafter's (`eagle.FeatureDrafter`, as generate drives it; difference < 1e-9), you must feed the head
  as many rows as it does, and after your head_keep the head's cache must hold its pairs. Where q
  differs, the step is replayed by the library's head with each named mistake made (the feature before
  ln_f, one position off, every node on the root's guess) and the one your q matches is named; a cache
  of the wrong length is named by what it kept (the chain, or the accepted nodes' guessed pairs).

A check raises Wrong (a verdict, its diagnosis lines, and more detail for --case) when the learner's
code fails it. The checks run in the grader's process, on what the learner's functions return from
the worker (runner.py); `shared()` and `HARNESSES` are what the worker needs of this file. They test
honest attempts and do not police cheating: a solution could call the library's rules
(`specdec_np.verify.RULES`) or `KVCache.keep`.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from itertools import zip_longest
from pathlib import Path

import numpy as np

from specdec_np import build
from specdec_np.checkpoint import load as load_model
from specdec_np.decode import generate
from specdec_np.eagle import FeatureDrafter, head_features, head_logits, head_pass, load_head
from specdec_np.gpt2 import (GPT2Config, attention_bias, forward, layer_norm, new_cache, random_params,
                             transformer_block)
from specdec_np.kvcache import KVCache
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.sampling import Rand, process
from specdec_np.tree import Tree, attention_mask, path_to, positions
from specdec_np.verify import verify_block, verify_recursive_wor

MAX_TV = 1e-12
MAX_LOGIT_DIFF = 1e-9


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


def close(event, kind: str, value) -> bool:
    """Whether a logged call (see Walk) is a `kind` call of probability (coin) or distribution (draw) `value`."""
    if event is None or event[0] != kind:
        return False
    if kind == "coin":
        return abs(event[1] - value) <= 1e-9
    return event[1] is not None and np.allclose(event[1], value, rtol=0, atol=1e-9)


def first_token(dist: dict, target) -> str:
    """The diagnosis line: the first emitted token's distribution beside the target's."""
    mine = exact.marginal(dist, lambda seq: seq[0])
    verdict = "the same" if same(mine, dict(enumerate(np.asarray(target).tolist()))) else "they differ"
    return f"first token: yours {show(mine)}, the target's {show(target)} ({verdict})"


def enumerate_outcomes(fn, *args):
    """fn(*args) (exact.outcomes or a function built on it), with a word for the learner when their
    code takes randomness from elsewhere than rand."""
    try:
        return fn(*args)
    except RuntimeError as e:
        if "not deterministic" not in str(e):
            raise
        raise Wrong("given the same answers from rand your code did not make the same calls: take every random "
                    "choice from rand (rand.coin, rand.draw), nothing else") from None


# -- exercises 1 and 3, the rules: the exact one-step check over small tables --------------------
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


# (V, draft tokens in the chain, seed) and (V, widths, seed), smallest first; every tree drawn has
# exactly these widths. The second case of each is two levels deep, with a q row per level that
# differs from the others: a rule that reads another node's q (the root's at every level, the
# child's) fails there. A chain's first case has p and q with full support; later ones have zeros,
# and q rows that are a single token.
CHAIN_CASES = [(2, 1, 4), (3, 2, 1), (2, 1, 0), (2, 2, 1), (3, 1, 2), (4, 2, 4), (3, 3, 5)]
TREE_CASES = [(2, (1,), 0), (3, (2, 1), 1), (3, (2,), 1), (3, (3,), 0), (4, (2,), 4), (3, (2, 2), 5),
              (4, (3, 1), 6)]


def checked(rule, V: int):
    """`rule`, its (path, token) checked: path a root-to-node path of the tree, token a token id."""
    def run(tree, p, rand):
        parents = tree.parents.tolist()  # before the rule runs: it may change the tree
        path, token = rule(tree, p, rand)
        path = [int(i) for i in path]
        if not path or path[0] != 0 or any(not 0 < b < len(parents) or parents[b] != a for a, b in zip(path, path[1:])):
            raise Wrong(f"the returned path {path} is not a root-to-node path of the tree with parents {parents}")
        if not 0 <= int(token) < V:
            raise Wrong(f"the returned token {token} is not a token id (0 to {V - 1})")
        return path, int(token)
    return run


class Walk(exact.ScriptedRand):
    """The rand of one scripted walk through a rule: the enumerator's coins, answered by `script`
    (option 0, yes, beyond it); a draw returns its likeliest token; every call is logged."""

    def __init__(self, script):
        super().__init__(script)
        self.log = []  # ("coin", probability, answer) or ("draw", [V] or None, None)

    def choose(self, options):  # the script's option, or a certain coin's only one
        i = len(self.n_options)
        self.n_options.append(len(options))
        return options[min(self.script[i] if i < len(self.script) else 0, len(options) - 1)][0]

    def coin(self, prob) -> bool:
        ok = super().coin(prob)
        self.log.append(("coin", min(max(float(prob), 0.0), 1.0), ok))
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
        answers = [ok for kind, _, ok in lib.log if kind == "coin"]
        taken = list(script) + [0] * (len(lib.n_options) - len(script))
        todo += [tuple(taken[:i]) + (1,) for i in range(len(script), len(lib.n_options)) if lib.n_options[i] == 2]
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
            if not close(a, b[0], b[1]):
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


def rule_case(name: str, reference, V: int, widths, seed: int, replacement: bool, same_steps: bool = False):
    """The check of one rule case: TV to the target and, if wrong, where the rule departs from the library's.
    same_steps: the rule must also keep what `reference` keeps (the same (tree, path, token) distribution)."""
    P, Q = tables(V, seed)
    m = len(widths) + 1
    target, draft = (lambda ctx: P[ctx[-1]]), (lambda ctx: Q[ctx[-1]])
    trees = {}  # {(tokens, parents): the tree as drawn}

    def drawn(root, dist_fn, rand):
        tree = build.build_fixed(root, dist_fn, widths, rand=rand, replacement=replacement)
        trees[tuple(tree.tokens.tolist()), tuple(tree.parents.tolist())] = copy_tree(tree)
        return tree

    def parting(rule, steps, diagnosis: list, detail: list) -> None:
        """The likeliest tree where `rule` and the reference part, and how, added to the diagnosis."""
        chance = exact.marginal(steps, lambda step: step[:2])  # {tree: its probability}
        for key in sorted(chance, key=lambda key: -chance[key]):
            line = first_difference(rule, reference, trees[key], P, reference.__name__)
            if line:
                diagnosis.append(f"on the tree with tokens {list(key[0])} and parents {list(key[1])} (drawn with "
                                 f"probability {chance[key]:.3g}), {line}")
                detail += [f"node {i}: token {t}, parent {parent}, p after it {show(P[t])}"
                           + (f", its children drawn from q = {show(Q[t])}" if i in key[1] else "")
                           for i, (t, parent) in enumerate(zip(*key))]
                return

    def check(funcs):
        steps = enumerate_outcomes(exact.step_outcomes, drawn, checked(funcs[name], V), draft, target, 0)
        emitted = exact.emitted_distribution(steps, target, 0, m)
        tv = exact.total_variation(emitted, exact.sequence_distribution(target, (0,), m))
        detail = [f"target P (row t: after token t):\n{np.round(P, 3)}", f"draft Q:\n{np.round(Q, 3)}"]
        if tv >= MAX_TV:
            diagnosis = [first_token(emitted, P[0])]
            parting(funcs[name], steps, diagnosis, detail)
            raise Wrong(f"TV {tv:.3g} from the target's distribution", diagnosis, detail)
        if not same_steps:
            return
        ours = exact.step_outcomes(drawn, reference, draft, target, 0)
        if exact.total_variation(steps, ours) < MAX_TV:
            return
        kept = [sum(pr * (len(step[2]) - 1) for step, pr in dist.items()) for dist in (steps, ours)]
        diagnosis = []
        parting(funcs[name], steps, diagnosis, detail)
        raise Wrong(f"lossless, but not {reference.__name__}: your rule keeps {kept[0]:.4g} guesses a step on "
                    f"average, {reference.__name__} {kept[1]:.4g}", diagnosis, detail)

    return check


def chain_cases():
    return [(f"V={V}, a chain of {k}", rule_case("verify_block", verify_block, V, [1] * k, seed, True, True))
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


def keep_case(model, tree: Tree, node: int):
    """Your keep_path after a tree pass, for the path to `node`: the cache as a plain prefill of the path leaves it."""
    path = [int(j) for j in path_to(tree, node)]

    def check(funcs):
        cache = new_cache(model)
        forward(model, CONTEXT, cache)
        start = cache.length
        forward(model, tree.tokens, cache, positions=positions(tree, start), mask=attention_mask(tree))
        block = [cache.k[:, :, start:cache.length].copy(), cache.v[:, :, start:cache.length].copy()]  # node order
        funcs["keep_path"](cache, start, list(path))
        ref = new_cache(model)
        forward(model, CONTEXT + [int(t) for t in tree.tokens[path]], ref)
        detail = [f"tokens {tree.tokens.tolist()}, parents {tree.parents.tolist()}, the path {path}, the block "
                  f"at slots {start} to {start + len(tree) - 1}"]
        if not isinstance(cache.length, int) or cache.length != ref.length:
            raise Wrong(f"after keep_path the cache's length is {cache.length}, expected {ref.length}: the "
                        f"prefix ({start}) and the path's {len(path)} nodes", [], detail)
        for name, mine, theirs, rows in (("keys", cache.k, ref.k, block[0]), ("values", cache.v, ref.v, block[1])):
            mine, n = np.asarray(mine), ref.length
            if mine.shape[:2] != theirs.shape[:2] or mine.shape[2] < n:
                raise Wrong(f"after keep_path the cache's {name} have shape {mine.shape}, expected {theirs.shape}")
            diff = np.abs(mine[:, :, :n] - theirs[:, :, :n]).max(axis=(0, 1, 3))  # [n]
            if diff.max() < MAX_LOGIT_DIFF:
                continue
            slot = int(np.argmax(diff >= MAX_LOGIT_DIFF))
            held = [i for i in range(len(tree)) if np.abs(mine[:, :, slot] - rows[:, :, i]).max() < MAX_LOGIT_DIFF]
            holds = f"node {held[0]}'s" if held else "no node's"
            where = (f"slot {slot} (the path's node {path[slot - start]}, position {slot}) holds {holds} {name}"
                     if slot >= start else f"slot {slot} of the prefix changed")
            raise Wrong(f"after keep_path {where}", [f"the path {path} of the tree with parents "
                                                     f"{tree.parents.tolist()}: its rows belong at slots {start} to "
                                                     f"{start + len(path) - 1}, in path order"], detail)

    return check


def keep_cases():
    model = shared()["mask model"]
    cases = []
    for i, tree in enumerate(random_trees()):
        node = len(tree) - 1 - i % 2  # the last node or the one before it ([0]: nothing kept, case 2)
        cases.append((f"the path to node {node} of the tree with parents {tree.parents.tolist()}",
                      keep_case(model, tree, node)))
    return cases


# -- exercise 4, the loop: a tiny target and draft, against generate and the target --------------
LOOP = dict(n_vocab=16, n_ctx=64, n_embd=16, n_layer=2, n_head=2)  # a GPT2Config
PROMPT = [3, 1, 4]
CACHE = "after a step the target's cache holds every committed token but the last (the draft's at most as many)"


def loop_models():  # -> target, draft
    """A tiny random target and a draft from the same random numbers at a smaller scale: the draft's
    guesses are often the target's, not always (rejections, and steps where all are accepted)."""
    return shared()["loop target"], shared()["loop draft"]


@functools.cache
def shared() -> dict:
    """The models the checks pass to the learner's code, made alike in the grader and its worker (they
    travel by name)."""
    config = GPT2Config(**LOOP)
    mask_model = random_params(GPT2Config(**TINY), seed=0, dtype=np.float64, scale=0.3)
    eagle_target = load_model("tiny-target", np.float64)
    head = load_head("tiny-eagle", eagle_target)  # bound to the float64 target: float64 too
    return {"loop target": random_params(config, seed=1, dtype=np.float64, scale=1.0),
            "loop draft": random_params(config, seed=1, dtype=np.float64, scale=0.7),
            "mask model": mask_model, "mask config": mask_model.config,
            "eagle target": eagle_target, "eagle head": head, "eagle head config": head.config}


class Calls:
    """`rand`, every call logged as Walk logs them, with its outcome: ("coin", probability, answer) or
    ("draw", the normalised weights, token)."""

    def __init__(self, rand):
        self.rand, self.log = rand, []

    def coin(self, prob) -> bool:
        ok = self.rand.coin(prob)
        self.log.append(("coin", min(max(float(prob), 0.0), 1.0), ok))
        return ok

    def draw(self, probs) -> int:
        token = self.rand.draw(probs)  # it refuses weights that are not a distribution
        w = np.asarray(probs, dtype=np.float64)
        self.log.append(("draw", w / w.sum(), token))
        return token


class Watch:
    """In the worker: your loop's rand and caches, watched. After each step, when a cache is next used, it
    must hold what lesson 4's loop keeps: the target's every committed token but the last, the draft's at
    most as many, each row the committed token's keys and values (the committed tokens are read from your
    calls of rand: a step's k guesses, its coins up to the first rejection, its last draw)."""

    def __init__(self, target, draft, prompt, k: int, rand, settings):
        self.models, self.prompt, self.k, self.rand, self.settings = (target, draft), list(prompt), k, rand, settings
        self.log = []  # ("coin", probability, answer) or ("draw", [V], token)
        self.p = []  # per step: the target's p rows of its verify pass
        self.targets, self.checked = set(), {"target": 0, "draft": 0}  # the verify passes' caches; steps checked
        self.reference = {}  # (model index, tokens) -> the keys of a plain prefill of them

    def coin(self, prob) -> bool:
        ok = self.rand.coin(prob)
        self.log.append(("coin", float(prob), ok))
        return ok

    def draw(self, probs) -> int:
        token = self.rand.draw(probs)
        self.log.append(("draw", np.asarray(probs, dtype=np.float64), int(token)))
        return token

    def steps(self):
        """([the committed tokens after each complete step], draws and coins of the step under way), or None
        where your calls leave lesson 4's order (the draws check names that)."""
        done, seq, i, k = [], list(self.prompt), 0, self.k
        while True:
            guesses = []
            while len(guesses) < k and i < len(self.log) and self.log[i][0] == "draw":
                guesses.append(self.log[i])
                i += 1
            if i == len(self.log):
                return done, len(guesses), 0
            if len(guesses) < k or len(self.p) <= len(done):
                return None
            p, accepted, coins = self.p[len(done)], [], 0
            while i < len(self.log) and len(accepted) == coins < k:
                (_, q, x), event = guesses[coins], self.log[i]
                q = q / q.sum()
                ratio = min(1.0, p[coins][x] / q[x]) if q[x] > 0 else None
                if event[0] == "coin" and ratio is not None and abs(event[1] - ratio) <= 1e-9:
                    accepted += [x] if event[2] else []
                    i += 1
                elif ratio == 1.0 and event[0] != "coin":  # a certain coin, not tossed: it draws no number
                    accepted.append(x)
                else:  # not lesson 4's coin: the committed tokens are unknown here
                    return None
                coins += 1
            if i == len(self.log):
                return done, k, coins
            if self.log[i][0] != "draw":
                return None
            seq += accepted + [self.log[i][2]]
            done.append(list(seq))
            i += 1

    def forward(self, model, tokens, cache, *args, **kwargs):
        state = self.steps()
        if state is not None:
            done, draws, coins = state
            if draws == self.k and coins == 0:  # the verify pass
                self.targets.add(id(cache))
            role = "target" if id(cache) in self.targets else "draft" if done or draws else None
            if role and len(done) > self.checked[role]:
                self.check(role, cache, done)
                self.checked[role] = len(done)
        logits = forward(model, tokens, cache, *args, **kwargs)
        if state is not None and state[1:] == (self.k, 0) and len(self.p) == len(state[0]):
            self.p.append(process(logits[-self.k - 1:], *self.settings))  # [k + 1, V]
        return logits

    def check(self, role: str, cache, done) -> None:
        """Wrong if `cache` does not hold what lesson 4's loop's `role` cache holds after len(done) steps."""
        s, committed = len(done), done[-1]
        m = len(committed) - 1  # every committed token but the last
        before = (done[-2] if s > 1 else self.prompt)
        kept = len(before) - 1 + min(self.k, len(committed) - len(before))  # lesson 4's draft keeps this many
        length = cache.length
        if role == "target" and length != m:
            how = "cut it back to the accepted guesses" if length > m else "it lost committed tokens"
            raise Wrong(f"after step {s} your target's cache holds {length} tokens, lesson 4's loop's {m}: every "
                        f"committed token but the last (the step committed {len(committed) - len(before)}): {how}")
        if role == "draft" and length > m:
            raise Wrong(f"after step {s} your draft's cache holds {length} tokens, more than the {m} committed "
                        f"tokens but the last (lesson 4's loop keeps {kept}): cut it back to the accepted guesses")
        model = self.models[role == "draft"]
        key = (role == "draft", tuple(committed[:length]))
        if key not in self.reference:
            ref = new_cache(model)
            forward(model, list(key[1]), ref)
            self.reference[key] = ref.k[:, :, :length].copy()
        diff = np.abs(np.asarray(cache.k[:, :, :length]) - self.reference[key]).max(axis=(0, 1, 3))  # [length]
        if length and diff.max() > 1e-9:
            j = int(np.argmax(diff > 1e-9))
            raise Wrong(f"after step {s} row {j} of your {role}'s cache is not committed token {j + 1}'s (token "
                        f"{committed[j]}): a cache keeps only the committed text, in order")


def loop_harness(module, fn, args):
    """In the worker: your speculative_decode(*args), its caches checked after each step (Watch), and a
    cache cut beyond what it holds named as such."""
    target, draft, prompt, n, k, rand, settings = args
    watch = Watch(target, draft, prompt, k, rand, settings)
    gpt2 = sys.modules["specdec_np.gpt2"]
    patched = [m for m in (module, gpt2) if getattr(m, "forward", None) is forward]
    for m in patched:
        m.forward = watch.forward
    import inspect

    given = {"forward": watch.forward} if "forward" in inspect.signature(fn).parameters else {}  # (the solution's)
    try:
        return fn(target, draft, prompt, n, k, watch, settings, **given)
    except ValueError as e:  # a cache cut beyond what it holds: name the invariant, not the traceback
        tb = e.__traceback__
        while tb.tb_next:
            tb = tb.tb_next
        cache, length = tb.tb_frame.f_locals.get("self"), tb.tb_frame.f_locals.get("length")
        if tb.tb_frame.f_code.co_name == "truncate" and isinstance(cache, KVCache):
            raise Wrong(f"your loop cuts a cache to {length} tokens when it holds {cache.length}: {CACHE}") from None
        raise
    finally:
        for m in patched:
            m.forward = forward


HARNESSES = {"loop": loop_harness}  # grade.py's worker runs exercise 4's calls through this


def run_loop(funcs, target, draft, n: int, k: int, rand, settings) -> list[int]:
    tokens = funcs["speculative_decode"](target, draft, list(PROMPT), n, k, rand, settings)
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise Wrong(f"speculative_decode returned {type(tokens).__name__}, expected a list of ints")
    if len(tokens) != n:
        raise Wrong(f"speculative_decode returned {len(tokens)} tokens, expected n_new = {n}")
    return tokens


class Departed(Exception):
    pass


def the_answer():
    """Exercise 4's solution, the one home of lesson 4's loop (lesson 4b shows it)."""
    spec = importlib.util.spec_from_file_location("the_loop_answer", Path(__file__).parent / "solutions" /
                                                  "write_the_loop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ANSWER = the_answer()


class Replay:
    """The rand of lesson 4's loop (the_answer()) replayed against your loop's calls of rand: each of its
    calls must be your next one and gets your outcome; the first that is not raises Departed. A certain coin
    (probability 1) you did not toss is no departure: it draws no random number."""

    def __init__(self, log, k: int, settings):
        self.log, self.i, self.k, self.settings = log, 0, k, settings
        self.step, self.qs, self.guesses, self.p, self.rejected, self.tested = 0, [], [], None, False, 0

    def forward(self, model, tokens, cache):  # gpt2.forward, the verify pass's rows kept as p
        logits = forward(model, tokens, cache)
        if self.step and len(self.qs) == self.k and self.p is None:
            self.p = process(logits, *self.settings)  # [k + 1, V]
        return logits

    def expect(self, kind, value, does, rows=()):
        mine = self.log[self.i] if self.i < len(self.log) else None
        if close(mine, kind, value):
            self.i += 1
            return mine[2]
        if kind == "coin" and value >= 1:
            return True
        you = "you make no more calls" if mine is None else f"you {describe(mine)}"
        known = [name for name, row in rows if close(mine, "draw", row / row.sum())]
        raise Departed(f"{does}; {you}" + (f", which is {known[0]}" if known else ""))

    def coin(self, prob) -> bool:
        j = self.tested
        self.tested += 1
        ok = self.expect("coin", prob, f"the test of guess {j + 1} (token {self.guesses[j]}): generate tosses a "
                         f"coin of probability min(1, p/q) = {prob:.3g}")
        self.rejected = not ok
        return ok

    def draw(self, weights) -> int:
        w = np.asarray(weights, dtype=np.float64)
        dist, k = w / w.sum(), self.k
        if len(self.qs) < k:  # a guess
            if not self.qs:
                self.step, self.tested, self.rejected, self.p = self.step + 1, 0, False, None
            j = len(self.qs)
            self.qs.append(dist)
            token = self.expect("draw", dist, f"guess {j + 1}: generate draws it from the draft's {show(dist)}")
            self.guesses.append(token)
            return token
        p, qs = self.p, self.qs
        rows = [(f"p[{j}]", p[j]) for j in range(k + 1)] + [(f"q[{j}]", q) for j, q in enumerate(qs)]
        if self.rejected:
            j = self.tested - 1
            token = self.expect("draw", dist, f"guess {j + 1} rejected: the correction is drawn from the residual "
                                f"max(p[{j}] - q[{j}], 0) = {show(dist)}", [rows[j], rows[k + 1 + j]] + rows)
        else:
            token = self.expect("draw", dist, f"every guess kept: the bonus token is drawn from p[k] = p[{k}], the "
                                f"target's distribution after the last guess, {show(dist)}",
                                [(f"p[k - 1] = p[{k - 1}]", p[k - 1])] + rows)
        self.qs, self.guesses = [], []
        return token


def departure(log, target, draft, n: int, k: int, settings):
    """The first call in `log` (your loop's calls of rand, each with its outcome) that the loop of
    lesson 4 does not make, following your outcomes: 'step 2, guess 1 rejected: ...', or None."""
    replay = Replay(log, k, settings)
    try:
        ANSWER.speculative_decode(target, draft, list(PROMPT), n, k, replay, settings, forward=replay.forward)
    except Departed as e:
        return f"step {replay.step}, {e}"
    return None


def tokens_case(target, draft, n: int, k: int, seed: int, settings, after_exact: bool):
    """Your loop's tokens against generate(method="speculative")'s, with the same seed."""
    temperature, top_k, top_p = settings

    def check(funcs):
        calls = Calls(Rand(seed))
        mine = run_loop(funcs, target, draft, n, k, calls, settings)
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
        diagnosis += [line for line in [departure(calls.log, target, draft, n, k, settings)] if line]
        raise Wrong(f"token {i + 1} of {n} differs: yours {mine[i]}, generate's {lib[i]}", diagnosis)

    return check


def exact_case(target, draft, n: int, k: int, settings):
    """The distribution of your loop's first n tokens, enumerated exactly, against the target's."""
    def check(funcs):
        runs = []  # (probability, calls of rand) of each of your loop's random branches

        def run(rand):
            calls = Calls(rand)
            tokens = tuple(run_loop(funcs, target, draft, n, k, calls, settings))
            runs.append((rand.prob, calls.log))
            return tokens

        mine = enumerate_outcomes(exact.outcomes, run)
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
        for prob, log in sorted(runs, key=lambda run: -run[0]):  # the likeliest branch where the loops part
            if line := departure(log, target, draft, n, k, settings):
                diagnosis.append(f"on a branch of probability {prob:.3g}: {line}")
                break
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


# -- exercise 5, the EAGLE head's step: the embedded target and head, against eagle.FeatureDrafter -------
# (the prompt's tokens, its text, k, steps): the prompt then the target's greedy tokens, drafted in greedy
# chains of k. The first case's first step keeps one node of its two, so that a cache not cut and one cut to
# the accepted path differ from the library's there; the second's steps keep all three, then none.
HEAD_CASES = [([4299, 751, 7, 64, 11, 275, 2599, 198, 220, 220, 220, 1441], "def add(a, b):\n    return", 2, 3),
              ([320, 634, 299, 931, 88, 355, 299, 79, 628], "import numpy as np\n\n", 3, 4)]
HEAD_MISTAKES = [  # (what the diagnosis says, how `replay` makes the mistake)
    ("the unnormed feature: your q is the head's fed the target's top-layer states before its final layer norm "
     "(ln_f); the feature is the state after ln_f, the one the target's LM head reads", dict(normed=False)),
    ("the feature one position off: your q is the head's when token t_j is fed with f_j, its own feature; at t_j "
     "the head reads f_(j-1), the feature of the token before it", dict(pairs="own")),
    ("the feature one position off: your q is the head's when the pair at position j holds t_(j-1)'s embedding "
     "beside f_(j-1), each token with its own feature; the pair at position j is t_j's embedding beside f_(j-1), "
     "the feature of the token before it", dict(pairs="own at j")),
    ("the feature one position off: your q is the head's when token t_j is fed with f_(j-2); at t_j the head reads "
     "f_(j-1), the feature of the token before it", dict(pairs="two before")),
    ("every node read the root's guessed feature: node i reads its parent's guess (node i - 1's), the feature the "
     "head guessed for the token before it", dict(nodes="root")),
]


def top_states(target, tokens):  # [n] -> [n, d]
    """The target's top block's output at each token (one causal pass), before its final layer norm."""
    c, p, n = target.config, target.params, len(tokens)
    cache, bias = new_cache(target, n), attention_bias(np.tri(n, dtype=bool), target.dtype)
    x = p["wte"][tokens] + p["wpe"][np.arange(n)]
    for layer, block in enumerate(p["blocks"]):
        x = transformer_block(x, block, c.n_head, cache, layer, bias, c.layer_norm_epsilon)
    return x


def replay(head, feats, seq, cache, chain, pairs="right", nodes="parent"):  # -> [k + 1, V]
    """The step's q by the library's head_pass from a copy of `cache`, with a mistake made (HEAD_MISTAKES)."""
    cache, root = cache.copy(), len(seq) - 1
    js = np.arange(cache.length + 1, root + 1)  # the catch-up pairs' positions
    tok, feat, pos = {"right": (js, js - 1, js), "own": (js - 1, js - 1, js - 1), "own at j": (js - 1, js - 1, js),
                      "two before": (js, js - 2, js)}[pairs]
    mask = np.tri(len(js), cache.length + len(js), cache.length, dtype=bool)
    h = [head_pass(head, feats[feat], np.asarray(seq)[tok], pos, cache, mask)[-1]]  # its block's outputs [d]
    for i, x in enumerate(chain, 1):
        fed = head_features(head, h[0 if nodes == "root" else -1][None])  # a guessed feature [1, D]
        h.append(head_pass(head, fed, [x], [root + i], cache, np.ones((1, cache.length + 1), bool))[0])
    return process(head_logits(head, np.stack(h)), 1.0)


def head_case(prompt, k: int, steps: int):
    """Your head_step and head_keep over `steps` greedy chain steps of k after `prompt`, each against the
    library's FeatureDrafter, as generate's eagle method drives it."""
    def check(funcs):
        target, head = shared()["eagle target"], shared()["eagle head"]
        text = list(prompt) + generate(target, list(prompt), steps * (k + 1) + 1, eos=None).tokens
        top = top_states(target, text)  # [N, d]
        feats = layer_norm(top, **target.params["ln_f"], eps=target.config.layer_norm_epsilon)  # what hidden gives
        lib = FeatureDrafter(head, rows=64)
        lib.commit([], feats[:len(prompt) - 1], 0)  # the target scored the prompt but its last token
        cache = KVCache(head.config, capacity=len(text) + 2 * k + 8, dtype=head.dtype)
        seq = list(prompt)
        for s in range(1, steps + 1):
            root, before = len(seq) - 1, lib.cache.copy()
            lib.begin(seq, k)
            tokens, parents, ref = [seq[-1]], [-1], []
            for i in range(k + 1):  # the library's greedy chain, one head pass a node
                ref.append(lib.dist_fn(tokens, parents, [i])[0])
                tokens, parents = tokens + [int(np.argmax(ref[-1]))], parents + [i]
            chain, ref, rows = tokens[1:k + 1], np.stack(ref), sum(lib.block_sizes)
            length = cache.length
            q = funcs["head_step"](head, target, top[:root].copy(), list(seq), cache, list(chain))
            where = f"step {s} (the root at position {root}, the chain {chain})"
            try:
                q = np.asarray(q, dtype=np.float64)
            except (TypeError, ValueError):
                raise Wrong(f"{where}: head_step returned {type(q).__name__}, expected q, an array [k + 1, V]") from None
            check_q(head, q, ref, where, lambda normed=True, **mistake: replay(
                head, (feats if normed else top)[:root], seq, before, chain, **mistake))
            if cache.length - length != rows:
                raise Wrong(f"{where}: you fed the head {cache.length - length} rows, the library {rows}: the "
                            f"{rows - k - 1} pairs its cache lacked, the root's, and the chain's {k} nodes")
            accepted = next((i for i, x in enumerate(chain) if x != text[root + 1 + i]), k)  # greedy verification
            lib.commit([tuple(chain[:i + 1]) for i in range(accepted)], feats[root:root + accepted + 1], root)
            funcs["head_keep"](cache, root, accepted)
            check_head_cache(cache, lib.cache, s, k, accepted)
            seq = text[:root + accepted + 2]

    return check


def check_q(head, q, ref, where: str, mistaken) -> None:
    """Wrong unless q [k + 1, V] is the library's `ref`; the diagnosis names the mistake it matches."""
    if q.shape != ref.shape:
        raise Wrong(f"{where}: head_step returned q of shape {q.shape}, expected {ref.shape}: a row after the root "
                    f"and after each of the chain's {len(ref) - 1} nodes, over the {ref.shape[1]} tokens")
    diff = np.abs(q - ref).max(axis=1)  # [k + 1]
    if not (diff > MAX_LOGIT_DIFF).any() and np.isfinite(q).all():
        return
    r = int(np.argmax(~(diff <= MAX_LOGIT_DIFF)))
    node = "the root" if r == 0 else f"node {r}"
    diagnosis = [line for line, mistake in HEAD_MISTAKES if np.abs(mistaken(**mistake) - q).max() <= MAX_LOGIT_DIFF]
    outside = float(q[:, head.vocab == 0].sum(axis=1).max()) if head.vocab is not None else 0.0
    if outside > MAX_LOGIT_DIFF:
        diagnosis.append(f"your q gives up to {outside:.3g} of its mass to tokens outside head.vocab: the head "
                         f"drafts only its {int(head.vocab.sum())} tokens (q is 0 elsewhere)")
    raise Wrong(f"{where}: your q after {node} differs from the library's head's by {diff[r]:.3g}", diagnosis,
                [f"yours:     {show_top(q[r])}", f"library's: {show_top(ref[r])}"])


def show_top(q, n: int = 4) -> str:
    return ", ".join(f"{int(t)}: {q[t]:.3g}" for t in np.argsort(-q)[:n])


def check_head_cache(mine, lib, s: int, k: int, accepted: int) -> None:
    """Wrong unless after head_keep the head's cache holds the library's pairs (length, keys and values)."""
    n = lib.length
    if mine.length != n:
        line = f"after step {s} your head's cache holds {mine.length} pairs, the library's {n}"
        if mine.length == n + k:
            raise Wrong(f"{line}: the cache not cut after verification: keep only the pairs made of the target's "
                        f"features, through the root's; the chain's {k} were fed on guessed features"
                        + (f" ({k - accepted} of them rejected)" if accepted < k else ""))
        if mine.length == n + accepted and accepted:
            raise Wrong(f"{line}: you kept the {accepted} accepted node(s) of the chain, each fed on its parent's "
                        "guessed feature where the target's exists now (its verify pass computed it): keep only "
                        "the pairs made of the target's features; the next step feeds them again with those")
        raise Wrong(f"{line}: keep only the pairs made of the target's features, through the root's")
    diff = np.maximum(np.abs(mine.k[:, :, :n] - lib.k[:, :, :n]), np.abs(mine.v[:, :, :n] - lib.v[:, :, :n]))
    diff = diff.max(axis=(0, 1, 3)) if n else np.zeros(0)  # [n]
    if (diff > MAX_LOGIT_DIFF).any():
        j = int(np.argmax(diff > MAX_LOGIT_DIFF))
        raise Wrong(f"after step {s} slot {j} of your head's cache is not the library's: it holds the pair of "
                    f"token {j + 1} (its embedding and the target's feature f_{j})")


def head_cases():
    return [(f"{text!r}, chains of {k}, {steps} steps", head_case(prompt, k, steps))
            for prompt, text, k, steps in HEAD_CASES]


def quietly(check, funcs) -> None:
    """check(funcs), without NumPy's warnings: a wrong rule's 1/0 is said by the verdict (--case shows them)."""
    with np.errstate(all="ignore"):
        check(funcs)


def failure(e: BaseException) -> str:
    """An exception in one line: its type (the learner's, for one raised in the worker) and its message's first line."""
    text = str(e).splitlines()[0] if str(e) else ""
    name = e.name if type(e).__name__ == "Raised" else type(e).__name__
    return f"{name}: {text}" if text else name


