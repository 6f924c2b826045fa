# %% [markdown]
# # Lesson 11: drafting from the target's features (EAGLE)
#
# You will see why the target's next feature is easier to guess than its next token, then write the
# EAGLE head's step yourself (exercise 5). You will watch EAGLE-2's tree grow pass by pass. Then you
# will run and time the head against the draft model in the same loop and check that it is still
# exactly lossless.
#
# After the paper, the drafters that production engines ship (vLLM, SGLang, TensorRT-LLM) stopped
# being separate small models. EAGLE (Li et al. 2024) drafts with a *head* that reads the target's
# own top-layer **feature**: the vector its language-model head multiplies by the embeddings to get
# the logits. The target has already computed that feature for every token it verified, so the head
# starts from everything the target knows and only has to guess one step ahead:
#
# * at token t_j it reads the target's feature f_(j-1) of the token before and the embedding of t_j,
#   fuses them with one linear layer [2D -> d] into its own width d, narrower than the target's D, and
#   runs one transformer block of that width with its own KV cache;
# * a linear layer [d -> D] turns its output into a guess of f_j, and the target's own head turns
#   that into q for the next token;
# * deeper in a tree there is no target feature yet: a node reads its parent's guess.
#
# The head is a drafter like the draft model, so the loop, the trees and the lossless rules are the
# ones of the earlier lessons: `generate(..., method="eagle", draft=head)`. EAGLE-2 adds the dynamic
# tree of lesson 5: the nodes of highest cumulative q, grown best first (`build.build_best_first`).

# %%
import numpy as np

from specdec_np import build, eagle, models
from specdec_np.decode import generate
from specdec_np.gpt2 import GPT2Config, forward, hidden, lm_head, new_cache, random_params
from specdec_np.plan import Plan
from specdec_np.proofs import exact
from specdec_np.sampling import process
from specdec_np.tokenizer import decode, encode
from specdec_np.tree import path_key, render
try:
    from lesson import one_blas_thread_if_busy, pass_ms, print_rounding, print_timed, say_if_busy, start_timing, verdict
    from lesson import timing_rounds, try_this
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/11_eagle.py")

target, draft, _, enc = models.load_embedded()
head = models.load_head("tiny-eagle", target)  # specdec_np/weights/tiny-eagle (weights/recipe.py trains it)
prompt = encode(enc, "def transpose(matrix):\n    rows = len(matrix)\n    cols = len(matrix[0])\n")

# %% [markdown]
# ## Why a feature
#
# The target's next-token distribution is a function of its feature alone: p = softmax(f @ wte.T).
# `gpt2.hidden` returns the features (the side after the final layer norm, which EAGLE's code reads
# too), and `gpt2.lm_head` turns them into logits: `forward` is the two in a row. A token is one
# choice among 8193; a feature is `n_embd` numbers (the target's width, printed below) that vary
# smoothly from one position to the next, and it already carries what the target computed in all its
# layers. Guessing it is a regression a one-block head can learn.

# %%
text = prompt + generate(target, prompt, 96, eos=None).tokens  # the target's own greedy text
feats = hidden(target, text, new_cache(target))  # [n, n_embd]
logits = lm_head(target, feats)  # [n, V]
assert np.allclose(feats @ target.params["wte"].T, logits, atol=1e-3)  # the tied head reads the feature
print(f"a feature: {feats.shape[1]} numbers; the distribution it gives: {logits.shape[1]} probabilities")

# The head's first guess at every position j (from the true f_(j-1) and t_j) against the target's argmax at j,
# and the draft model's guess at the same positions: how often each would be accepted at greedy.
n = len(text)
h = eagle.head_pass(head, feats[:-1], np.array(text[1:]), np.arange(1, n), new_cache(head),
                    np.tril(np.ones((n - 1, n - 1), dtype=bool)))  # [n - 1, d]: its block's outputs, its own width
guess = eagle.head_features(head, h)  # [n - 1, n_embd]: its guesses of f_1..f_(n-1)
assert guess.shape == feats[1:].shape and h.shape[1] == head.config.n_embd < target.config.n_embd
head_agree = np.mean(np.argmax(eagle.head_logits(head, h), -1) == np.argmax(logits[1:], -1))
draft_agree = np.mean(np.argmax(forward(draft, text, new_cache(draft))[1:], -1) == np.argmax(logits[1:], -1))
print_rounding(f"first guess == the target's argmax: head {head_agree:.2f}, draft model {draft_agree:.2f} "
               f"({n - 1} positions)")

# %% [markdown]
# ## Your turn: the head's step (exercise 5)
#
# Write the head's step in `tutorials/exercises/eagle_head.py`, then run `make exercises`. Each step
# it feeds the pairs its cache lacks (t_j with f_(j-1), at position j), the root's last, then each
# node of a chain on its parent's guess, and returns q after each. After verification it keeps only
# the pairs made of the target's features. Exercise 5 grades it against the library's head, step by
# step; lesson 11b (`tutorials/11b_the_head_answer.py`) is an answer, for once yours passes.

# %% [markdown]
# ## The dynamic tree, growing
#
# In the loop the drafter (`eagle.FeatureDrafter`) holds the features the target handed over after
# each verification. Here we hand it the prompt's by hand and watch EAGLE-2's best-first builder ask
# for one level at a time: each call is one head pass over the nodes it expands, each fed its
# parent's guessed feature.

# %%
d = eagle.FeatureDrafter(head, rows=64)
prompt_feats = hidden(target, prompt[:-1], new_cache(target))
d.commit([], prompt_feats, 0)  # what the loop does after the target's pass over the prompt
d.begin(prompt, 4)


def logged(tokens, parents, nodes):
    rows = d.dist_fn(tokens, parents, nodes)
    paths = ["root" if node == 0 else repr(decode(enc, [int(tokens[node])])) for node in nodes]
    print(f"pass {len(d.block_sizes)}: expands {len(nodes)} node(s): {', '.join(paths)}")
    return rows


tree = build.build_best_first(prompt[-1], logged, 8, 4)
print(render(tree, lambda t: decode(enc, [t])))
in_tree = {path_key(tree.tokens, tree.parents, i) for i in range(len(tree))}
print(f"{len(d.index)} nodes expanded in {len(d.block_sizes)} passes; {len(in_tree & set(d.index))} of them are in "
      f"the final tree, the other {len(set(d.index) - in_tree)} were expanded and dropped")

# %% [markdown]
# Why expand nodes it later drops? Each pass expands, in one pass, every node of the current top 8
# not expanded yet. At pass 2 the only candidates known are the root's children: the top 8 are all
# of them. Their children show one branch nearly certain; its descendants outrank the other
# children, which drop out of the final tree with what grew below them.
#
# Expanding one node a pass would waste no rows but cost a pass per node. A pass over 8 rows costs
# far less than 8 passes over one (lesson 2), so best-first buys fewer passes with rows it may throw
# away (`build.build_best_first`'s docstring has the argument).

# %% [markdown]
# ## Against the draft model, in the same loop
#
# The same plan for both (8 nodes at most 6 deep, best first), at greedy. Both emit the target's own
# tokens; what differs is how many each step gets accepted and what drafting reads. The cost that
# counts on a CPU is the weights a pass streams (lesson 8): the head reads its narrow block *and*,
# for q, 2048 rows of the target's 8193 x 384 embedding (its reduced vocabulary, below) folded into
# its last layer once (a 192 x 2048 matrix: the same product in another order); the draft model
# reads its two small blocks and its own 8193 x 128 embedding.

# %%
runs = {name: generate(target, prompt, 64, method, model, plan=Plan(budget=8, depth=6), eos=None)
        for name, method, model in (("draft model", "tree", draft), ("EAGLE head", "eagle", head))}
for name, run in runs.items():
    s = run.stats
    print(f"{name:>11}: {s.tokens_per_pass:.2f} tokens per target pass, {s.draft_passes} drafting passes, "
          f"{s.draft_weight_bytes / 1e6:.1f} MB read per pass, weight traffic {s.weight_traffic:.2f}x plain decoding")
print_rounding(f"same tokens: {runs['draft model'].tokens == runs['EAGLE head'].tokens}")
better = min(runs, key=lambda name: runs[name].stats.weight_traffic)
print(f"verdict: the {better} reads fewer weights per emitted token here")
assert target.config.n_embd > head.config.n_embd > draft.config.n_embd  # the widths compared below

# %% [markdown]
# What one drafting pass costs each, timed on the same prompt: a pass over one new row (a chain's
# step) and over 8 (a level of the tree above), the head's pass with its q, the draft model's with
# its logits. The two are timed in turns, five rounds, and the verdict gives the range of the ratio.

# %%
one_blas_thread_if_busy()
start = start_timing()
ratio = {1: [], 8: []}  # the head's ms over the draft's, round by round
for _ in range(timing_rounds(5)):
    ms = {name: pass_ms(model, list(ratio), prefix_len=len(prompt), repeats=5) for name, model in
          (("head", head), ("draft", draft))}
    for k in ratio:
        ratio[k].append(ms["head"][k] / ms["draft"][k])
for k, r in ratio.items():
    print_timed(f"a drafting pass of {k} row(s) after the prompt, the head's time over the draft model's: "
                + verdict(r, 1, "the head's pass costs more", "the head's pass costs less", "x"))
say_if_busy(start)

# %% [markdown]
# The head shipped here was trained on two CPU cores for two and a half hours, the target's features
# computed as it went: 48M tokens (the draft model, a model of its own, saw 81M; weights/README.md).
#
# What decides the verdicts above is this pair's sizes: the head's one block is 192 wide, half the
# target's 384 (an earlier head was as wide as the target, and read twice the draft's bytes a pass),
# yet wider than the whole draft model (128); with q folded into its last layer a pass reads fewer
# weights than a draft pass (5.1 MB against 6.0 MB), and its first guess is accepted more often
# than the draft model's (79% against 74% at top-k 50, on held-out text; the wide head, trained on
# 21M tokens on a GPU, made 82%). `make bench` times both passes, the cost curve's
# "head" and "draft" rows, and races the two methods on your machine. On a large target the head is
# a small fraction of one target layer, while a draft model good enough to match it is a model of
# its own.
#
# ## Stopping where the head doubts
#
# At top-k 50 the chain is drawn from q (lesson 3): a chain of 4 guesses costs 4 head passes, and
# the last is verified only if the three before it were accepted. The head says how sure it is: q
# of the token it drew. `Plan(min_q=0.3)` makes a drawn token whose q is below 0.3 a leaf: the chain
# stops there, and the passes below it are not made (the early exit of BiLD, Kim et al. 2023).
# Whether a node gets children is decided from its own q before they are drawn, so its children are
# still draws from q and every rule stays lossless (checked below). The same prompt and seeds, with
# and without it, counted (not timed):

# %%
MIN_Q = 0.3
try_this(f"min_q={MIN_Q}", MIN_Q != 0.3)
per_pass = {}  # min_q -> (tokens, head passes) per target pass
for min_q in (0.0, MIN_Q):
    plan = Plan(widths=(1, 1, 1, 1), sampled="without", min_q=min_q)
    stats = [generate(target, prompt, 64, "eagle", head, plan=plan, temperature=1.0, top_k=50, seed=seed,
                      eos=None).stats for seed in range(4)]
    passes = sum(s.target_passes for s in stats)
    per_pass[min_q] = (sum(sum(s.accepted) for s in stats) / passes, sum(s.draft_passes for s in stats) / passes)
    print(f"min_q {min_q}: {per_pass[min_q][0]:.2f} tokens per target pass, {per_pass[min_q][1]:.2f} head passes "
          "per target pass")
(tokens, passes), (tokens_q, passes_q) = per_pass[0.0], per_pass[MIN_Q]
print(f"verdict: min_q {MIN_Q} made {abs(passes - passes_q):.2f} {'fewer' if passes_q < passes else 'more'} head "
      f"passes and {abs(tokens - tokens_q):.2f} {'fewer' if tokens_q < tokens else 'more'} tokens per target pass")

# %% [markdown]
# The chain stops where the head doubts its guess, and what it gives up are the guesses least likely
# to be accepted (the verdict says how many tokens per pass that was here, on these seeds). Whether
# that pays depends on what a head pass costs against a target pass on
# your machine (on a CPU a pass of small products is mostly fixed costs, lesson 10): the acceptance
# profile counts EAGLE's chains with `min_q` 0.3 and 0.5, and `make bench` prices and races them on
# yours (docs/results.md has one machine's).
#
# ## Still lossless
#
# The head only proposes: the rules verify its trees as they verify the draft's. On a 4-token random
# target with a random head, every random branch of `generate` enumerated (lesson 3's method): the
# first three tokens have the target's distribution exactly, for trees of the head's top tokens and
# for trees drawn from its q.

# %%
tiny = random_params(GPT2Config(n_vocab=4, n_ctx=16, n_embd=8, n_layer=1, n_head=2), seed=11, dtype=np.float64,
                     scale=0.8)
tiny_head = eagle.random_head(tiny, seed=5, scale=0.3)
want = exact.sequence_distribution(lambda ctx: process(forward(tiny, list(ctx), new_cache(tiny))[-1], 1.0, 2),
                                   (1, 2), 3)
for plan in (Plan(budget=3, depth=2), Plan(widths=(2, 1), sampled="without"),
             Plan(widths=(2, 1), sampled="without", min_q=0.6)):
    got = exact.outcomes(lambda rand: tuple(generate(tiny, [1, 2], 3, "eagle", tiny_head, plan=plan, temperature=1.0,
                                                     top_k=2, rand=rand, eos=None).tokens))
    print_rounding(f"{plan.shape if not plan.sampled else 'sampled ' + plan.sampled}"
                   f"{f', min_q {plan.min_q}' if plan.min_q else ''}: total variation "
          f"{exact.total_variation(got, want):.1e}")
    assert exact.total_variation(got, want) < 1e-12

# %% [markdown]
# ## What EAGLE-3 changes
#
# EAGLE-3 (Li et al. 2025) keeps the loop and changes what the head reads and how it is trained. It
# fuses features from a low, a middle and the top layer of the target instead of the top one alone
# (the top layer is specialised in the next token; the others keep more of the context), and it
# drops the feature-regression loss: trained by "training-time test", the head is run on its own
# guesses during training, as it is when drafting deep in a tree, so it learns to recover from them.
#
# It also drafts over a reduced vocabulary, as the head shipped here does: the 2048 tokens most
# frequent in its training text (97% of it), so that q covers a quarter of the embedding's rows. The
# rules ask nothing of q, so a token the head can never draft costs acceptance, not correctness (below:
# the 4-token target above, with a head that can draft only 3 of its tokens, still sampled exactly).

# %%
vocab = head.vocab  # [V]: 1 for the tokens the head may draft
out = text[len(prompt):]  # the target's greedy tokens of the first section
print(f"the head may draft {int(vocab.sum())} of {len(vocab)} tokens; {vocab[out].mean():.0%} of the target's "
      f"{len(out)} greedy tokens above are among them")
assert (process(eagle.head_logits(head, h[:4]), 1.0)[:, vocab == 0] == 0).all()  # q is 0 outside it

three = eagle.random_head(tiny, seed=5, scale=0.3, vocab_size=3)  # never drafts one of the 4 tokens
got = exact.outcomes(lambda rand: tuple(generate(tiny, [1, 2], 3, "eagle", three, plan=Plan(widths=(2, 1),
                     sampled="without"), temperature=1.0, top_k=2, rand=rand, eos=None).tokens))
print_rounding(f"a head that drafts 3 of the 4 tokens: total variation {exact.total_variation(got, want):.1e}")
assert exact.total_variation(got, want) < 1e-12

# %% [markdown]
# ## Try this
#
# * Make the tree a single guess, `Plan(shape="fixed", widths=(1,))`: each drafting step then emits
#   one or two tokens, and tokens per target pass is 1 plus the first guess's acceptance (checked
#   below on that run).
# * Sample (`temperature=1.0, top_k=50`) with the tree drawn from q (`Plan(widths=(1, 1, 1),
#   sampled="without")`) for both drafters: compare tokens per pass with the greedy runs.
# * In "Stopping where the head doubts", set `MIN_Q = 0.6`: compare its head passes and tokens per
#   target pass with 0.3's (the verdict says what 0.6 saved and cost against no stopping). At
#   `MIN_Q = 1.0` only a token q is certain of gets children: almost every chain is one guess.
# * In the by-hand pass, drop the position embedding (`e = P["wte"][tokens]`): the check against
#   `eagle.head_pass` fails (the library's head adds them), and the lesson says so and goes on. How
#   many first guesses still match the target's argmax, the line under it counts: a one-block head
#   over features that already carry the positions may lose few or none.

# %%
def check_one_guess(run):
    """Every step after the first emits one or two tokens, and some emit two."""
    steps = [len(step.tokens) for step in run.stats.steps[1:]]
    assert set(steps) <= {1, 2} and 2 in steps, steps
    print(f"one guess per step: {steps.count(2)} of {len(steps)} steps accepted it")


one = generate(target, prompt, 32, "eagle", head, plan=Plan(shape="fixed", widths=(1,)), eos=None)
check_one_guess(one)
