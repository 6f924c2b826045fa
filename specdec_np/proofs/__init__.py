"""Proofs and analysis, apart from the decoding path (nothing in `generate` imports them): `exact`, the exact output
distribution of code that draws through `sampling.Rand`; `optimum`, the best acceptance a lossless verifier can reach.
"""
