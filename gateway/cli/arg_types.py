"""argparse `type=` converters for numbers and lists that must be in range.

A converter's ArgumentTypeError becomes argparse's exit 2 with one line naming the option, so a
bad value is refused while the command line is parsed, before any model or dataset is loaded.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value):
        raise argparse.ArgumentTypeError("must be a number, not nan")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def port_number(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port lies in [0, 65535], not {value}")
    return value


def positive_float(text: str) -> float:
    """Finite and > 0: NaN compares false with every bound, so it would slip past a `<= 0` check."""
    value = _float(text)
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text}")
    return value


def positive_rate(text: str) -> float:
    """> 0, or inf (no pacing: everything at once)."""
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), not {text}")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text}")
    return value


def positive_int_list(text: str) -> list[int]:
    """A comma list such as '8,16': at least one entry, each >= 1."""
    values = positive_int_list_or_empty(text)
    if not values:
        raise argparse.ArgumentTypeError("takes a comma list of integers >= 1, such as 8,16; got none")
    return values


def positive_int_list_or_empty(text: str) -> list[int]:
    """A comma list such as '8,16', each entry >= 1; '' is the empty list (a benchmark's way to skip
    the runs the list sizes)."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a comma list of integers >= 1, such as 8,16, "
                                             f"not {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"takes integers >= 1, not {value}")
        values.append(value)
    return values


# The compute dtypes the benchmarks load a model in.
COMPUTE_DTYPES = ("float32", "bfloat16")


def dtype_list(text: str) -> list[str]:
    """A comma list of compute dtypes such as 'float32,bfloat16': at least one, each known, none twice."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"takes a comma list of {', '.join(COMPUTE_DTYPES)}; got none")
    unknown = [v for v in values if v not in COMPUTE_DTYPES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown dtype {unknown[0]!r}; choose from {', '.join(COMPUTE_DTYPES)}")
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"names a dtype twice: {text!r}")
    return values
