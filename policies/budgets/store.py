"""The budget store protocol: both stores implement it with the same semantics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from policies.budgets.types import (
    Decision,
    FinishStatus,
    RateLimitInfo,
    Reservation,
    ReservePlan,
)

CONCURRENCY_RETRY_S = 1.0  # in-flight limits free up when others finish: a hint, not a promise


@dataclass(frozen=True)
class ScopeUsage:
    """One scope's counters in the store's current day and month."""

    scope: str
    day: str
    month: str
    used_tokens_day: int = 0
    reserved_tokens_day: int = 0
    used_cost_day: int = 0       # nano-USD
    reserved_cost_day: int = 0
    used_tokens_month: int = 0
    reserved_tokens_month: int = 0
    used_cost_month: int = 0
    reserved_cost_month: int = 0
    in_flight: int = 0


class BudgetStore(Protocol):
    async def reserve(self, plan: ReservePlan) -> Decision:
        """Check every rule and, only if all pass, reserve in all of them (one atomic step)."""

    async def finish(self, reservation: Reservation, tokens: int, cost_nano: int,
                     tombstone_ttl_s: float) -> FinishStatus:
        """Release the reservation and commit the actual usage, exactly once per reservation id."""

    async def usage(self, scope: str) -> ScopeUsage: ...

    async def held(self) -> int:
        """Reservations still held (neither finished nor expired)."""

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


def decision_from_raw(raw: list) -> Decision:
    """The Redis script's reply (also produced by the memory store) as a Decision: 13 fields, then
    4 budget counters per rule (see Decision.counters)."""
    code, scope, _what, retry_us, now_us, day, month, lr, rr, sr, lt, rt, st = raw[:13]
    rest = [int(v) for v in raw[13:]]
    counters = tuple(tuple(rest[i:i + 4]) for i in range(0, len(rest) - 3, 4))

    def opt(v):
        return None if int(v) < 0 else int(v)

    def secs(v):
        return None if int(v) < 0 else int(v) / 1e6

    info = RateLimitInfo(limit_requests=opt(lr), remaining_requests=opt(rr), reset_requests_s=secs(sr),
                         limit_tokens=opt(lt), remaining_tokens=opt(rt), reset_tokens_s=secs(st))
    return Decision(code=_s(code), scope=_s(scope) or None, retry_after_s=secs(retry_us),
                    now=int(now_us) / 1e6, day=_s(day), month=_s(month), info=info, counters=counters)


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
