"""What the simulator's commands share on the command line: value types that refuse a bad
value naming its option (``argparse`` adds the option's name to the ``ArgumentTypeError``),
and the exit for bad input found after parsing, with one line naming what is wrong instead
of a traceback."""

from __future__ import annotations

import argparse
import math
import sys


def number(text: str) -> float:
    """Any finite number."""
    value = _parsed(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def non_negative(text: str) -> float:
    """A number of 0 or more (``inf`` allowed: "never")."""
    value = _parsed(text)
    if not value >= 0.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text} is not a number of 0 or more")
    return value


def finite_non_negative(text: str) -> float:
    """A finite number of 0 or more."""
    value = number(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of 0 or more")
    return value


def share(text: str) -> float:
    """A share between 0 and 1."""
    value = number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a share between 0 and 1")
    return value


def whole(text: str, least: int = 0) -> int:
    """A whole number of ``least`` (0) or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of {least} or more")
    return value


def positive(text: str) -> int:
    """A whole number of 1 or more."""
    return whole(text, least=1)


def ascending_positive(text: str) -> tuple[float, ...]:
    """Comma-separated numbers above 0, ascending (at least one)."""
    values = tuple(number(part) for part in text.split(",") if part.strip())
    if not values or values[0] <= 0 or list(values) != sorted(set(values)):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of ascending numbers above 0"
        )
    return values


def _parsed(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None


def fail(prog: str, message: str) -> int:
    """Say ``message`` on stderr as argparse says a usage error; the exit status (2)."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
