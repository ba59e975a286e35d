"""Values that cross the budgets API: scopes, rules, decisions, reservations, errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass

NO_LIMIT = -1  # how a missing limit travels to the stores (0 is a real limit: nothing allowed)

QUOTA_KINDS = (  # the limit kinds that make a refusal "insufficient_quota"
    "tokens_per_day", "tokens_per_month", "cost_per_day", "cost_per_month")

HELD_SUFFIX = ":held"


def held_kind(kind: str) -> str:
    """A budget refused only because requests in flight hold part of it (what was used leaves
    room): a rate-limit refusal with a short wait, not a spent budget."""
    return kind + HELD_SUFFIX


# Scope ids carry the kind as a prefix, so a tenant and an API key with the same name never share state.
SCOPE_PREFIX = {"api_key": "k:", "tenant": "t:", "tier": "m:", "session": "s:"}


class InvalidScope(ValueError):
    """A scope id the stores cannot key on (empty, too long, control characters)."""


class BudgetStoreUnavailable(Exception):
    """The shared store is unreachable and the policy is fail-closed: answer 503."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = retry_after


class StoreError(Exception):
    """Raised by a store when it cannot answer (connection refused, timeout, server error)."""


@dataclass(frozen=True)
class Scopes:
    """Who a request is charged to. None: that scope does not apply to this request."""

    api_key: str | None = None   # the key's name as auth knows it, never the secret itself
    tenant: str | None = None
    tier: str | None = None      # also selects the price of the request
    session: str | None = None   # `x-session-id`; scoped under the tenant


@dataclass(frozen=True)
class ScopeRule:
    """One scope's limits in store units (tokens, nano-USD); NO_LIMIT where none applies."""

    scope: str
    rpm: int = NO_LIMIT
    tpm: int = NO_LIMIT
    max_concurrent: int = NO_LIMIT
    tokens_per_day: int = NO_LIMIT
    tokens_per_month: int = NO_LIMIT
    cost_per_day: int = NO_LIMIT
    cost_per_month: int = NO_LIMIT

    def limits(self) -> tuple[int, ...]:
        return (self.rpm, self.tpm, self.max_concurrent, self.tokens_per_day, self.tokens_per_month,
                self.cost_per_day, self.cost_per_month)

    @property
    def budget_flags(self) -> int:
        """Bit 1: the scope keeps day counters; bit 2: month counters. A key, tenant or tier scope
        keeps both, limited or not, so a day or month budget added later (a reload) starts from
        what was already used in its period. A session (an id the client picks: there may be
        many) keeps only those it has a budget for. The stores' records carry the flags, so a
        reservation made before a change is finished as it was made."""
        if not self.scope.startswith(SCOPE_PREFIX["session"]):
            return 3
        day = self.tokens_per_day != NO_LIMIT or self.cost_per_day != NO_LIMIT
        month = self.tokens_per_month != NO_LIMIT or self.cost_per_month != NO_LIMIT
        return int(day) | (2 * int(month))


@dataclass(frozen=True)
class ReservePlan:
    rid: str
    rules: tuple[ScopeRule, ...]
    tokens: int
    cost_nano: int
    ttl_s: float
    tombstone_ttl_s: float


@dataclass(frozen=True)
class RateLimitInfo:
    """What the x-ratelimit-* headers say: the most constrained scope for requests and for tokens."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """A store's raw answer to a ReservePlan."""

    code: str                 # "ok", "rpm", "tpm", "max_concurrent", a QUOTA_KINDS entry (or its held_kind), "duplicate"
    scope: str | None         # the scope that refused
    retry_after_s: float | None   # None: waiting does not help
    now: float                # the store's clock, epoch seconds
    day: str                  # UTC period labels the reservation was counted in
    month: str
    info: RateLimitInfo
    # Per rule of the plan, in its order: (day tokens, day nano-USD, month tokens, month nano-USD)
    # used + reserved, after this reservation when admitted; -1 where the scope keeps no such
    # counter. The fail-open limiter starts from them (fail_open.py).
    counters: tuple[tuple[int, int, int, int], ...] = ()


@dataclass(frozen=True)
class Reservation:
    """Capacity held for one request until reconcile/release, or until it expires."""

    id: str
    tier: str | None
    tokens: int
    cost_nano: int
    day: str
    month: str
    scopes: tuple[str, ...]
    budget_flags: tuple[int, ...]
    expires_at: float         # store clock
    local: bool = False       # made by the fail-open local limiter while the shared store was down

    def record(self) -> dict:
        """The reservation as the stores keep it (used to charge it where the store lost it)."""
        return {"t": str(self.tokens), "c": str(self.cost_nano), "d": self.day, "m": self.month,
                "s": list(self.scopes), "b": list(self.budget_flags)}


class FinishStatus(str, enum.Enum):
    APPLIED = "applied"       # reserved capacity released, actual usage committed
    DUPLICATE = "duplicate"   # already reconciled or released: nothing changed
    LATE = "late"             # the reservation had expired; the actual usage was committed
    ORPHAN = "orphan"         # the store had no record (lost or never reached): usage committed
    QUEUED = "queued"         # for the shared store, which is (or was, at admission) down: replayed
    NOOP = "noop"             # no scope had limits: nothing to do


@dataclass(frozen=True)
class Admission:
    allowed: bool
    reason: str | None        # None, "rate_limit_exceeded" or "insufficient_quota"
    message: str
    retry_after: float | None  # seconds; None when waiting will not help
    limits: RateLimitInfo
    reservation: Reservation | None
    scope: str | None = None  # the scope that refused, e.g. "t:acme"
    limit_kind: str | None = None  # e.g. "tpm", "tokens_per_day"
    store_time: float = 0.0   # the deciding store's clock (epoch seconds)
    degraded: bool = False    # decided by the local limiter while the shared store was down
