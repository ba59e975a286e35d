"""JSON has no NaN or infinity (json.dumps writes them anyway, and strict readers, a browser's
JSON.parse included, refuse them): figures that have none, such as the percentiles of no sample,
are written as null."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every non-finite float, however deep in dicts, lists and tuples, as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value
