# %% [markdown]
# # Lesson 5: token trees and tree attention
#
# You will build a token tree from a small table, print its positions and attention mask, and see
# each node attend only to its ancestors. You will check that one tree pass of the target equals
# every root-to-leaf path run alone. Then you will compare a chain and a tree of the same size on
# the embedded models and watch a run step by step.
#
# A chain of guesses is fragile: guess 5 is only useful if guesses 1-4 were all right. The paper's
# first idea is to spend the same batch on a **tree**: near the root, where being right is most
# likely, also try the draft's 2nd and 3rd choices. The target still checks everything in one
# forward pass, thanks to two tricks:
#
# * **positions** = prefix length + depth (siblings are alternatives for the same slot), and
# * an **attention mask** that lets each node see the cached prefix, its ancestors and itself,
#   so every root-to-node path is scored as if it had been the only continuation.

# %%
import numpy as np

from specdec_np import build
from specdec_np.decode import generate
from specdec_np.drafting import ModelDrafter
from specdec_np.gpt2 import forward, new_cache
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.tokenizer import decode, encode
from specdec_np.tree import attention_mask, children, cumulative_q, depths, draw_mask, path_to, positions, render
try:
    from lesson import check, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/05_token_trees.py")

# %% [markdown]
# ## A tree from a table
#
# A `Tree` is three flat arrays: `tokens`, `parents` (parent index, always smaller; the root's
# is -1) and `q` (the draft's probability of each token given its parent). `build.build_fixed`
# grows one from a draft callback: here a hand-written next-word table, two children per node at
# depths 1 and 2, one at depth 3.

# %%
WORDS = ["the", " cat", " dog", " sat", " ran", "."]
Q = np.array([  # Q[w] = the draft's distribution of the word after w
    [0.00, 0.60, 0.40, 0.00, 0.00, 0.00],
    [0.00, 0.00, 0.00, 0.70, 0.20, 0.10],
    [0.00, 0.00, 0.00, 0.30, 0.60, 0.10],
    [0.50, 0.00, 0.00, 0.00, 0.00, 0.50],
    [0.30, 0.00, 0.00, 0.00, 0.00, 0.70],
    [0.90, 0.05, 0.05, 0.00, 0.00, 0.00],
])


def table_fn(tokens, parents, nodes):  # the builder asks: the draft's distribution after these nodes
    return Q[tokens[nodes]]  # [len(nodes), V]


widths = [2, 2, 1]  # the top-2, top-2, top-1 tokens of q at depths 1, 2, 3
try_this(f"widths={widths}", widths != [2, 2, 1])
tree = build.build_fixed(0, table_fn, widths=widths)
print(render(tree, decode_fn=WORDS.__getitem__))
print("\nparents:  ", tree.parents.tolist())
print("depths:   ", depths(tree).tolist())
print("positions:", positions(tree, prefix_len=7).tolist(), " (root = last emitted token, at position 7)")
print("\nattention mask (row i: the nodes node i may see; the cached prefix is always visible):")
print(draw_mask(tree))
level = np.cumprod(widths)  # nodes at each depth
leaf = [i for i in range(len(tree)) if children(tree, i).size == 0][0]
print(f"{len(tree)} nodes (1 + {' + '.join(map(str, level))}); a leaf's row of the mask shows "
      f"{int(attention_mask(tree)[leaf].sum())} nodes: the root, its ancestors, itself")
assert len(tree) == 1 + level.sum()
mask = attention_mask(tree)  # [n, n]
assert all(np.flatnonzero(mask[i]).tolist() == path_to(tree, i) for i in range(len(tree)))  # ancestors + itself

# %% [markdown]
# ## A tree pass equals running every path separately
#
# Now a real tree: the embedded draft model proposes it (`ModelDrafter` answers the builder's
# callback with batched, tree-masked draft passes), keeping the 10 nodes of highest cumulative
# draft probability (`build_best_first`). The target scores the whole tree in **one** pass; then we
# run each root-to-leaf path as an ordinary chain on a copy of the same cached prefix. The logits
# must agree node for node.

# %%
target, draft, _, enc = load_embedded()
prompt = encode(enc, "def is_even(n):\n    return n % 2 ==")
root = prompt[-1]  # the root is the last emitted token: not yet in the target's cache

drafter = ModelDrafter(draft)  # greedy: ranks alternatives by softmax of the draft's logits
drafter.begin(prompt, max_depth=4)
tree = build.build_best_first(root, drafter.dist_fn, budget=10, max_depth=4)
print(render(tree, decode_fn=lambda t: decode(enc, [t])))

prefix = new_cache(target)
forward(target, prompt[:-1], prefix)  # the cached prefix


def tree_pass(mask):  # [n_nodes, n_nodes] -> [n_nodes, V]
    """The target's logits for every node of the tree in one pass, each node attending as `mask` says."""
    return forward(target, tree.tokens, prefix.copy(), positions=positions(tree, prefix.length), mask=mask)


def paths_differing(logits):
    """The leaves whose root-to-leaf path, run alone as a plain chain, gives other logits than `logits`' rows for
    that path; and the tokens the paths fed."""
    differ, fed = [], 0
    for leaf in (i for i in range(len(tree)) if children(tree, i).size == 0):
        path = path_to(tree, leaf)
        chain = forward(target, tree.tokens[path], prefix.copy())  # plain causal pass over this path
        fed += len(path)
        if not np.allclose(logits[path], chain, atol=1e-4, rtol=1e-4):
            differ.append(leaf)
    return differ, fed


tree_mask = attention_mask(tree)  # [n_nodes, n_nodes]: ancestors and itself
try_this("no tree mask (plain causal attention over the nodes)", tree_mask is None)
logits = tree_pass(tree_mask)
differ, fed = paths_differing(logits)
leaves = [i for i in range(len(tree)) if children(tree, i).size == 0]
if check(differ == [], f"the paths to nodes {differ} differ from the tree pass"):
    print(f"\nOK: the tree pass ({len(tree)} tokens) matches {len(leaves)} separate path passes ({fed} tokens)")

# Positions matter: numbering the nodes 0..n-1 instead of by depth gives different (wrong) logits.
if (depths(tree) != np.arange(len(tree))).any():  # (unless the tree happens to be a single chain)
    wrong = forward(target, tree.tokens, prefix.copy(), positions=prefix.length + np.arange(len(tree)),
                    mask=attention_mask(tree))
    check(not np.allclose(wrong, logits, atol=1e-4), "node-index positions should not match")
    print("and numbering nodes by index instead of depth breaks it, as it should")

# %% [markdown]
# ## Why a tree accepts more than a chain of the same size
#
# If the draft's probabilities were right, a node would be accepted with probability equal to
# its **cumulative** q (the product of q along its path), and the expected number of accepted
# tokens per pass would be the sum of cumulative q over the nodes. A chain of B nodes follows the
# draft's argmax; the best-first tree takes the B nodes of highest cumulative q among all paths,
# so its sum can never be smaller. Both trees below come from the same draft, same root.

# %%
B = 8
drafter.begin(prompt, max_depth=B)
chain = build.build_chain(root, drafter.dist_fn, B)
bushy = build.build_best_first(root, drafter.dist_fn, budget=B, max_depth=B)
e_chain, e_tree = cumulative_q(chain)[1:].sum(), cumulative_q(bushy)[1:].sum()
print(f"{B} drafted nodes, first step only. Expected drafted tokens accepted if the target sampled "
      f"from the draft's q: chain {e_chain:.2f}, tree {e_tree:.2f}")
assert len(chain) == len(bushy) == B + 1
assert e_tree >= e_chain - 1e-12

# %% [markdown]
# Now measured, on the real target, greedy: speculative decoding with a chain of B guesses vs a
# best-first tree of budget B. Greedy speculative decoding must reproduce the target's own
# greedy text token for token; we run in float64 so that a float32 near-tie (two logits within
# rounding of each other) cannot flip a token between different block shapes.

# %%
target64, draft64 = target.astype(np.float64), draft.astype(np.float64)
n_new = 40
runs = {"ar": generate(target64, prompt, n_new, method="ar"),
        "chain": generate(target64, prompt, n_new, method="speculative", draft=draft64, plan=Plan(chain=B),
                           keep_trees=True),
        "tree": generate(target64, prompt, n_new, method="tree", draft=draft64, plan=Plan(budget=B, depth=B),
                         keep_trees=True)}
print(f"{'':<6} {'target passes':>13} {'tokens/pass':>11} {'draft passes':>12}")
for name, r in runs.items():
    print(f"{name:<6} {r.stats.target_passes:>13} {r.stats.tokens_per_pass:>11.2f} {r.stats.draft_passes:>12}")
print(repr(decode(enc, runs["ar"].tokens)))
assert runs["chain"].tokens == runs["ar"].tokens == runs["tree"].tokens, "greedy speculative must be lossless"
assert runs["ar"].stats.target_passes == n_new

# %% [markdown]
# The draft-pass column differs a lot, for a reason in how trees are built. A chain is drafted one
# token at a time (each guess needs the one before it), so a chain of B guesses costs B draft passes
# every step. The best-first builder asks for the draft's distributions after *every* node it
# selected in a round at once, and the drafter answers them in one tree-masked pass (one row per
# node): a step costs one draft pass per round of expansion, one per level plus a last round that
# expands the deepest nodes only to find that none of their children makes the cut.
#
# A best-first tree of B nodes is bushier and shallower than a chain of B, so it needs fewer, fuller
# passes. (A step's first draft pass also feeds the tokens the draft has not seen yet, the last
# step's accepted ones: hence a little over one row per pass for the chain.)

# %%
for name in ("chain", "tree"):
    s = runs[name].stats
    deepest = np.mean([depths(t).max() for t, _ in s.trees])
    print(f"{name:<6} {s.draft_passes / s.target_passes:.2f} draft passes per step, trees {deepest:.2f} deep on "
          f"average, {np.mean(s.draft_blocks):.1f} rows per draft pass")
assert all(len(step.draft_blocks) == B for step in runs["chain"].stats.steps)  # one pass per chained guess

# %% [markdown]
# These tokens per pass are not comparable with the expectations printed before them: those were
# for **one** step (the first), counted **drafted** tokens only, and assumed the target samples
# from the draft's q. Tokens per pass is a whole-run average, and each pass also emits one token
# from the target itself. Like with like: over every step of the runs, the expectation (sum of
# cumulative q of that step's tree) against the drafted tokens actually accepted per pass
# (tokens per pass minus the target's one).

# %%
print(f"{'':<6} {'expected drafted accepted/pass':>30} {'measured drafted accepted/pass':>30}")
expected, measured = {}, {}
for name in ("chain", "tree"):
    s = runs[name].stats
    expected[name] = np.mean([cumulative_q(t)[1:].sum() for t, _ in s.trees])  # one tree per step
    measured[name] = s.tokens_per_pass - 1  # each pass emits its accepted drafts + 1 token from the target
    # (the accepted paths can hold a little more: the last step's is cut at n_new tokens)
    assert np.mean([len(path) - 1 for _, path in s.trees]) >= measured[name] - 1e-9
    print(f"{name:<6} {expected[name]:>30.2f} {measured[name]:>30.2f}")
above = [name for name in measured if measured[name] > expected[name]]
print(f"measured above expected: {' and '.join(above) if above else 'neither'}; the tree accepted "
      f"{'more' if measured['tree'] > measured['chain'] else 'no more'} drafted tokens per pass than the chain")

# %% [markdown]
# Where measured comes out above expected (the line above says where it did), that is for a reason,
# not by luck: this run is **greedy**. The target accepts a node when it is the target's argmax,
# with probability 1, not with probability q; the draft's q (temperature 1) spreads mass over
# alternatives the greedy target never picks, while its own top choice often is the target's.
#
# So cumulative q is a sampling-time estimate that tends to understate greedy acceptance. What
# carries over is the comparison: from the same root the tree's expectation is never below the
# chain's (asserted on the first step above), and whether the tree also accepted more per pass in
# this run, the line above says.

# %%
t, path = max(runs["tree"].stats.trees, key=lambda tp: len(tp[1]))
print(f"\nThe tree of the best step: {len(path) - 1} drafted tokens accepted (*), then one from the target")
print(render(t, decode_fn=lambda x: decode(enc, [x]), accepted=path))

# %% [markdown]
# With a well-trained draft the tree usually yields more tokens per target pass than the chain:
# a wrong first guess sinks the whole chain, while the tree still has the runner-up. (With a
# poorly trained draft both stay near 1 token per pass.) Whether that makes decoding *faster*
# depends on what the extra tokens in a pass cost on this machine: lesson 8.

# %% [markdown]
# ## Watch the run step by step
#
# With `keep_trees=True` each step of `stats.steps` keeps its tree, the rule's checks, the
# draft's passes and the accepted path (`step.trace`) beside the record the statistics above are
# computed from. `tools/trace.py` draws that record as one self-contained HTML page (no network):
# step through the tree run above with the arrow keys, and see every tree, the draft's passes, why
# each node was accepted or not, and the cache compacted.

# %%
from lesson import show_trace  # tutorials/lesson.py: writes out/NAME (or a temporary folder), shows it in a notebook

show_trace(runs["tree"], enc, prompt, "tree", f"best-first, {B} nodes; greedy, float64", "tutorial_05_trace.html")
print('your own staged run: .venv/bin/python -m specdec_np trace "def f(x):" --method staged --out out/trace.html')

# %% [markdown]
# ## Try this
#
# * Build the first tree with `widths = [2, 3]`: 1 + 2 + 6 = 9 nodes (" cat" and " dog" are each
#   followed by three words in the table), and each leaf's row of the mask shows 3 nodes (the
#   root, its parent, itself).
# * In the tree pass, drop the mask (`tree_mask = None`: plain causal attention over the nodes in
#   index order): every node then also sees the siblings before it, and the logits no longer
#   match the paths run alone.
# * Raise `B` and watch the draft-pass column: the chain's grows with B, the tree's with its depth.
#
# The first two predictions, checked by running the lesson's code with each change:

# %%
def check_wide(widths):
    """The first prediction, for the first tree's widths (to hold: [2, 3]): 9 nodes, each leaf's mask row 3 nodes."""
    wide = build.build_fixed(0, table_fn, widths=widths)
    leaf_rows = [int(attention_mask(wide)[i].sum()) for i in range(len(wide)) if children(wide, i).size == 0]
    assert len(wide) == 9 and leaf_rows == [3] * 6, (len(wide), leaf_rows)
    return wide


def check_unmasked(mask):
    """The second, for the tree pass's mask (to hold: None, plain causal attention): some path no longer matches."""
    differ, _ = paths_differing(tree_pass(mask))
    assert differ, "every path still matches"
    return differ


print(draw_mask(check_wide([2, 3])))
check_unmasked(None)
print("without the tree mask the tree pass no longer equals the paths run alone")
