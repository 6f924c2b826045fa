"""The `Plan`, how `decode.generate` drafts and verifies (a plain value, each field checked when it is made),
and the constant plan used when none is given (`constant`); what a method makes of it is methods.py's."""

from __future__ import annotations

from dataclasses import dataclass

from .values import FieldError, real, whole


def whole_tuple(value, low: int) -> tuple | None:
    """A list or tuple of integers >= low as a tuple of ints; None if it is anything else."""
    if not isinstance(value, (list, tuple)) or not all(whole(v, low) for v in value):
        return None
    return tuple(int(v) for v in value)


@dataclass(frozen=True)
class Plan:
    """How to decode: the draft tree's shape, stage 2's work, the verification rule.

    shape: "best_first" (the `budget` drafted nodes of highest cumulative draft probability, at most
      `depth` deep; cf. EAGLE-2) or "fixed" (`widths[d]` children under every node at depth d; so
      are trees drawn from q).
    chain: drafted tokens per step of the chain methods (speculative, lookup).
    lookup_chains: prompt lookup's chain lengths after a match of the last 3, 2, 1 tokens (0: none
      after a match that short, weak evidence); () = `chain` after any match.
    sampled: None (children are the draft's top tokens) or "with" / "without" replacement
      (children drawn from q: at temperature 1 they are accepted far more often than top tokens).
    guess_len, guess_rows: stage 2 for the draft (staged): the n-gram guesses `guess_len` levels below
      each node the draft evaluates, in the same pass, at most `guess_rows` per pass ("pad": as many
      as fill a padded pass's rows); 0: none.
    copy_len: stage 2 for the target (staged): when the last three tokens recur, the step verifies
      the `copy_len` tokens that followed them, with no draft pass; 0: never.
    rule: the verification rule (verify.RULES, checked by generate); None: greedy at temperature 0,
      else the lossless rule the tree's construction assumes.
    min_q: in a tree of fixed widths (drawn from q or not) and a chain, a drafted token whose q is below
      min_q gets no children: the draft stops below a token it doubts, whose children are rarely accepted,
      and saves their passes (the early exit of BiLD, Kim et al. 2023); 0: never. Lossless with every rule:
      whether a node gets children is decided before they are drawn.
    """

    shape: str = "best_first"
    budget: int = 8
    depth: int = 6
    widths: tuple = (2, 2, 1, 1, 1, 1)
    chain: int = 4
    lookup_chains: tuple = ()
    sampled: str | None = None
    guess_len: int = 3
    guess_rows: int | str = 4
    copy_len: int = 12
    rule: str | None = None
    min_q: float = 0.0

    def __post_init__(self):
        def bad(name, expected):  # the plan's message: "plan: budget must be an integer >= 1, got 0"
            raise FieldError(name, getattr(self, name), f" must be {expected}, got {getattr(self, name)!r}", valued=False)

        def integer(name, low):
            if not whole(getattr(self, name), low):
                bad(name, f"an integer >= {low}")
            object.__setattr__(self, name, int(getattr(self, name)))

        if self.shape not in ("best_first", "fixed"):
            bad("shape", "'best_first' or 'fixed'")
        for name, low in (("budget", 1), ("depth", 1), ("chain", 1), ("guess_len", 0), ("copy_len", 0)):
            integer(name, low)
        widths = whole_tuple(self.widths, 1)
        if not widths:
            bad("widths", "a non-empty list of integers >= 1")
        object.__setattr__(self, "widths", widths)
        chains = whole_tuple(self.lookup_chains, 0)
        if chains is None or (chains and (len(chains) != 3 or not any(chains))):
            bad("lookup_chains", "() or 3 integers >= 0 (after matches of 3, 2, 1 tokens), not all 0")
        object.__setattr__(self, "lookup_chains", chains)
        if self.sampled not in (None, "with", "without"):
            bad("sampled", "None, 'with' or 'without'")
        if self.guess_rows != "pad":
            integer("guess_rows", 0)
        if not (real(self.min_q) and 0 <= self.min_q <= 1):
            bad("min_q", "a number from 0 to 1")
        object.__setattr__(self, "min_q", float(self.min_q))


def constant(temperature: float = 0.0) -> Plan:
    """The constant plan, the same on every machine: `Plan()` at temperature 0; when sampling, one child drawn
    from q per level (accepted far more often than a top token, and each level costs a draft pass), and short
    chains and copies. Chosen from the shipped acceptance profile priced by the cost model (docs/reference.md)."""
    check_temperature(temperature)
    if temperature == 0:
        return Plan()
    return Plan(shape="fixed", widths=(1, 1, 1), sampled="without", chain=3, lookup_chains=(7, 3, 0), guess_len=0,
                guess_rows=0, copy_len=3)


def check_temperature(temperature) -> None:
    """The one check of a temperature (here, below checks.py, for `constant`): a FieldError naming it unless it is
    a finite number >= 0."""
    if not (real(temperature) and temperature >= 0):
        raise FieldError("temperature", temperature, " must be a finite number >= 0 (0 = greedy)", about="")
