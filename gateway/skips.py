"""Why a tier of the chain was passed over: one small typed record per skip or failed attempt.

Spans and metrics read `reason` (a fixed, low-cardinality set); the x-tiergate-fallbacks
header, the log line and escalation notes show `str(skip)`, which is written for people.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SkipReason(StrEnum):
    NOT_READY = "not_ready"          # still loading, or failed to load
    TIER_BUSY = "tier_busy"          # at its max_in_flight while a later tier may be free
    BREAKER_OPEN = "breaker_open"    # its circuit breaker refused the call (open or half-open)
    TIER_BUDGET = "tier_budget"      # the tier's own budget scope is at its limit
    TIER_UNFIT = "tier_unfit"        # called: the request does not fit it (context length)
    TIER_FAILURE = "tier_failure"    # called: it failed on its side
    EMPTY_STREAM = "empty_stream"    # called: its stream ended before the first chunk


@dataclass(frozen=True, slots=True)
class Skip:
    tier: str
    reason: SkipReason
    detail: str        # for people, e.g. "still loading", "failed: upstream answered 500"

    def __str__(self) -> str:
        return f"{self.tier}: {self.detail}"
