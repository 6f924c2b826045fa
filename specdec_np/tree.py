"""A token tree as flat arrays (the Medusa/Sequoia layout), and what follows from it.

Node 0 is the root: the last emitted token, not drafted. Every other node is a drafted token whose parent has a
smaller index, so one left-to-right pass computes anything that flows from the root down (depths, positions, the
attention mask, cumulative probabilities), derived when needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KINDS = ("deterministic", "with_replacement", "without_replacement")
# Who proposed a node, or produced an emitted token (the paper's Fig. 3): the target, the draft model, the trigram's
# own continuation, or a copy of what followed a repeat in the context.
SOURCES = ("target", "draft", "ngram", "copy")
TARGET, DRAFT, NGRAM, COPY = range(4)


@dataclass
class Tree:
    """tokens/parents/q: [n]; kind: how children were chosen; draft_dists: [n, V] or None; source: [n]. q[i]: the
    draft probability of tokens[i] among its siblings (root 1.0). For the sampled kinds, draft_dists[i] is exactly the
    distribution node i's children were drawn from (zeros for a leaf): the rejection rules divide by it. source[i]:
    who proposed node i, an index into SOURCES (default: the draft; the root, emitted earlier, TARGET)."""

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
        if n == 0 or self.parents.size != n or self.q.size != n:
            raise ValueError(f"Tree: tokens, parents, q must have the same length, at least 1 (the root), "
                             f"got {n}, {self.parents.size}, {self.q.size}")
        if self.parents[0] != -1:
            raise ValueError(f"Tree: parents[0] must be -1 (node 0 is the root), got {self.parents[0]}")
        if np.any(self.parents[1:] < 0) or np.any(self.parents[1:] >= np.arange(1, n)):
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
        self.source = np.asarray([TARGET] + [DRAFT] * (n - 1) if self.source is None else self.source,
                                 dtype=np.int8).reshape(-1)
        if self.source.size != n:
            raise ValueError(f"Tree: source must have length {n}, got {self.source.size}")

    def __len__(self) -> int:
        return int(self.tokens.size)


def depths(tree):  # Tree or parents [n] -> [n]
    """Depth of each node (root 0), of a Tree or from its parents array (parents[i] < i, root -1)."""
    parents = getattr(tree, "parents", tree)
    d = np.zeros(len(parents), dtype=np.int64)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


def positions(tree: Tree, prefix_len: int):  # -> [n]
    """Position ids: prefix_len + depth, NOT prefix_len + node index. The root (the last emitted token, not yet in the
    cache) sits at prefix_len; siblings share a position: alternatives for one slot."""
    return prefix_len + depths(tree)


def attention_mask(tree):  # Tree or parents [n] -> [n, n] bool
    """mask[i, j] = node i may attend to node j: j is i or an ancestor (a row is its parent's plus itself)."""
    parents = getattr(tree, "parents", tree)
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return mask


def block(seq, cache_len: int, tokens, parents, first: int = 0):
    """The inputs of one forward pass that feeds tree nodes first..n-1 after a KV cache.

    tokens, parents: [n] a tree in feed order, node 0 the root (seq[-1]). Node i sits at cache slot root + i and
    position root + depth(i), root = len(seq) - 1. The cache holds seq's first `cache_len` tokens and, on a step's
    later passes, nodes 0..first-1 (cache_len == root + first); a first pass (first == 0) feeds first the committed
    tokens the cache lacks, seq[cache_len:root] ("catch-up" rows, causal). A node sees the committed prefix, its
    ancestors and itself. The target feeds a whole tree in one pass; the draft its growing tree, a frontier per pass.
    Returns (tokens [m], positions [m], mask [m, cache_len + m], n_catch_up), m = n_catch_up + n - first.
    """
    root, n = len(seq) - 1, len(parents)
    if first == 0 and not 0 <= cache_len <= root:
        raise ValueError(f"block: a first pass needs cache_len <= {root}, got {cache_len}")
    if first and cache_len != root + first:
        raise ValueError(f"block: nodes 0..{first - 1} should end the cache at {root + first}, got {cache_len}")
    catch_up = [int(t) for t in seq[cache_len:root]] if first == 0 else []
    n_c = len(catch_up)
    m = n_c + n - first
    mask = np.zeros((m, cache_len + m), dtype=bool)
    mask[:n_c, :cache_len] = True
    mask[:n_c, cache_len:root] = np.tril(np.ones((n_c, n_c), dtype=bool))
    mask[n_c:, :root] = True  # the committed prefix, catch-up rows included
    mask[n_c:, root:] = attention_mask(parents)[first:]  # node j at column root + j, in cache or block
    feed = np.concatenate([np.asarray(catch_up, dtype=np.int64), np.asarray(tokens, dtype=np.int64)[first:]])
    pos = np.concatenate([cache_len + np.arange(n_c), root + depths(parents)[first:]])
    return feed, pos, mask, n_c


def path_key(tokens, parents, node: int) -> tuple:
    """The tokens below the root down to `node`: its identity across one step's trees (draft's, stage 2's, verified)."""
    out = []
    while node > 0:
        out.append(int(tokens[node]))
        node = int(parents[node])
    return tuple(out[::-1])


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
    cum = np.ones(len(tree))
    for i in range(1, len(tree)):
        cum[i] = cum[tree.parents[i]] * tree.q[i]
    return cum


def render(tree: Tree, decode_fn=None, accepted=None) -> str:
    """Indented text: one line per node with its token, q and cumulative q; `*` marks the `accepted` path (node
    indices, as a rule returns). decode_fn(token) -> str shows text instead of ids."""
    on_path = set(int(i) for i in (accepted or ()))
    cum = cumulative_q(tree)
    show_source = bool(np.any(tree.source[1:] != DRAFT))
    label = (lambda i: str(tree.tokens[i])) if decode_fn is None else (lambda i: repr(decode_fn(int(tree.tokens[i]))))
    lines = [f"{'*' if 0 in on_path else ' '} [0] {label(0)}  (root)"]

    def visit(node, depth):
        for c in children(tree, node):
            src = f" ({SOURCES[tree.source[c]]})" if show_source else ""
            lines.append(f"{'*' if c in on_path else ' '} {'  ' * depth}[{c}] {label(c)}  q={tree.q[c]:.3f} "
                         f"cum={cum[c]:.3f}{src}")
            visit(c, depth + 1)

    visit(0, 1)
    return "\n".join(lines)


def draw_mask(tree: Tree) -> str:
    """The attention mask as a text grid: row i, column j is 'x' when node i sees node j. Node numbers are read down
    the header (column 12 reads 1 over 2)."""
    mask, d, n = attention_mask(tree), depths(tree), len(tree)
    w = len(str(n - 1))
    labels = [f"{j:>{w}}" for j in range(n)]  # column j's number, right-aligned, read top to bottom
    head = [" " * (w + 6) + " ".join(label[k] for label in labels) for k in range(w)]
    rows = [f"{i:>{w}} d={d[i]:<2} " + " ".join("x" if m else "." for m in mask[i]) for i in range(n)]
    return "\n".join(head + rows)
