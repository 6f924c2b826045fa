"""A token tree as flat arrays (the Medusa/Sequoia layout), and what follows from it.

Node 0 is the root: the last emitted token, not drafted. Every other node is a drafted token
whose parent has a smaller index, so a single left-to-right pass computes anything that flows
from the root down (depths, masks, cumulative probabilities). Only the arrays are stored;
depths, positions and the attention mask are derived when needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("deterministic", "with_replacement", "without_replacement")


@dataclass
class Tree:
    """tokens/parents/q: [n]; kind: how children were chosen; draft_dists: [n, V] or None; source: [n].

    q[i] is the draft probability of tokens[i] under draft_dists[parents[i]] (the distribution its
    siblings were chosen from; root 1.0). For the sampled kinds, draft_dists[i] is exactly the
    distribution node i's children were drawn from (zeros for nodes without children): the
    rejection rules divide by it, so it must be that distribution and no other. source[i] labels
    which drafter proposed node i (e.g. 0 = draft model, 1 = n-gram).
    """

    tokens: np.ndarray
    parents: np.ndarray
    q: np.ndarray
    kind: str = "deterministic"
    draft_dists: np.ndarray | None = None
    source: np.ndarray | None = None

    def __post_init__(self):
        self.tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        self.parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        self.q = np.asarray(self.q, dtype=np.float64).reshape(-1)
        n = self.tokens.size
        if n == 0:
            raise ValueError("Tree: needs at least the root node")
        if self.parents.size != n or self.q.size != n:
            raise ValueError(f"Tree: tokens, parents, q must have the same length, "
                             f"got {n}, {self.parents.size}, {self.q.size}")
        if self.parents[0] != -1:
            raise ValueError(f"Tree: parents[0] must be -1 (node 0 is the root), got {self.parents[0]}")
        idx = np.arange(1, n)
        if np.any(self.parents[1:] < 0) or np.any(self.parents[1:] >= idx):
            raise ValueError("Tree: parents[i] must satisfy 0 <= parents[i] < i for every non-root node")
        if self.kind not in KINDS:
            raise ValueError(f"Tree: kind must be one of {KINDS}, got {self.kind!r}")
        if self.draft_dists is not None:
            self.draft_dists = np.asarray(self.draft_dists, dtype=np.float64)
            if self.draft_dists.ndim != 2 or self.draft_dists.shape[0] != n:
                raise ValueError(f"Tree: draft_dists must be [n={n}, V], got shape {self.draft_dists.shape}")
        elif self.kind != "deterministic":
            raise ValueError(f"Tree: draft_dists is required for a {self.kind} tree "
                             "(the rejection rules need the distribution children were drawn from)")
        self.source = (np.zeros(n, dtype=np.int8) if self.source is None
                       else np.asarray(self.source, dtype=np.int8).reshape(-1))
        if self.source.size != n:
            raise ValueError(f"Tree: source must have length {n}, got {self.source.size}")

    def __len__(self) -> int:
        return int(self.tokens.size)


def n_drafted(tree: Tree) -> int:
    """Drafted tokens: every node but the root."""
    return len(tree) - 1


def depths(tree: Tree):  # -> [n]
    """Depth of each node (root 0)."""
    d = np.zeros(len(tree), dtype=np.int64)
    for i in range(1, len(tree)):
        d[i] = d[tree.parents[i]] + 1
    return d


def positions(tree: Tree, prefix_len: int):  # -> [n]
    """Position ids: prefix_len + depth, NOT prefix_len + node index.

    The root is the last emitted token, not yet in the cache of length prefix_len, so it sits at
    position prefix_len; siblings share a position because they are alternatives for one slot.
    """
    return prefix_len + depths(tree)


def attention_mask(tree: Tree):  # -> [n, n] bool
    """mask[i, j] = node i may attend to node j: j is i itself or one of its ancestors."""
    n = len(tree)
    mask = np.zeros((n, n), dtype=bool)
    for i in range(n):
        if i:
            mask[i] = mask[tree.parents[i]]
        mask[i, i] = True
    return mask


def path_to(tree: Tree, node: int) -> list[int]:
    """Node indices from the root down to `node` (inclusive)."""
    if not 0 <= node < len(tree):
        raise ValueError(f"path_to: node {node} outside 0..{len(tree) - 1}")
    path = [int(node)]
    while path[-1] != 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


def children(tree: Tree, node: int):  # -> [n_children]
    """Indices of node's children, in index order (the order the verification rules test them)."""
    return np.flatnonzero(tree.parents == node)


def cumulative_q(tree: Tree):  # -> [n]
    """Product of q along the path from the root: the draft's probability of reaching each node."""
    cum = tree.q.copy()
    cum[0] = 1.0
    for i in range(1, len(tree)):
        cum[i] = cum[tree.parents[i]] * tree.q[i]
    return cum


def render(tree: Tree, decode_fn=None, accepted=None) -> str:
    """Indented text: one line per node with its token, q and cumulative q; `*` marks the accepted path.

    decode_fn(token) -> str shows text (repr-quoted) instead of ids; accepted is a path (list of
    node indices, as returned by a verification rule).
    """
    on_path = set(int(i) for i in (accepted or ()))
    cum = cumulative_q(tree)
    show_source = bool(np.any(tree.source))

    def label(i):
        tok = int(tree.tokens[i])
        return repr(decode_fn(tok)) if decode_fn is not None else str(tok)

    lines = [f"{'*' if 0 in on_path else ' '} [0] {label(0)}  (root)"]

    def visit(node, depth):
        for c in children(tree, node):
            mark = "*" if c in on_path else " "
            src = f" src={tree.source[c]}" if show_source else ""
            lines.append(f"{mark} {'  ' * depth}[{c}] {label(c)}  q={tree.q[c]:.3f} cum={cum[c]:.3f}{src}")
            visit(c, depth + 1)

    visit(0, 1)
    return "\n".join(lines)


def draw_mask(tree: Tree) -> str:
    """The attention mask as a text grid: row i, column j is 'x' when node i sees node j."""
    mask = attention_mask(tree)
    d = depths(tree)
    n = len(tree)
    w = len(str(n - 1))
    head = " " * (w + 6) + " ".join(str(j % 10) for j in range(n))
    rows = [f"{i:>{w}} d={d[i]:<2} " + " ".join("x" if m else "." for m in mask[i]) for i in range(n)]
    return "\n".join([head] + rows)
