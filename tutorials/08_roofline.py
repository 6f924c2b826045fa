# %% [markdown]
# # Lesson 8: your machine's cost curve (its roofline), and the tree budget it implies
#
# You will measure this machine's cost curves for the target and the draft, and turn them into a
# predicted speedup for each tree budget. You will set the predictions next to measured runs and see
# what the passes leave out. Then you will price the paper's own setting here and see when stage 2
# pays, each verdict with its range over repeated timings.
#
# Speculative decoding pays when checking B+1 tokens in one target pass costs much less than
# B+1 passes. How much less depends on the hardware: on the paper's GPU dozens of tokens are
# nearly free; on a laptop CPU only a few are. So the right tree size is not a constant from a
# paper, it is read off **this machine's cost curve**: milliseconds of one forward pass against
# the number of tokens in it.
#
# The roofline model says what shape to expect: a pass takes at least the time to fetch its
# weights and at least the time to do its arithmetic (2 FLOPs per weight per token). With few
# tokens the fetch dominates and the curve is flat; with many the arithmetic does and it rises
# about linearly. Where it bends is the budget a tree can spend. Real curves add bumps (how the
# BLAS library handles small blocks: lesson 10) and noise.
#
# The same curves then say when the paper's second stage pays: the last sections price stage 2
# (lesson 7) in the cost model, on the paper's own pair (GPT-2-large and GPT-2 shapes, timed here)
# and on the embedded pair.
#
# Timings in this lesson are measured and printed, never asserted: they vary from run to run and
# machine to machine. Every sentence about them is printed from the numbers of this run.

# %%
import itertools
import time

import numpy as np

from specdec_np.decode import generate
from specdec_np.models import load_embedded
from specdec_np.plan import Plan
from specdec_np.tokenizer import encode
try:
    from lesson import fastest_layout, one_blas_thread_if_busy, out_dir, pass_ms, print_timed, say_if_busy  # tutorials/
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/08_roofline.py")
from lesson import bends, start_timing, timing_rounds, try_this, verdict, was_busy

one_blas_thread_if_busy()
target, draft, ngram, enc = load_embedded()
target = fastest_layout(target)  # the layout of the products this machine multiplies fastest (lesson 10)
prompt = encode(enc, "def binary_search(items, x):\n    lo, hi = 0, len(items)\n    while lo < hi:\n")

# %% [markdown]
# ## The cost curve
#
# `pass_ms` (tutorials/lesson.py) times one forward pass of k new tokens after a cached prefix (the median of a
# few repeats), for the target and the draft, with the products laid out as this machine's BLAS
# runs them fastest (lesson 10). Each bar is proportional to the pass's time; the last column is
# its ratio to a one-token pass, against k, what k one-token passes would cost.

# %%
KS = [1, 2, 4, 8, 12, 16, 24, 32]
start = start_timing()
curve_runs = {"target": {}, "draft": {}}  # {k: the 7 timings (ms)} of each model, for verdicts' ranges
curves = {name: pass_ms(model, KS, prefix_len=len(prompt), repeats=7, runs=curve_runs[name])
          for name, model in (("target", target), ("draft", draft))}


def cost(curve, k):
    """ms of a pass of k tokens, interpolated linearly between the measured block sizes."""
    return float(np.interp(k, list(curve), list(curve.values())))


def bar_chart(curve, width=40):
    """One line per block size: a bar proportional to ms, ms per token, and the ratio to one token."""
    top = max(curve.values())
    return "\n".join(f"k={k:>3} {'#' * max(1, round(width * ms / top)):<{width}} {ms:6.2f} ms  {ms / k:5.2f} ms/token"
                     f"  {ms / curve[1]:5.2f}x one token" for k, ms in curve.items())


for name, curve in curves.items():
    print(f"{name}: ms per forward pass of k tokens")
    print_timed(bar_chart(curve))
    cheap = [k for k in KS if curve[k] <= 2 * curve[1]]
    most = max(cheap)
    print_timed(f"a 1-token pass costs {curve[1]:.2f} ms here; the largest block that cost at most twice that: "
                f"{most} token{'s' if most > 1 else ''}")
    print_timed(bends(curve) or "the curve does not fall anywhere: more rows never cost less")
    print_timed("")
assert list(curves["target"]) == KS and all(ms > 0 for c in curves.values() for ms in c.values())
say_if_busy(start)

try:  # a PNG as well, only if matplotlib happens to be installed (never required)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, c in curves.items():
        ax.plot(list(c), list(c.values()), marker="o", label=name)
    ax.set_xlabel("tokens in the block")
    ax.set_ylabel("ms per forward pass")
    ax.legend()
    png = out_dir() / "tutorial_08_cost_curve.png"  # out/, or a temporary folder where out/ cannot be written
    fig.savefig(png)
    print(f"wrote {png}")
except ImportError:
    pass

# %% [markdown]
# Read the curve as "how many extra tokens does a pass absorb": where ms/token keeps falling,
# batching pays. If you see wild jumps (tens of ms for a handful of tokens), another process is
# probably competing for the cores and OpenBLAS's threads wait on each other: try
# `OPENBLAS_NUM_THREADS=1`. Odd sizes can cost more than the next multiple of 4 or 8; the decoder
# then pads the block with dummy rows (lesson 10).
#
# ## A cost model for the tree budget
#
# A step with a tree of B drafted tokens costs one target pass of B+1 tokens plus the draft
# passes that built the tree, and yields `tokens_per_pass` tokens on average:
#
#     predicted ms per token = (C_target(B+1) + draft_passes * C_draft(draft block)) / tokens_per_pass
#
# The costs come from the curves above; the acceptance (tokens per pass, draft passes per step and
# their size) from a short greedy run per budget. Plain decoding costs C_target(1) per token.
#
# The predicted speedup is the ratio; we set it next to the measured one. (`tools/costmodel.py`
# refines this model with padding, with curves measured "cold" (right after the other model ran, as
# most passes inside the loop are) and "warm", and with fixed overheads per step, drafting step,
# draft distribution and n-gram query; `tools/choice.py` prices every candidate of the pair's
# acceptance profile that way and picks the cheapest for this machine.)

# %%
n_new = 40


def timed(method, plan=None, repeats=3):
    """(the run, its median ms per token over `repeats` identical runs); each run's ms per token in `per_run`."""
    times = []
    for _ in range(timing_rounds(repeats)):
        t0 = time.perf_counter()
        models = {} if method in ("ar", "lookup") else dict(draft=draft)  # the draft for the methods that run it
        r = generate(target, prompt, n_new, method=method, plan=plan, **models)
        times.append(1e3 * (time.perf_counter() - t0) / len(r.tokens))
    per_run[method, plan] = times
    return r, float(np.median(times))


per_run = {}


start = start_timing()
generate(target, prompt, 4, method="tree", draft=draft, plan=Plan(budget=4))  # warm-up
ar, ar_ms = timed("ar")
c_ar = cost(curves["target"], 1)

rows, runs, plans = [], {}, {}
for B in (2, 4, 8, 16):
    plans[B] = ("tree", Plan(budget=B))  # (method, plan)
    try_this("a chain of B guesses instead of a tree of budget B", plans[B][0] == "speculative")
    r, ms = timed(*plans[B])
    s = r.stats
    runs[B] = (s, ms * len(r.tokens))  # its statistics and measured ms
    dpp = s.draft_passes / s.target_passes  # draft passes per step
    pred = (cost(curves["target"], B + 1) + dpp * cost(curves["draft"], np.mean(s.draft_blocks))) / s.tokens_per_pass
    rows.append((B, s.tokens_per_pass, dpp, pred, c_ar / pred, ar_ms / ms))
    # Counts that follow from the algorithm, whatever the models: one target pass per step, a
    # tree never larger than its budget (after the first pass, which also prefills the prompt).
    assert s.target_passes == len(s.accepted) and sum(s.accepted) == len(r.tokens)
    assert max(s.target_blocks[1:], default=0) <= B + 1
    assert s.target_bytes == s.target_passes * target.weight_bytes

print_timed(f"plain decoding: predicted {c_ar:.2f} ms/token, measured {ar_ms:.2f} ms/token\n")
print(f"{'budget':>6} {'tokens/pass':>11} {'draft passes/step':>17} {'predicted ms/tok':>16} "
      f"{'predicted speedup':>17} {'measured speedup':>16}")
for B, tpp, dpp, pred, sp_pred, sp_meas in rows:
    print_timed(f"{B:>6} {tpp:>11.2f} {dpp:>17.2f} {pred:>16.2f} {sp_pred:>16.2f}x {sp_meas:>15.2f}x")
ratios = [row[5] / row[4] for row in rows]  # measured over predicted speedup
print_timed(f"measured speedups were {min(ratios):.2f} to {max(ratios):.2f} times the predicted ones")
say_if_busy(start)

# %% [markdown]
# The verdict of this run, computed from the table above (so it changes when the numbers do):

# %%
def table_verdict(rows, busy: str) -> list[str]:
    """What the table says: did any budget beat plain decoding, and did the model's pick hold up."""
    pick = min(rows, key=lambda row: row[3])  # the least predicted ms per token
    top = max(rows, key=lambda row: row[5])  # the best measured speedup
    over_plain = [ar_ms / t for t in per_run[plans[top[0]]]]  # its speedup in each of its runs
    lines = [f"the best budget here, {top[0]}, against plain decoding: "
             + verdict(over_plain, 1, "faster", "slower", "x")]
    held = abs(np.log(pick[5] / pick[4])) < np.log(1.15)  # measured within 15% of predicted
    why = ("the prediction held (within 15%)" if held else
           f"on a busy machine the fit is loose ({busy})" if busy else
           "the passes leave out the work between them (the next section prices it)")
    lines.append(f"the model picked budget {pick[0]}, predicted {pick[4]:.2f}x, measured {pick[5]:.2f}x: {why}")
    if pick[0] != top[0]:
        lines.append(f"it did not pick the best measured budget ({top[0]}, {top[5]:.2f}x)")
    return lines


for line in table_verdict(rows, was_busy(start)):
    print_timed(line)

# %% [markdown]
# The prediction counts only forward passes. The measured time also includes what happens between
# them in Python (building the tree, softmaxes of the draft's rows, verification), the prompt's
# prefill, and the noise of a shared machine; where the measured speedup falls short of the
# prediction, that gap is the overhead worth engineering away.
#
# When the draft predicts the target poorly (tokens per pass near 1), every budget *loses* time:
# speculation only pays when `tokens_per_pass` outgrows the extra cost of the bigger pass and the
# draft passes. `make bench` runs this comparison over many prompts (and `python -m specdec_np bench
# --curves` prints the full cost curves).
#
# ## What the passes leave out: a fixed cost per step
#
# A step also runs Python between the passes: it builds the tree, takes a softmax of each drafted
# row, verifies. `tools/costmodel.py` adds such work as fixed costs, fitted by least squares on
# timed steps (leaving out the few that a busy host stopped, far slower than the fit). Here the
# simplest version, fitted on the runs above: for every run,
#
#     measured ms - ms of its passes on the curves = steps * c_step + draft passes * c_draft
#
# with both costs held at 0 or above (a fixed cost cannot be negative; where least squares alone would
# go below zero, the line under the fit says so and why). The tools fit two more terms, a draft
# distribution and an n-gram query, on timed runs of their own.

# %%
def passes_ms(s):
    """ms of a run's forward passes on this machine's curves, each at its block size."""
    target_ms = sum(cost(curves["target"], k) for k in s.target_blocks)
    return target_ms + sum(cost(curves["draft"], k) for k in s.draft_blocks)


def nonnegative_fit(X, y):  # [runs, terms], [runs] -> [terms]
    """Least squares with every cost at least 0: each subset of the terms fitted alone (the others held at 0),
    the best fit whose costs are all >= 0 kept (exact for a handful of terms)."""
    best, best_err = np.zeros(X.shape[1]), float(y @ y)  # every cost 0
    for n in range(1, X.shape[1] + 1):
        for terms in itertools.combinations(range(X.shape[1]), n):
            coef = np.zeros(X.shape[1])
            coef[list(terms)] = np.linalg.lstsq(X[:, terms], y, rcond=None)[0]
            err = float(np.sum((X @ coef - y) ** 2))
            if (coef >= 0).all() and err < best_err:
                best, best_err = coef, err
    return best


# By hand: y = 4 - x fits these exactly with a cost of -1; held at 0, the other cost is y's mean, 2.
assert np.allclose(nonnegative_fit(np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]), np.array([3.0, 2.0, 1.0])), [2, 0])
timed_runs = [(ar.stats, ar_ms * len(ar.tokens))] + list(runs.values())
X = np.array([[s.target_passes, s.draft_passes] for s, _ in timed_runs], dtype=np.float64)  # [runs, 2]
y = np.array([ms - passes_ms(s) for s, ms in timed_runs])  # [runs]
free = np.linalg.lstsq(X, y, rcond=None)[0]  # unconstrained: a cost may come out below zero
c_step, c_draft = nonnegative_fit(X, y)
print_timed(f"fitted: c_step {c_step:.3f} ms per step, c_draft {c_draft:.3f} ms per draft pass"
            + (" (fitted on a busy run: such costs swing from run to run)" if was_busy(start) else ""))
if (free < 0).any():
    print_timed(f"(unconstrained, least squares gave {free[0]:.3f} and {free[1]:.3f} ms: a negative cost means the "
                "curves priced those passes above what the runs paid for them, timing noise or passes cheaper "
                "inside the loop than on the curve, not that a step saves time; it is held at 0 above)")


def with_overheads(s):
    """Predicted ms per token: the passes on the curves, plus the fitted fixed costs."""
    return (passes_ms(s) + c_step * s.target_passes + c_draft * s.draft_passes) / sum(s.accepted)


print_timed(f"{'budget':>6} {'measured speedup':>16} {'passes only':>11} {'with overheads':>14}")
for B, tpp, dpp, pred, sp_pred, sp_meas in rows:
    sp_fixed = with_overheads(ar.stats) / with_overheads(runs[B][0])
    print_timed(f"{B:>6} {sp_meas:>15.2f}x {sp_pred:>10.2f}x {sp_fixed:>13.2f}x")

# %% [markdown]
# These costs were fitted on the very runs they then price, so the last column describes those runs
# rather than predicts new ones; the tools fit on timed runs of their own, and `make bench` prints
# their prediction next to every measured speedup.

# %% [markdown]
# ## Why a pass costs more inside the loop than on the curve
#
# The curve times each pass back to back, with as much of the target's weights warm in the caches as
# they hold. Inside speculative decoding the target waits while the draft runs, and its weights may
# cool: the draft's passes push some of them out, and on a shared machine the next block can pay
# even when the pause touched no memory at all.
#
# How much depends on the machine's caches (on one whose cache holds both models, nothing), which is
# why the tools measure it rather than assume it. Time the same 4-token block back to back, after a
# pause of busy Python, and after a 4-token draft pass, in turns (median of 40 each):

# %%
from specdec_np.gpt2 import forward, new_cache  # noqa: E402

cache = new_cache(target)
forward(target, prompt, cache)
block = prompt[-4:]


draft_cache = new_cache(draft)
forward(draft, prompt, draft_cache)


def busy_python():  # 2 ms of Python, no memory traffic
    t = time.perf_counter()
    while time.perf_counter() - t < 2e-3:
        pass


def draft_pass():
    forward(draft, block, draft_cache)
    draft_cache.truncate(len(prompt))


before = {"back to back": lambda: None, "after 2 ms of Python": busy_python, "after a draft pass": draft_pass}
start = start_timing()
times = {name: [] for name in before}
for _ in range(1 + timing_rounds(40)):  # the first round warms up
    for name, pause in before.items():
        pause()
        t = time.perf_counter()
        forward(target, block, cache)
        times[name].append(time.perf_counter() - t)
        cache.truncate(len(prompt))
ms = {name: 1e3 * float(np.median(t[1:])) for name, t in times.items()}
for name, m in ms.items():
    print_timed(f"4-token target block {name + ':':<22} {m:.2f} ms ({m / ms['back to back']:.2f}x back to back)")
# Within 5% is timing noise, not a slowdown.
slower = [name for name in ms if name != "back to back" and ms[name] > 1.05 * ms["back to back"]]
print_timed(f"more than 5% slower than back to back here: {', '.join(slower) if slower else 'neither'}")

# %% [markdown]
# Where a block is slower after a pause, that is why `costmodel.py` prices passes on a "cold" curve, and
# one more reason drafting time can hurt twice: directly, and by cooling the target. A drafter that
# costs almost nothing, prompt lookup (copy what followed the last earlier occurrence of the
# final tokens; `method="lookup"`), shows what verification alone can earn on this machine:

# %%
lk, lk_ms = timed("lookup", Plan(chain=3))
say_if_busy(start)  # the blocks above and this run
# Greedy: the same tokens as plain decoding (in float32 a near-tie could flip; lessons 5 and 7 test it in float64).
print(f"same tokens as plain decoding: {lk.tokens == ar.tokens}")
print_timed(f"prompt lookup: {lk.stats.tokens_per_pass:.2f} tokens per target pass, {lk_ms:.2f} ms/token "
      f"({ar_ms / lk_ms:.2f}x plain decoding, measured)")


# %% [markdown]
# ## Stage 2 in the cost model: when does it pay?
#
# The paper's second idea (lesson 7) attacks the draft passes. In a step
#
#     step ms = C_target(1 + B) + draft passes * C_draft(rows per draft pass)
#
# stage 2 makes every draft pass also evaluate the trigram's next g guesses below the node it
# expands: g more rows in that pass (priced on the draft's curve), and where the guesses agree with
# the draft's own choice, the levels they cover need no draft pass of their own. Whether that pays
# depends on two things: how large a share of a step the draft passes are, and how much more a draft
# pass of 1 + g rows costs than one of 1. A small model of a step, with its assumptions:
#
# * per-token acceptance a: the target keeps the draft's top choice at a depth with probability a;
# * a tree of width w and depth d offers the draft's top w tokens at each depth (B = w * d), only the
#   top one expanded further; the target takes one of the w with probability 1 - (1 - a)^w, as if
#   each were an independent chance a (a chain of k is width 1, depth k);
# * the trigram's guess agrees with the draft's top choice with probability b, token by token; a
#   draft pass covers its own level plus the guesses that agreed in a row.
#
# The copies of lesson 7's last section (stage 2 proposing to the *target*, prompt lookup's idea)
# are not the paper's stage 2 and are not in this model.

# %%
def tokens_per_step(a, width, depth):
    """Expected tokens a step emits: one guess per depth the target reaches and keeps, then its own token."""
    level = 1 - (1 - a) ** width  # P(the target takes one of the `width` guesses at a depth it reaches)
    return 1 + level * sum(a ** i for i in range(depth))


def draft_passes(depth, guesses, b):
    """Expected draft passes to expand `depth` levels when each pass also evaluates the trigram's next `guesses`
    guesses, each agreeing with the draft with probability b: a pass covers its level and the guesses that
    agreed in a row (exact, by the levels left)."""
    passes = [0.0]  # passes[left]: expected passes for `left` levels
    for left in range(1, depth + 1):
        cover = min(guesses, left - 1)  # guesses that can save a pass
        agreed = [b ** j * (1 - b) for j in range(cover)] + [b ** cover]  # P(j guesses agreed, then one did not)
        passes.append(1 + sum(pj * passes[left - 1 - j] for j, pj in enumerate(agreed)))
    return passes[depth]


def padded(curve):
    """ms of a pass of k tokens (a function of k) from a measured curve, never above a larger measured block's:
    the decoder can pad a block to that size (lesson 10), and a noisy dip in the curve does not become a pass
    that costs less for more rows."""
    sizes = sorted(curve)
    ms = np.minimum.accumulate([curve[k] for k in sizes][::-1])[::-1]  # [sizes]: the cheapest at this size or above
    return lambda k: float(np.interp(k, sizes, ms))


def speedup(c_t, c_d, a, width, depth, guesses=0, b=0.0):
    """Plain decoding's ms per token over the step's (c_t, c_d: ms of a pass of k tokens, as functions of k)."""
    step = c_t(1 + width * depth) + draft_passes(depth, guesses, b) * c_d(1 + guesses)
    return c_t(1) * tokens_per_step(a, width, depth) / step


def best(c_t, c_d, a, b, widths, guesses, depths=range(1, 13), max_rows=32):
    """(predicted speedup, width, depth, guesses) of the best shape, target blocks of at most `max_rows`."""
    return max((speedup(c_t, c_d, a, w, d, g, b), w, d, g) for w in widths for d in depths for g in guesses
               if 1 + w * d <= max_rows)


FAMILIES = {"chain": ([1], [0]), "tree": ([2, 3, 4], [0]), "staged": ([1, 2, 3, 4], [1, 2, 3, 4])}  # widths, g


def ledger(c_t, c_d, width, depth, guesses, b):
    """Stage 2's account for one step of a staged shape, against the same tree without it: (ms of draft passes
    saved, ms its wider draft passes add, the draft passes' share of the unstaged step)."""
    plain, staged = draft_passes(depth, 0, b), draft_passes(depth, guesses, b)
    saved = (plain - staged) * c_d(1)
    added = staged * (c_d(1 + guesses) - c_d(1))
    return saved, added, plain * c_d(1) / (c_t(1 + width * depth) + plain * c_d(1))


def compare(c_t, c_d, a, b):
    """{family: (speedup, width, depth, guesses)} at acceptance a, agreement b; and the draft's share of the best
    tree's step."""
    found = {name: best(c_t, c_d, a, b, widths, gs) for name, (widths, gs) in FAMILIES.items()}
    _, w, d, _ = found["tree"]
    share = d * c_d(1) / (c_t(1 + w * d) + d * c_d(1))
    return found, share


# The model's algebra, whatever the machine: no guesses, or guesses that never agree, save no pass; guesses that
# always agree save all they can; a tree of width 1 is a chain; a staged step without guesses is the tree's.
assert draft_passes(6, 0, 0.9) == 6 and abs(draft_passes(6, 3, 0.0) - 6) < 1e-12
assert all(abs(draft_passes(d, g, 1.0) - -(-d // (g + 1))) < 1e-12 for d in range(1, 9) for g in range(5))
assert abs(tokens_per_step(0.7, 1, 4) - sum(0.7 ** i for i in range(5))) < 1e-12
assert abs(draft_passes(2, 1, 0.7) - (2 - 0.7)) < 1e-12  # by hand: a second pass unless the one guess agreed
line = lambda k: 1.0 + 0.1 * k  # noqa: E731  (any cost curve will do for the algebra)
assert padded({1: 2.0, 2: 3.0, 4: 2.5, 8: 4.0})(2) == 2.5  # 2 rows priced as the cheaper 4
assert speedup(line, line, 0.7, 2, 3) == speedup(line, line, 0.7, 2, 3, 0, 0.9)
saved, added, _ = ledger(line, line, 2, 5, 3, 0.7)  # the ledger adds up: unstaged step - saved + added = staged step
assert abs(line(11) + 5 * line(1) - saved + added - (line(11) + draft_passes(5, 3, 0.7) * line(4))) < 1e-12

# %% [markdown]
# ### The paper's setting, on this machine
#
# The paper's pair: GPT-2-large as the target (774M parameters) with a 40M-parameter draft; here
# GPT-2 small's shape (124M) stands in for the draft, the smallest GPT-2 shape.
#
# Building either whole would take gigabytes, so we build random weights of their shapes
# (`gpt2.random_params`: the cost of a pass does not depend on the values), two blocks of each with
# a 64-token vocabulary, time them, and scale by weight bytes to the whole model: its blocks, and
# its LM head, one more product of the same kind (the token embeddings, read once per pass). The
# products are laid out as the embedded target's above (this machine's faster layout).

# %%
from dataclasses import replace  # noqa: E402

from specdec_np.gpt2 import GPT2_SHAPES, param_places, random_params  # noqa: E402
from lesson import last_level_cache, with_slabs  # noqa: E402


def full_depth_ms(name, ks):
    """({k: ms of a pass of k tokens through the whole GPT2_SHAPES[name]}, its weight bytes, bytes timed, and the
    same curve for each of the 5 timing rounds): two of its blocks timed (a 64-token vocabulary: no LM head to
    speak of), scaled by the whole model's weight bytes."""
    shape = GPT2_SHAPES[name]
    two = with_slabs(random_params(replace(shape, n_layer=2, n_vocab=64, n_ctx=128)), target.layout.slab_rows)
    rounds = {}
    timed = pass_ms(two, ks, prefix_len=64, repeats=5, runs=rounds)
    whole = 4 * sum(int(np.prod(dims)) for dims in param_places(shape).values())  # float32 bytes
    scale = whole / two.weight_bytes
    each = [{k: rounds[k][i] * scale for k in ks} for i in range(timing_rounds(5))]  # round i's curve
    return {k: ms * scale for k, ms in timed.items()}, whole, two.weight_bytes, each


start = start_timing()
large, large_bytes, large_two, large_rounds = full_depth_ms("gpt2-large", [1, 2, 4, 8, 16, 32])
small, small_bytes, small_two, small_rounds = full_depth_ms("gpt2", [1, 2, 4, 8])
say_if_busy(start)
paper_t, paper_d = padded(large), padded(small)
print(f"GPT-2-large: {large_bytes / 1e9:.1f} GB of float32 weights, timed on 2 blocks ({large_two / 1e6:.0f} MB); "
      f"GPT-2: {small_bytes / 1e9:.2f} GB, on 2 blocks ({small_two / 1e6:.0f} MB)")
print_timed("GPT-2-large shape, ms per pass: " + ", ".join(f"{k} tokens {ms:.1f}" for k, ms in large.items()))
print_timed("GPT-2 shape, ms per pass:       " + ", ".join(f"{k} tokens {ms:.1f}" for k, ms in small.items()))
for name, curve in (("GPT-2-large shape", large), ("GPT-2 shape", small)):
    if line := bends(curve):  # priced below through `padded`, which never lets more rows cost less
        print_timed(f"{name}: {line}")
print_timed(f"a GPT-2 pass is {paper_d(1) / paper_t(1):.0%} of a GPT-2-large one; a GPT-2 pass of 2 and 5 rows "
            f"costs {paper_d(2) / paper_d(1):.2f}x and {paper_d(5) / paper_d(1):.2f}x one of 1")
llc = last_level_cache()  # e.g. "32 MB"
llc_bytes = int(llc.split()[0]) << (20 if llc.endswith("MB") else 10) if llc else 0
if large_two <= llc_bytes:
    print_timed(f"(the two GPT-2-large blocks timed, {large_two / 1e6:.0f} MB, fit in this CPU's {llc} last-level cache, "
          "which the whole model would not: these costs are optimistic)")

# %% [markdown]
# The acceptances to sweep: a from 0.5 to 0.9. Where does the paper's pair fall? Its Table 1 reports
# memory traffic relative to plain decoding: speculative decoding read 0.31 of it greedy and 0.48
# with top-k sampling (Spector & Re 2023, Table 1; the draft's own reads are a small part of that).
# Read as tokens per target pass, about 1 / 0.31 and 1 / 0.48; a chain yields at most 1 / (1 - a)
# tokens per pass, so those take a per-token acceptance of at least 1 - 0.31 and 1 - 0.48, marked in
# the table (a reading for chains: the paper's trees reach as many tokens with somewhat less).
#
# The trigram's agreement b is this repository's: how often its embedded trigram's guess is its
# embedded draft's top choice, along a text the draft sampled (temperature 1, top-k 50). Both
# trigrams were fitted on text their draft sampled, but how often such a table agrees depends on the
# pair: the lines under the table vary b.

# %%
from specdec_np.ngram import greedy_continuation  # noqa: E402

draft_text = generate(draft, prompt, 48, method="ar", temperature=1.0, top_k=50, seed=0).tokens
draft_top = forward(draft, list(prompt) + draft_text[:-1], new_cache(draft))[len(prompt) - 1:].argmax(-1)  # [48]
b_here = float(np.mean([greedy_continuation(ngram, list(prompt) + draft_text[:i], 1)[0] == draft_top[i]
                        for i in range(len(draft_text))]))
PAPER = {"greedy": 1 - 0.31, "top-k": 1 - 0.48}  # per-token acceptance read from Table 1, as above
print(f"the trigram's guess is the draft's top choice at {b_here:.0%} of {len(draft_text)} positions")


def shape_name(w, d, g):
    return (f"chain {d}" if w == 1 else f"{w}x{d}") + (f" g{g}" if g else "")


ALPHAS = [0.5, 0.6, 0.7, 0.8, 0.9]
table = {a: compare(paper_t, paper_d, a, b_here) for a in ALPHAS}
print_timed(f"{'a':>4} {'chain':>15} {'tree':>15} {'staged':>18} {'stage 2 gain':>12} {'draft share':>11}")
for a, (found, share) in table.items():
    mark = ", ".join(f"paper {name}" for name, pa in PAPER.items() if abs(pa - a) <= 0.05)
    gain = found["staged"][0] / max(found["chain"][0], found["tree"][0])
    print_timed(f"{a:>4} " + " ".join(f"{f'{sp:.2f}x {shape_name(w, d, g)}':>{width}}" for (sp, w, d, g), width
                                      in zip(found.values(), (15, 15, 18)))
                + f" {gain:>11.2f}x {share:>10.0%}" + (f"  <- {mark}" if mark else ""))
gains = {a: found["staged"][0] / max(found["chain"][0], found["tree"][0]) for a, (found, _) in table.items()}


def gain_in_round(i, a):
    """Stage 2's gain at acceptance a, priced on timing round i's curves alone."""
    found, _ = compare(padded(large_rounds[i]), padded(small_rounds[i]), a, b_here)
    return found["staged"][0] / max(found["chain"][0], found["tree"][0])


rounds = {a: [gain_in_round(i, a) for i in range(timing_rounds(5))] for a in ALPHAS}
for a in ALPHAS:  # the table above prices the medians; each round's curves alone give this range
    print_timed(f"  a = {a}: stage 2's gain over the 5 timing rounds " + verdict(rounds[a], 1, "wins", "loses", "x"))
won = [a for a in ALPHAS if min(rounds[a]) > 1]  # in every round
noisy = [a for a in ALPHAS if min(rounds[a]) <= 1 <= max(rounds[a])]
top = max(ALPHAS, key=gains.get)
_, w, d, g = table[top][0]["staged"]
saved, added, part = ledger(paper_t, paper_d, w, d, g, b_here)
print_timed((f"here stage 2 wins in every round at a = {', '.join(map(str, won))}" if won else
             "here stage 2 wins in every round at no acceptance swept")
            + (f"; within noise at a = {', '.join(map(str, noisy))}" if noisy else "")
            + f"; at a = {top} its shape ({shape_name(w, d, g)}) saves {saved:.1f} ms of draft passes a step and "
              f"adds {added:.1f} ms of wider rows, the draft's passes being {part:.0%} of that tree's step unstaged")
for b in (0.3, 0.5, 0.7, 0.9):
    found, _ = compare(paper_t, paper_d, 0.8, b)
    table_b = found["staged"][0] / max(found["chain"][0], found["tree"][0])
    print_timed(f"  at a = 0.8 with the trigram agreeing at b = {b}: stage 2's gain {table_b:.2f}x")

# %% [markdown]
# ### The embedded pair, on this machine
#
# The same model with the embedded pair's curves (measured at the top of this lesson), its acceptance
# measured on a greedy chain run (guesses kept over guesses tested) and the same trigram agreement.

# %%
chain4 = generate(target, prompt, n_new, method="speculative", draft=draft, plan=Plan(chain=4)).stats
kept = sum(n - 1 for n in chain4.accepted)  # guesses kept: each step emits them and one more token
a_here = kept / (kept + sum(n - 1 < 4 for n in chain4.accepted))  # tested: kept, plus a rejected one unless all 4
here_t, here_d = padded(curves["target"]), padded(curves["draft"])
found, share = compare(here_t, here_d, a_here, b_here)
print(f"per-token acceptance of the embedded pair on this prompt (greedy, chain of 4): {a_here:.2f}")
print_timed("predicted: " + ", ".join(f"{name} {sp:.2f}x ({shape_name(w, d, g)})"
                                      for name, (sp, w, d, g) in found.items()))
gain = found["staged"][0] / max(found["chain"][0], found["tree"][0])
print_timed(f"a draft pass here is {here_d(1) / here_t(1):.0%} of a target pass (the paper's setting: "
            f"{paper_d(1) / paper_t(1):.0%}), {share:.0%} of the best tree's step; one of 2 rows costs "
            f"{here_d(2) / here_d(1):.2f}x one of 1 (there: {paper_d(2) / paper_d(1):.2f}x)")
_, w, d, g = found["staged"]
saved, added, part = ledger(here_t, here_d, w, d, g, b_here)
here_rounds = []  # stage 2's gain priced on each timing round's curves alone
for i in range(timing_rounds(7)):
    t_i, d_i = ({k: curve_runs[name][k][i] for k in KS} for name in ("target", "draft"))
    f_i, _ = compare(padded(t_i), padded(d_i), a_here, b_here)
    here_rounds.append(f_i["staged"][0] / max(f_i["chain"][0], f_i["tree"][0]))
print_timed("stage 2's gain here against the best shape without it: " + verdict(here_rounds, 1, "wins", "loses", "x"))
print_timed(f"on the median curves: {f'wins, {gain:.2f}x' if gain > 1.005 else f'does not win ({gain:.2f}x)'}: "
            f"its best shape ({shape_name(w, d, g)}) saves {saved:.2f} ms of draft passes a "
            f"step and adds {added:.2f} ms of wider rows, the draft's passes being {part:.0%} of that tree's step")


# %% [markdown]
# ## Try this
#
# * Take one core away (`python3 -c 'while True: pass' &`, then `kill %1`) and rerun: look at
#   the notes, at how the curve's ratios move, and at whether the budget the model picks changes.
# * Add budgets 1 and 32 to the loop over `B`: where does the predicted speedup peak?
# * Replace `("tree", Plan(budget=B))` by `("speculative", Plan(chain=B))`: each step then runs B
#   draft passes (lesson 5), each of
#   one row after the step's first (which also feeds the draft what it has not seen yet: the prompt at
#   the first step, the target's token after), and the draft-passes column says so. Checked below on a
#   run of several steps.

# %%
def check_chain_passes(run, chain):
    """Every step of `run` made `chain` draft passes, each after its first of one row; the steps checked."""
    steps = run.stats.steps
    assert len(steps) >= 2, f"a run of {len(steps)} step checks too little"
    for step in steps:
        assert len(step.draft_blocks) == chain and all(rows == 1 for rows in step.draft_blocks[1:]), step.draft_blocks
    return len(steps)


chain_run = generate(target, prompt, 16, method="speculative", draft=draft, plan=Plan(chain=4))
checked = check_chain_passes(chain_run, 4)
print(f"a chain of 4: 4 draft passes in each of the {checked} steps, rows per pass at the first: "
      f"{chain_run.stats.steps[0].draft_blocks}")
