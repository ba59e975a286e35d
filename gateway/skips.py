"""Why a tier of the chain was passed over: one small typed record per skip or failed attempt.

What leaves the gateway is `str(skip)`: the tier's name and the reason code (the
x-tiergate-fallbacks header). `detail` is written for operators (the log
line, warnings, the console) and never goes into a response; it names an upstream's address or
quotes what it answered only for a tenant whose content may be recorded (chain_walk.py). Spans and metrics read `reason` (a fixed, low-cardinality set).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SkipReason(StrEnum):
    NOT_READY = "not_ready"          # still loading, or failed to load
    TIER_BUSY = "tier_busy"          # at its max_in_flight while a later tier may be free
    BREAKER_OPEN = "breaker_open"    # its circuit breaker refused the call (open or half-open)
    TIER_BUDGET = "tier_budget"      # the tier's own budget scope is at its limit
    BUDGET = "budget"                # a cascade's target the request's budgets would not admit
    TIER_UNFIT = "tier_unfit"        # called: the request does not fit it (context length, fields)
    TIER_FAILURE = "tier_failure"    # called: it failed on its side
    EMPTY_STREAM = "empty_stream"    # called: its stream ended before the first chunk
    POOL_EXHAUSTED = "pool_exhausted"  # the gateway's connections to it are all in use
    TENANT_SHARE = "tenant_share"    # the tenant holds its whole share of those connections
    CAPABILITY = "capability"        # the request needs what the tier lacks (detail: e.g. "tools")


@dataclass(frozen=True, slots=True)
class Skip:
    tier: str
    reason: SkipReason
    detail: str        # for operators, e.g. "still loading", "failed: connect_error: ..."

    def __str__(self) -> str:
        return f"{self.tier}: {self.reason.value}"

    def for_log(self) -> str:
        return f"{self.tier}: {self.reason.value} ({self.detail})" if self.detail else str(self)
