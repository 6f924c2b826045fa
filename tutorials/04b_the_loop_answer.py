# %% [markdown]
# # Lesson 4b: an answer to lesson 4
#
# Open this once `make exercises` says your loop is correct (or once you are stuck for good): it is
# one answer to lesson 4's exercise, the speculative decoding loop in about 40 lines, run through
# lesson 4's two checks, then broken on purpose to show that the checks can fail.
#
# Lesson 4's checks are imported from it: importing a lesson runs it, so it loads the models again
# and says once more whether your own loop is written (and checks it if it is).

# %%
import importlib.util
import inspect
import sys
from functools import partial
from importlib import import_module
from pathlib import Path

try:
    import lesson  # tutorials/lesson.py: its folder holds lesson 4 (from tutorials/notebooks/ too)
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/04b_the_loop_answer.py")

sys.path.insert(0, str(Path(lesson.__file__).resolve().parent))
spec = import_module("04_write_the_loop")  # lesson 4: the models, the prompts and the checks
from specdec_np.proofs import exact  # noqa: E402
from specdec_np.tokenizer import decode  # noqa: E402

target, draft, enc = spec.target, spec.draft, spec.enc

# %% [markdown]
# ## The answer
#
# The loop has one home, `tutorials/exercises/solutions/write_the_loop.py`: this lesson loads it and prints
# it, and the grader replays it to find where a loop departs from it. First the rule for one guess
# (lesson 3's): x was drawn from q; keep it with probability min(1, p(x)/q(x)), otherwise the target's
# token comes from the residual, what p still owes once x was rejected. Both are arguments of the
# loop (`acceptance`, `correction`), so that "Try this" can change them; so is `forward`, which
# lesson 4's remembering stand-in replaces for check 2. Then the loop, step by step as lesson 4
# specifies it.

# %%
ANSWER = Path(lesson.__file__).resolve().parent / "exercises" / "solutions" / "write_the_loop.py"
_spec = importlib.util.spec_from_file_location("the_loop_answer", ANSWER)
answer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(answer)
speculative_decode = answer.speculative_decode
print(inspect.getsource(answer).split('"""', 2)[2].strip())  # the code, without the file's docstring


# %% [markdown]
# That is the whole algorithm. A step costs k draft passes of one token and one target pass of
# k + 1 tokens, and emits between 1 and k + 1 tokens. The target's pass reads its weights once, as a
# one-token pass does, but computes k + 1 tokens' worth: how its cost compares with a one-token pass
# depends on the machine and its load (lesson 2 measures it on yours). Speculation pays off when a
# step costs less than the plain target passes that would have emitted the same tokens: lesson 8
# predicts and measures that.
#
# ## Lesson 4's checks, on this answer

# %%
sampled = spec.check_same_tokens(speculative_decode)
print("check 1: greedy == plain decoding, and sampled (temperature 1, top-k 50, seed 1) == the library's:",
      repr(decode(enc, sampled)))
remembering = partial(speculative_decode, forward=spec.remembered_forward)
tv, n = spec.check_lossless(remembering)
print(f"check 2: over all {n} possible 3-token continuations, TV(this loop, target) < 1e-12")

# %% [markdown]
# ## The negative control
#
# The same loop with the residual replaced by p (a "natural" fix: after a rejection, just let the
# target sample). Check 2's enumeration catches it: the TV is far above float64's rounding (1e-12),
# so the threshold here is 1e-6, whatever top-k it runs at.

# %%
def caught(settings):
    """TV(the loop drawing its correction from p, target) for these settings, asserted above 1e-6."""
    broken = spec.loop_distribution(partial(remembering, correction=lambda p, q: p), settings)
    reference = exact.sequence_distribution(spec.next_dist(target, settings), tuple(spec.short), 3)
    tv_broken = exact.total_variation(broken, reference)
    assert tv_broken > 1e-6, f"the broken loop went unseen: TV {tv_broken:.2e}"
    return tv_broken


print(f"correction drawn from p instead of the residual: TV = {caught(spec.SETTINGS):.3f}")

# %% [markdown]
# ## Try this
#
# * Run check 1 with one guess per step (`spec.check_same_tokens(speculative_decode, k=1)`): the greedy
#   tokens do not change (greedy output never depends on k), and sampled, the loop still emits the
#   library's tokens for the seed (the library run with `Plan(chain=1)`).
# * Keep every guess: give the loop `acceptance=lambda p, q, x: 1.0` instead of `answer.ratio` and
#   rerun check 2. What TV do you get, and whose distribution does the output
#   follow now? With k = 1 a step keeps the draft's guess and then draws the bonus token from the
#   target: the first and third tokens follow the draft, the second the target.
# * Run check 2 and the negative control at top-k 2 (`settings=(1.0, 2, None)`): the possible 3-token
#   continuations drop to 8, the TV stays below 1e-12, and the broken correction is still caught
#   (its TV above the threshold of 1e-6).
#
# Each prediction, checked by running the code above with that change:

# %%
def check_always_keep(acceptance):
    """The second prediction, for the loop keeping guesses with `acceptance` (to hold: always 1.0): its first 3
    tokens are not the target's, and are exactly the mix keeping every guess makes (draft, target, draft);
    {reference: TV from it}."""
    out = spec.loop_distribution(partial(remembering, acceptance=acceptance))
    p_next, q_next = spec.next_dist(target), spec.next_dist(draft)
    start = len(spec.short)

    def mix_next(context):  # the draft's distribution at the 1st and 3rd token, the target's at the 2nd
        return (q_next if (len(context) - start) % 2 == 0 else p_next)(context)

    tvs = {name: exact.total_variation(out, exact.sequence_distribution(f, tuple(spec.short), 3))
           for name, f in (("target", p_next), ("draft", q_next), ("mix", mix_next))}
    assert tvs["target"] > 1e-6 and tvs["mix"] < 1e-12, tvs
    return tvs


def check_top_k(settings):
    """The third, for these settings (to hold: top-k 2): 8 possible continuations, exact, the broken loop caught;
    (continuations, the broken loop's TV)."""
    tv, n = spec.check_lossless(remembering, settings)
    assert n == 8, f"{n} possible continuations"
    return n, caught(settings)


spec.check_same_tokens(speculative_decode, k=1)
print("k = 1: check 1 passes (greedy tokens unchanged, the library's sampled tokens)")
tvs = check_always_keep(lambda p, q, x: 1.0)
print(f"keeping every guess: TV {tvs['target']:.3f} from the target, {tvs['draft']:.3f} from the draft; "
      f"from the mix (draft, target, draft) below 1e-12: the output follows that mix exactly")
n, tv_broken = check_top_k((1.0, 2, None))
print(f"top-k 2: {n} possible continuations, TV < 1e-12; the broken correction caught at TV = {tv_broken:.1e}")
