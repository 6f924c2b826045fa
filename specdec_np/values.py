"""What an argument's number may be: an integer (a bool is not one here, though Python counts it as one)
or a finite real number; the one check of each, for the core and the tools. And a bad one's error, as data
(`FieldError`: the field, its value and why), which each caller words its own way."""

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


def value_is(value) -> str:
    """A field's value as messages show it: "8", "2,2,1" (a tuple)."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def field_is(name: str, *value) -> str:
    """A field as the core's messages name it, "budget", or with its value, "widths=2,2,1" (a string quoted:
    "top_k='5'" is not the number 5)."""
    return name + "".join("=" + (repr(v) if isinstance(v, str) else value_is(v)) for v in value)


class FieldError(ValueError):
    """A bad field or argument as data: its `field` (a name, or a tuple of names), `value` (values) and `why`, so
    that a caller names the field its own way (`words`; the command line: by its option). Its message is `about`
    ("plan: " for a plan's fields), `lead`, the field(s) (with their values if `valued`), then `why`."""

    def __init__(self, field, value, why: str, lead: str = "", valued: bool = True, about: str = "plan: "):
        self.field, self.value, self.why, self.lead, self.valued = field, value, why, lead, valued
        super().__init__(about + self.words())

    def words(self, say=field_is) -> str:
        """The error with each field named by `say(name, value)` (`say(name)` where the value is not shown)."""
        fields, values = (self.field, self.value) if isinstance(self.field, tuple) else ((self.field,), (self.value,))
        named = ", ".join(say(f, v) if self.valued else say(f) for f, v in zip(fields, values))
        return f"{self.lead}{named}{self.why}"
