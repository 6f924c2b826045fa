"""The loop measure: how much of an output repeats itself, so a reader can tell whether a speedup comes from copying a
loop (prompt lookup and stage 2's copies verify whole repeated chains in one pass): the share of emitted tokens that
end an n-gram already in the output. Plausible code scores 0.2-0.5 over 128 tokens; a model stuck in a loop near 1.
"""

from __future__ import annotations


def repeats(tokens: list, n: int = 4) -> list[bool]:
    """For each of `tokens` (one output, prompt excluded), whether it ends an n-gram seen ending earlier in it."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    seen, out = set(), [False] * min(n - 1, len(tokens))
    for i in range(n - 1, len(tokens)):
        gram = tuple(tokens[i - n + 1:i + 1])
        out.append(gram in seen)
        seen.add(gram)
    return out


def repeat_share(tokens: list, n: int = 4) -> float:
    """Share of `tokens` (one output, prompt excluded) that end an n-gram seen ending earlier in it (0 if empty)."""
    return sum(repeats(tokens, n)) / len(tokens) if tokens else 0.0


def repeat_line(shares: list) -> str:
    """The measure over several outputs in words: the average and the range, e.g. for bench's prompts."""
    return (f"4-gram repeats (share of emitted tokens that end a 4-gram already in the output): "
            f"{sum(shares) / len(shares):.2f} on average ({min(shares):.2f}-{max(shares):.2f})")
