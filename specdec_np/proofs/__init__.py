"""Proofs and analysis, apart from the decoding path: nothing in `generate` imports them.

- `exact`: the exact output distribution of any code that draws through `sampling.Rand`, by
  enumerating every random branch (how the tests prove the verification rules lossless).
- `optimum`: the best acceptance any lossless verifier can reach for drafts drawn a given way.
"""
