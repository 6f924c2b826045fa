"""Proofs and analysis, apart from the decoding path: nothing in `generate` imports them.

- `exact`: the exact output distribution of any code that draws through `sampling.Rand`, by
  enumerating every random branch, and `step_error`, the exact check of one speculative step against
  the target (how the tests prove the verification rules lossless and the exercises are graded).
- `optimum`: the best acceptance any lossless verifier can reach for drafts drawn a given way.
"""
