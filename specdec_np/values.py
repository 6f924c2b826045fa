"""What an argument's number may be: an integer (a bool is not one here, though Python counts it as one)
or a finite real number; the one check of each, for the core and the tools."""

import math
import numbers


def integral(value) -> bool:
    """Whether value is an integer (a bool is not one here)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def whole(value, low: int) -> bool:  # an integer >= low
    return integral(value) and value >= low


def real(value) -> bool:
    """Whether value is a finite real number (a bool is not one here)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
