# %% [markdown]
# # Lesson 7: staged speculative decoding
#
# You will see a trigram guess the draft's next tokens, and check that staged decoding builds
# exactly the trees the tree method builds. You will count the draft passes stage 2 saves on the
# demo's prompt and see who wrote each token. Then you will time the runs and read verdicts that say
# when a difference is within noise.
#
# Big trees move the bottleneck: the target checks a whole tree in one pass, but the draft needs
# one pass per round of expansion (a tree of depth 6 takes at least 6 draft passes). The paper's
# second idea is to speculate the *draft* too, with something far cheaper: a Katz backoff trigram
# (`ngram.py`), a lookup table, fitted on text the draft generated: the paper's was, and so is the
# embedded one (8M tokens the embedded draft sampled; weights/README.md).
#
# How it works here (`drafting.ModelDrafter(..., ngram=...)`): whenever the draft runs a pass to
# expand some tree nodes, stage 2 also guesses the next few tokens below each of them, and the draft
# evaluates those guesses **in the same pass** (more rows, same weights read).
#
# The guess is the trigram's, unless the last three tokens occurred earlier in the context: then it
# is what followed them there (prompt lookup; code repeats its own names, which no corpus table
# knows). When the tree builder later wants to expand a guessed node, its distribution is already
# there: no extra pass. The distributions are still the draft's own, so the tree is **identical** to
# the unstaged one. Stage 2 changes the cost, never the result.
#
# One step further (the last section): when the context's last three tokens did occur earlier,
# the copy is often right as it stands, so stage 2 may also propose it to the *target* directly,
# and the draft model sits that step out.

# %%
import numpy as np

from specdec_np import ngram
from specdec_np.decode import generate
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.tokenizer import decode, encode
from specdec_np.tree import COPY, NGRAM, SOURCES
try:
    from lesson import demo_prompt, print_timed, try_this  # tutorials/lesson.py
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/07_staged.py")

target, draft, trigram, enc = load_embedded()
prompt = encode(enc, demo_prompt())  # the demo's (make demo): a docstring with a doctest, which stage 2 guesses well
print(demo_prompt())

# %% [markdown]
# ## The trigram's guess
#
# It only looks at the last two tokens, and answers with a table lookup: no weights streamed, no
# matrix product. Its greedy guess of the next few tokens after the prompt:

# %%
guess = ngram.greedy_continuation(trigram, prompt, 6)
ids, probs = ngram.top_k(trigram, prompt, 3)
print("greedy guess:", repr(decode(enc, guess)))
print("its top 3 next tokens:", ", ".join(f"{decode(enc, [t])!r} {p:.2f}" for t, p in zip(ids, probs)))
assert abs(ngram.dist(trigram, prompt).sum() - 1) < 1e-9  # a proper distribution over the vocabulary

# %% [markdown]
# ## Same trees, fewer draft passes
#
# Greedy decoding, tree method vs staged method, same budget. We keep every verification tree and
# compare them step by step. (float64, so that the draft's logits for a node do not depend on
# which other rows shared its pass, even by rounding: the trees must match exactly.)
# `Plan(copy_len=0)` keeps the draft model drafting every step (the copies come last).

# %%
target64, draft64 = target.astype(np.float64), draft.astype(np.float64)
kw = dict(draft=draft64, keep_trees=True)  # and the trigram for staged (generate refuses a model a method never reads)
shape = dict(budget=16, depth=6)
try_this(f"trees of {shape}", shape != dict(budget=16, depth=6))
n_new = 48
tree_run = generate(target64, prompt, n_new, method="tree", plan=Plan(**shape), **kw)
staged_run = generate(target64, prompt, n_new, method="staged", plan=Plan(copy_len=0, **shape), ngram=trigram, **kw)

assert staged_run.tokens == tree_run.tokens, "staging must not change the output"
assert len(staged_run.stats.trees) == len(tree_run.stats.trees)
for (t1, path1), (t2, path2) in zip(tree_run.stats.trees, staged_run.stats.trees):
    assert np.array_equal(t1.tokens, t2.tokens) and np.array_equal(t1.parents, t2.parents) and path1 == path2
# Identical trees mean identical questions to the drafter; staging only answers some of them early.
assert staged_run.stats.draft_passes <= tree_run.stats.draft_passes

saved = tree_run.stats.draft_passes - staged_run.stats.draft_passes
print(f"{len(tree_run.stats.trees)} steps, identical trees and tokens; stage 2 saved {saved} of "
      f"{tree_run.stats.draft_passes} draft passes.\n")
print(f"{'':<7} {'target passes':>13} {'tokens/pass':>11} {'draft passes':>12} {'tokens/draft pass':>17} {'n-gram queries':>15}")
for name, r in (("tree", tree_run), ("staged", staged_run)):
    s = r.stats
    print(f"{name:<7} {s.target_passes:>13} {s.tokens_per_pass:>11.2f} {s.draft_passes:>12} "
          f"{np.mean(s.draft_blocks):>17.1f} {s.ngram_queries:>15}")

# %% [markdown]
# Each staged draft pass carries more rows (the trigram's guesses), and if the guesses are good
# it saves whole passes. Where a draft pass of a few more tokens costs little more than one, fewer
# passes is what counts; whether it does on this machine is measured at the end of this lesson,
# and lesson 8 predicts when it pays, on this machine's costs for the paper's own pair.
#
# ## Who wrote each token
#
# As in the paper's Fig. 3: every emitted token is credited to the cheapest stage that proposed
# it: stage 2 (it guessed the token and the draft kept it in the tree), the draft model, or the
# target itself (the extra token of each pass). Stage 2's guesses come from two places, shown
# apart: the trigram's table, and copies of what followed an earlier occurrence of the last
# tokens (`tree.SOURCES` names every source). Easily predicted stretches (indentation, closing
# brackets, repeated names) are where stage 2 shines.

# %%
MARKS = {"target": "{}", "draft": "{{{}}}", "ngram": "[{}]", "copy": "«{}»"}  # how each source's tokens are shown
LEGEND = "  ".join(MARKS[name].format(name) for name in SOURCES if name != "target") + "  target unmarked"


def by_stage(tokens, sources) -> str:
    """The text with each token marked by the stage that produced it."""
    return "".join(MARKS[SOURCES[src]].format(decode(enc, [tok])) for tok, src in zip(tokens, sources))


print(f"staged completion ({LEGEND}):\n")
print(decode(enc, prompt) + by_stage(staged_run.tokens, staged_run.stats.source))
counts = {name: staged_run.stats.source.count(i) for i, name in enumerate(SOURCES)}
print("\ntokens by stage:", counts)
assert sum(counts.values()) == len(staged_run.tokens)
assert counts["target"] >= staged_run.stats.target_passes - 1  # every pass but perhaps a cut last one adds one
assert not {NGRAM, COPY} & set(tree_run.stats.source)  # without stage 2 no token is a trigram guess or copy

# %% [markdown]
# ## Stage 2 proposing to the target
#
# A guess copied from the context is evaluated by the draft, which then (greedily) proposes whatever
# it would have proposed anyway. When the copy is long and right, that draft pass buys little: the
# target could check the copy itself. With `Plan(copy_len=N)` (0: never; the tools pick this
# machine's best N), a step whose last three tokens occurred earlier in the context skips the draft
# model: its tree is the chain of N tokens that followed them.
#
# If that occurrence is recent, the copy runs into the tokens it proposes: the sequence is going
# round a loop (a small model's greedy output often does), and the copy goes round it too. Any chain
# is a valid tree for the verification rules (greedy, or the point-mass rule when sampling), so this
# is as lossless as every other step; the tests check it by exact enumeration. A small model repeats
# itself, and code repeats its names: the tables of the README and of docs/results.md count, on
# HumanEval, how many of staged decoding's tokens came from such copies.

# %%
def copies_run(copy_len):
    """The staged run with copies of up to `copy_len` tokens sent to the target, and its steps that verified one."""
    run = generate(target64, prompt, n_new, method="staged", plan=Plan(copy_len=copy_len, **shape), ngram=trigram,
                   **kw)
    return run, sum(step.trace.copied for step in run.stats.steps)  # steps whose tree is stage 2's copy


COPY_LEN = 8
try_this(f"copy_len={COPY_LEN}", COPY_LEN != 8)
copy_run, copied = copies_run(COPY_LEN)
assert copy_run.tokens == staged_run.tokens, "copies must not change the output either"
print(f"{copied} of {len(copy_run.stats.steps)} steps verified a copied chain\n")
print(f"{'':<16} {'target passes':>13} {'tokens/pass':>11} {'draft passes':>12}")
for name, r in (("drafts only", staged_run), ("with copies", copy_run)):
    s = r.stats
    print(f"{name:<16} {s.target_passes:>13} {s.tokens_per_pass:>11.2f} {s.draft_passes:>12}")
assert copy_run.stats.draft_passes <= staged_run.stats.draft_passes
print(f"\nwith copies stage 2 saves {tree_run.stats.draft_passes - copy_run.stats.draft_passes} of the tree run's "
      f"{tree_run.stats.draft_passes} draft passes")
print(f"\nthe same completion, by who proposed each token ({LEGEND}):\n")
print(by_stage(copy_run.tokens, copy_run.stats.source))

# %% [markdown]
# ## What stage 2 saves in time
#
# Passes are not time: a staged draft pass carries more rows, and a copied chain is a longer block
# for the target. The same runs in float32 (the precision the tools decode in; a near-tie may flip a
# token against float64, the time is what we read here), each timed three times in turns, the median
# kept, next to plain decoding, with the products laid out as this machine's BLAS runs them fastest
# (lesson 10).
#
# The trees here are big (16 drafted nodes, so the target checks blocks of 17 rows), chosen to show
# stage 2's passes; on a CPU such a block can cost several times one token (lesson 8 measures it
# here), so these runs can be slower than plain decoding: what to read is what stage 2 saves or
# loses against the same trees without it. So the table also has trees of 4 drafted nodes (depth 4),
# closer to what the tools choose on a CPU (they choose per machine: README, results), where a
# method can beat plain decoding; whether one does here, on this run, the verdict below says.

# %%
import time  # noqa: E402

from lesson import fastest_layout, one_blas_thread_if_busy, say_if_busy, start_timing, timing_rounds, was_busy  # noqa: E402

one_blas_thread_if_busy()
target32, draft32 = fastest_layout(target), fastest_layout(draft)
small = dict(budget=4, depth=4)
runs = {"plain": ("ar", Plan()), "tree": ("tree", Plan(**shape)),
        "drafts only": ("staged", Plan(copy_len=0, **shape)), "with copies": ("staged", Plan(copy_len=8, **shape)),
        "tree 4": ("tree", Plan(**small)), "drafts only 4": ("staged", Plan(copy_len=0, **small)),
        "with copies 4": ("staged", Plan(copy_len=8, **small))}
seconds = {name: [] for name in runs}
stats = {}
start = start_timing()
for _ in range(timing_rounds(3)):
    for name, (method, plan) in runs.items():
        t0 = time.perf_counter()
        models = {"ar": {}, "tree": dict(draft=draft32)}.get(method, dict(draft=draft32, ngram=trigram))
        r = generate(target32, prompt, n_new, method=method, plan=plan, **models)
        seconds[name].append(time.perf_counter() - t0)
        stats[name] = r
ms = {name: 1000 * float(np.median(t)) / len(stats[name].tokens) for name, t in seconds.items()}
print(f"{'':<14} {'budget':>6} {'ms/token':>8} {'speedup':>7} {'target passes':>13} {'draft passes':>12}")
for name, (method, plan) in runs.items():
    s = stats[name].stats
    budget = plan.budget if method != "ar" else "-"
    print_timed(f"{name:<14} {budget:>6} {ms[name]:>8.2f} {ms['plain'] / ms[name]:>6.2f}x {s.target_passes:>13} "
                f"{s.draft_passes:>12}")
say_if_busy(start)

# %% [markdown]
# The verdict of this run, computed from the table above, round by round: each figure is given with
# its range over the three rounds, and where that range straddles the line (0 ms saved, a speedup
# of 1x) the verdict is "within noise": another run could come out on either side.

# %%
from lesson import verdict  # noqa: E402

busy = was_busy(start)
per_token = {name: [1000 * t / len(stats[name].tokens) for t in ts] for name, ts in seconds.items()}  # ms, a round
for tree, name in (("tree", "drafts only"), ("tree", "with copies"), ("tree 4", "drafts only 4"),
                   ("tree 4", "with copies 4")):
    saved = [a - b for a, b in zip(per_token[tree], per_token[name])]  # ms/token, round by round
    fewer = stats[tree].stats.draft_passes - stats[name].stats.draft_passes
    print_timed(f"stage 2, {name} ({fewer} fewer draft passes), ms/token saved against the same trees without it: "
                + verdict(saved, 0, "saved", "lost"))
top = max((name for name in runs if name != "plain"), key=lambda name: ms["plain"] / ms[name])
print_timed(f"fastest here: {top}, speedup over plain decoding "
            + verdict([a / b for a, b in zip(per_token["plain"], per_token[top])], 1, "faster", "slower", "x")
            + (f"; on a busy machine ({busy}) these figures move from run to run" if busy else ""))

# %% [markdown]
# ## Try this
#
# * Give the trees a smaller budget (`shape = dict(budget=4, depth=6)`): look at how many draft
#   passes stage 2 saves now, and at who is credited with the tokens.
# * Change `COPY_LEN = 8` to `COPY_LEN = 0` in the copies run: no step verifies a copied
#   chain, and the run is the "drafts only" one, step for step. Checked below.
# * Pick a prompt of your own (prose rather than code, say): look at how many steps copy and at
#   the share of tokens each stage is credited with.

# %%
def check_no_copies(copy_len):
    """The second prediction, for the copies run's `copy_len` (to hold: 0): no copied step, and the "drafts only"
    run's tokens, trees and draft passes."""
    run, copied = copies_run(copy_len)
    assert copied == 0, f"{copied} copied steps"
    assert run.tokens == staged_run.tokens and run.stats.draft_passes == staged_run.stats.draft_passes
    assert all(np.array_equal(t1.tokens, t2.tokens) and np.array_equal(t1.parents, t2.parents)
               for (t1, _), (t2, _) in zip(run.stats.trees, staged_run.stats.trees))
    return run


print(f"copy_len=0: 0 copied steps, {check_no_copies(0).stats.draft_passes} draft passes, as the drafts-only run")
