# %% [markdown]
# # Lesson 10 (appendix): how the BLAS multiplies a block, and why the layout matters
#
# You will time the target's passes with three layouts of its matrix products and see which one
# this machine's BLAS runs faster at each block size. You will see whether odd block sizes cost more than
# the next multiple of 4 or 8 here. Then you will pad a block with dummy rows and check that the
# real rows' logits do not change.
#
# Lesson 2's premise, a pass over k new tokens costing much less than k passes, holds only if
# the matrix products of a k-row block read each weight once and hide the k rows of arithmetic
# behind that read. Whether a CPU delivers it depends on how the BLAS library (OpenBLAS, under
# NumPy) computes `x @ w` for a few rows. This appendix looks inside; the other lessons only use
# its outcome, `costcurve.choose_slab_rows` and `choose_gemv_rows`, the layout the tools pick for
# this machine.
#
# * **Packing.** For a matrix-matrix product OpenBLAS first copies ("packs") blocks of `w` into a
#   scratch buffer laid out for its kernel, on every call. For hundreds of rows that copy is paid
#   back many times; for 2 to 16 rows it can cost more than the arithmetic, so a 2-row block can
#   cost more than twice a 1-row one. A 1-row product goes to a matrix-vector routine, which does
#   not pack; whether that makes it cheaper than 2 rows depends on the kernel (on some CPUs it is
#   slower): the table below measures it, and says so where the curve falls.
# * **Kernels.** The innermost loop multiplies a small panel of rows by a panel of columns, 4 or
#   8 wide depending on the CPU's vector registers (AVX2 "Haswell", AVX-512 "SkylakeX", ...).
#   OpenBLAS picks the kernel for the CPU it finds (`OPENBLAS_CORETYPE` overrides it).
# * **Slabs.** `fastpath.Weight` keeps a second copy of each weight matrix cut into column slabs
#   of 64, and multiplies a block of up to `slab_rows` rows one small product per slab in a
#   single NumPy call. Kernels that multiply such small matrices without packing (OpenBLAS's
#   AVX-512 ones) then stream the weights once; kernels that pack even small products (the AVX2
#   ones) can lose. Both layouts compute the same numbers, so the tools time both and keep the
#   faster one (`costcurve.choose_slab_rows`, passed in with the model: `with_slabs(model, rows)`).
# * **One row.** Plain decoding's products are of one row; a kernel's two-row product can beat its
#   one-row path, so the core can also read one row as two (`Layout.one_row`, timed below).
# * **Row by row.** A block of k rows can also be k matrix-vector products over the whole matrix,
#   which never pack (`Layout.gemv_rows`): the first row reads the matrix from memory, the next ones
#   from the cache it has just filled. That wins where packing costs most, for 2 or 3 rows under
#   kernels that pack, and loses once the kernel's panel is full. The tools time it too
#   (`costcurve.choose_gemv_rows`; `row_by_row(model, rows)` here).

# %%
import numpy as np

from specdec_np.fastpath import ONE_ROW, laid_out
from specdec_np.gpt2 import forward, new_cache
from specdec_np.models import load_embedded
from specdec_np.tokenizer import encode
try:
    from lesson import bends, print_rounding, print_timed, verdict  # tutorials/lesson.py; mark lines measured on this machine
except ModuleNotFoundError:  # python -I leaves tutorials/ off sys.path
    raise SystemExit("tutorials/ is off sys.path (python -I): run python tutorials/lesson.py tutorials/10_appendix_blas.py")
from lesson import blas_name, one_blas_thread_if_busy, pass_ms, row_by_row, say_if_busy, start_timing, with_slabs

one_blas_thread_if_busy()
target, _, _, enc = load_embedded()
prompt = encode(enc, "def binary_search(items, x):\n    lo, hi = 0, len(items)\n    while lo < hi:\n")
print_timed(f"BLAS: {blas_name()}")

# %% [markdown]
# ## The three layouts, side by side
#
# A pass of k new tokens after the prompt, with one `x @ w` per product, with column slabs and row
# by row, timed in turns (medians of 9 after a warm-up), as ratios to one token against the ideal of 1.

# %%
KS = [1, 2, 4, 8, 16]
start = start_timing()
laid = {"x @ w": with_slabs(target, 0), "slabs": with_slabs(target, 16), "row by row": row_by_row(target, 16)}
runs = {name: {} for name in laid}  # {k: the 9 timings (ms)} of each layout
by_layout = {name: pass_ms(m, KS, prefix_len=len(prompt), repeats=9, runs=runs[name]) for name, m in laid.items()}
print(f"{'tokens':>6} " + " ".join(f"{name + ' ms':>10} {'vs 1 token':>10}" for name in by_layout) + f" {'ideal':>6}")
for k in KS:
    print_timed(f"{k:>6} " + " ".join(f"{c[k]:>10.2f} {c[k] / c[1]:>9.2f}x" for c in by_layout.values()) + f" {1:>5.2f}x")
for name, c in by_layout.items():
    print_timed(f"{name}: a 1-token pass costs {c[1]:.2f} ms here, a 2-token one {c[2]:.2f} ms ({c[2] / c[1]:.2f}x)")
    if line := bends(c):
        print_timed(f"{name}: {line}")
faster = {k: min(by_layout, key=lambda name: by_layout[name][k]) for k in KS}
# One token is the same matrix-vector products in all three layouts: only the blocks are compared.
for name in ("slabs", "row by row"):  # the layouts were timed in turns: round by round, each one's time over x @ w's
    for k in KS[1:]:
        ratio = [a / b for a, b in zip(runs[name][k], runs["x @ w"][k])]
        print_timed(f"{k:>2} tokens, {name}: its time over x @ w's: "
                    + verdict(ratio, 1, "x @ w faster", f"{name} faster", "x"))
# This table's choice, by the tools' rule: slabs for blocks of up to the largest size k at which slabs cost at
# most 5% more than one x @ w at every size from 2 to k (the fast path reads slabs up to a size, x @ w above it);
# one x @ w if slabs lose at 2. (The tools decide on blocks, which start at 2.)
ties = [k for k in KS[1:] if by_layout["slabs"][k] <= 1.05 * by_layout["x @ w"][k]]
slab_rows = max((k for i, k in enumerate(KS[1:]) if KS[1:i + 2] == ties[:i + 1]), default=0)
print_timed(f"so this table chooses {f'slabs for blocks of up to {slab_rows} rows' if slab_rows else 'one x @ w'}")
# Row by row, by the tools' rule: for blocks up to the largest size k at which it is faster than the layout just
# chosen at every size from 2 to k (the one-token row is the same matrix-vector products either way).
chosen = by_layout["slabs" if slab_rows else "x @ w"]
faster = [k for k in KS[1:] if by_layout["row by row"][k] < chosen[k]]
gemv_rows = max((k for i, k in enumerate(KS[1:]) if KS[1:i + 2] == faster[:i + 1]), default=1)
print_timed(f"and {f'row by row for blocks of up to {gemv_rows} rows' if gemv_rows > 1 else 'no block row by row'}")
say_if_busy(start)

# %% [markdown]
# Read the ratios against the ideal: where a layout stays near 1.00x, the block's arithmetic is
# hidden behind the weight reads; where it climbs, either the BLAS does work per call that grows
# with the rows (packing), or the arithmetic itself, 2 FLOPs per weight per row, outgrows the
# time the weights take to arrive. The tools make the same choice from a table of their own
# (`costcurve.choose_slab_rows`, timed separately when they measure a machine), so on another run,
# or near a tie, they can pick the other layout: near a tie either is as good.

# %% [markdown]
# ## One row: a matrix-vector product, or two rows' product
#
# Plain decoding is one-token passes, so its one-row products set the baseline that every speedup
# divides by. The core multiplies one row by a layer matrix in one of three ways (`Layout.one_row`):
# one matrix-vector product over the whole matrix ("gemv", which OpenBLAS may split over its
# threads), one small product per slab ("slabs"), or the slabs' product of two rows, the row and a
# copy of it, keeping the first output row ("pair"): where the BLAS's small-matrix kernel beats its
# one-row path, two rows cost less than one. The tools time the three
# (`costcurve.choose_one_row`) and keep the fastest; here they are side by side, a 2-token pass
# (slab by slab) beside them for scale.

# %%
start = start_timing()
one_runs = {how: {} for how in ONE_ROW}  # {1: the 9 timings (ms)} of each way
one_row = {how: pass_ms(laid_out(target, 16, one_row=how), [1, 2], prefix_len=len(prompt), repeats=9,
                        runs=one_runs[how])[1] for how in ONE_ROW}
two_rows = pass_ms(with_slabs(target, 16), [2], prefix_len=len(prompt), repeats=9)[2]
print_timed("a 1-token pass: " + ", ".join(f"{how} {ms:.2f} ms" for how, ms in one_row.items())
            + f"; a 2-token pass {two_rows:.2f} ms")
ratio = [a / b for a, b in zip(one_runs["pair"][1], one_runs["gemv"][1])]  # round by round
print_timed("a 1-token pass as a pair, over gemv: " + verdict(ratio, 1, "gemv faster", "the pair faster", "x"))
print_timed(f"the fastest one-token pass on this run: {min(one_row, key=one_row.get)}")
say_if_busy(start)

# %% [markdown]
# ## Odd sizes, and padding a block
#
# The kernels work on panels of 4 or 8 rows, so a block of 5-7 tokens can cost *more* than one of 8
# (and 13-15 more than 16): some kernels do, others do not, and on a busy machine the noise can hide
# it. Look at the row below: it says what this machine did on this run.
#
# Where an odd size does cost more, a verifier can exploit that for free: compute a 5-token tree as
# an 8-token block whose 3 extra rows are dummies that no real token attends to
# (`fastpath.laid_out(model, padding=...)`). The real rows compute exactly what they would alone;
# the decoder pads each block to the cheapest measured size at least as large, but only where it
# costs less by more than the noise between neighbouring sizes (3%): a size measured a hair cheaper
# by chance would cost its extra rows on every pass. The tools' table of these sizes
# (`costmodel.padding`) becomes the model's `Layout.padding` where they set its layout.

# %%
def pad_size(curve, k, slack=0.03):
    """The block size to compute k tokens as: the smallest of k and the larger measured sizes within `slack` of
    the cheapest of them."""
    sizes = [k] + [size for size in sorted(curve) if size > k]
    cheapest = min(curve[size] for size in sizes)
    return next(size for size in sizes if curve[size] <= cheapest * (1 + slack))


target = laid_out(with_slabs(target, slab_rows), gemv_rows=gemv_rows)  # this table's choice
start = start_timing()
odd = pass_ms(target, [4, 5, 6, 7, 8], prefix_len=len(prompt), repeats=7)
print_timed("target, ms per pass: " + ", ".join(f"{k} tokens {ms:.2f}" for k, ms in odd.items()))
dearer = [k for k in (5, 6, 7) if odd[k] > odd[8]]
print_timed(f"on this run blocks of {', '.join(map(str, dearer))} tokens cost more than one of 8" if dearer else
            "on this run no block of 5-7 tokens cost more than one of 8")
print_timed("padding this curve would compute " + ", ".join(f"{k} as {pad_size(odd, k)}" for k in (5, 6, 7)))
say_if_busy(start)

cache = new_cache(target)
forward(target, prompt, cache)
plain = forward(target, prompt[:5], cache)  # [5, n_vocab]
cache.truncate(len(prompt))


def check_padded(rows):
    """5 tokens computed as a block of `rows` rows (dummies after them): the same 5 rows of logits as alone, the
    cache 5 tokens longer; the largest difference (float32: the BLAS may sum in another order)."""
    padded = forward(laid_out(target, padding=(rows,) * 5), prompt[:5], cache)  # blocks of 1-5 tokens as `rows`
    assert padded.shape == plain.shape and cache.length == len(prompt) + 5
    cache.truncate(len(prompt))
    assert np.allclose(padded, plain, atol=1e-4), "the padded block's logits differ"
    return float(np.abs(padded - plain).max())


print_rounding(f"5 tokens padded to 8: the same 5 rows of logits, max difference {check_padded(8):.1e}")
# A size is padded only to a measured size that costs no more, and never below itself.
assert all(k <= pad_size(odd, k) <= 8 and odd[pad_size(odd, k)] <= odd[k] for k in (4, 5, 6, 7, 8))

# %% [markdown]
# ## Try this
#
# * Run this lesson with another kernel: `OPENBLAS_CORETYPE=Haswell .venv/bin/python
#   tutorials/10_appendix_blas.py` (or `SkylakeX` on a CPU with AVX-512). Look at which layout
#   wins at 2-8 tokens, and at the BLAS line: it names the kernel in use.
# * Run it with `OPENBLAS_NUM_THREADS=2` while another program keeps one core busy
#   (`python3 -c 'while True: pass' &`, then `kill %1`), and compare the ratios with a quiet run:
#   threads that wait for each other show up as jumps.
# * Pad to 16 rows instead of 8 (`check_padded(16)`): the real rows' logits still match, only the
#   cost changes. Checked below.

# %%
print_rounding(f"5 tokens padded to 16: the same 5 rows of logits, max difference {check_padded(16):.1e}")
