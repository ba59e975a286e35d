"""The fail-open limiter: what admits requests on one replica while the shared store is down.

A fresh local limiter would give every replica, and every reload, a whole new budget for the
outage. This one starts from the usage the replica last saw in the shared store instead: every
shared decision reports, per scope that keeps day and month counters, its tokens and nano-USD
used + reserved (after the request it admitted), and the limiter keeps the latest of them per
scope and period. Admitting locally, each budget limit is lowered by that known usage, and the
local store counts what is admitted from then on. (So during an outage what was reserved counts
as used: a budget that was full only with requests in flight is refused as spent, not held.)
A request the shared store admitted and then settled for less than it reserved lowers the
figures it was counted in by the difference (`settled`): without it a replica's last figure
would keep every finished request at its whole reservation, and an outage would refuse a
tenant with most of its budget left, until the period renewed.

Usage admitted locally is replayed to the shared store later; a decision seen after such a
replay already includes it, while the local store still counts it. So each observation keeps
how much local usage had been replayed when it was made, and the limit is lowered by the known
usage net of it:

    counted while down = last seen - local usage replayed before it was seen + all local usage

The limiter (its local store and what it has seen) belongs to one shared store, so a reload that
keeps `limits.store` keeps it (gateway/limits.py). It remembers MAX_SCOPES scopes (least recently
decided first out); a scope it does not know starts from zero, as before.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict

from policies.budgets.memory_store import MemoryBudgetStore
from policies.budgets.rules import periods
from policies.budgets.types import NO_LIMIT, QUOTA_KINDS, Decision, FinishStatus, Reservation, ReservePlan, ScopeRule

MAX_SCOPES = 100_000
_DAY, _MONTH = "d", "m"


@dataclasses.dataclass
class _Seen:
    label: str              # the UTC day or month the figures belong to
    tokens: int             # used + reserved, as the shared store last reported
    cost: int
    replayed_tokens: int    # local usage replayed to the store by then (included in the figures)
    replayed_cost: int


def _lowered(limit: int, used: int) -> int:
    return limit if limit == NO_LIMIT else max(0, limit - used)


class FailOpenLimiter:
    def __init__(self, max_scopes: int = MAX_SCOPES, clock_us=None):
        self._clock = clock_us or (lambda: time.time_ns() // 1000)
        self.store = MemoryBudgetStore(clock_us=self._clock)
        self._max = max_scopes
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._replayed: OrderedDict[tuple[str, str], list] = OrderedDict()   # -> [label, tokens, cost]

    # ---- learning, while the shared store answers -----------------------------------------
    def observe(self, rules: tuple[ScopeRule, ...], decision: Decision) -> None:
        """Keep the budget counters a shared decision reported (aligned with its rules)."""
        for rule, counters in zip(rules, decision.counters):
            day_t, day_c, month_t, month_c = counters
            for kind, label, tokens, cost in ((_DAY, decision.day, day_t, day_c),
                                              (_MONTH, decision.month, month_t, month_c)):
                if tokens < 0:          # this scope keeps no counters of that period
                    continue
                key = (rule.scope, kind)
                rep = self._replayed.get(key)
                rep_t, rep_c = (rep[1], rep[2]) if rep is not None and rep[0] == label else (0, 0)
                self._seen[key] = _Seen(label, tokens, cost, rep_t, rep_c)
                self._seen.move_to_end(key)
        self._trim(self._seen)

    def replayed(self, reservation: Reservation, tokens: int, cost: int) -> None:
        """Usage admitted locally has reached the shared store."""
        for scope, flags in zip(reservation.scopes, reservation.budget_flags):
            for kind, bit, label in ((_DAY, 1, reservation.day), (_MONTH, 2, reservation.month)):
                if not flags & bit:
                    continue
                key = (scope, kind)
                rep = self._replayed.get(key)
                if rep is None or rep[0] != label:
                    rep = self._replayed[key] = [label, 0, 0]
                rep[1] += tokens
                rep[2] += cost
                self._replayed.move_to_end(key)
        self._trim(self._replayed)

    def settled(self, reservation: Reservation, tokens: int, cost: int) -> None:
        """A reservation the shared store admitted (its figures, seen then and since, hold it
        whole) was reconciled there with what it used."""
        unused_t, unused_c = max(0, reservation.tokens - tokens), max(0, reservation.cost_nano - cost)
        for scope, flags in zip(reservation.scopes, reservation.budget_flags):
            for kind, bit, label in ((_DAY, 1, reservation.day), (_MONTH, 2, reservation.month)):
                seen = self._seen.get((scope, kind)) if flags & bit else None
                if seen is not None and seen.label == label:
                    seen.tokens = max(0, seen.tokens - unused_t)
                    seen.cost = max(0, seen.cost - unused_c)

    def known(self, scope: str, kind: str, label: str) -> tuple[int, int]:
        """(tokens, nano-USD) counted against this scope's budget in that period before the local
        store's own count: the last shared figures, net of local usage replayed into them."""
        seen = self._seen.get((scope, kind))
        if seen is None or seen.label != label:
            return 0, 0
        return max(0, seen.tokens - seen.replayed_tokens), max(0, seen.cost - seen.replayed_cost)

    def _trim(self, table: OrderedDict) -> None:
        while len(table) > self._max:
            table.popitem(last=False)

    # ---- deciding, while it does not ------------------------------------------------------
    def local_rules(self, rules: tuple[ScopeRule, ...], day: str, month: str) -> tuple[ScopeRule, ...]:
        out = []
        for rule in rules:
            day_t, day_c = self.known(rule.scope, _DAY, day)
            month_t, month_c = self.known(rule.scope, _MONTH, month)
            out.append(dataclasses.replace(
                rule, tokens_per_day=_lowered(rule.tokens_per_day, day_t),
                cost_per_day=_lowered(rule.cost_per_day, day_c),
                tokens_per_month=_lowered(rule.tokens_per_month, month_t),
                cost_per_month=_lowered(rule.cost_per_month, month_c)))
        return tuple(out)

    async def reserve(self, plan: ReservePlan) -> Decision:
        now = self._clock()
        day, month, next_day, next_month = periods(now)
        decision = await self.store.reserve(dataclasses.replace(plan, rules=self.local_rules(plan.rules, day, month)))
        if decision.code in QUOTA_KINDS and decision.retry_after_s is None:
            # The lowered limit may refuse what the whole budget would hold: it renews with the period.
            rule = next((r for r in plan.rules if r.scope == decision.scope), None)
            need = plan.cost_nano if decision.code.startswith("cost") else plan.tokens
            if rule is not None and need <= getattr(rule, decision.code):
                reset = next_day if decision.code.endswith("_day") else next_month
                decision = dataclasses.replace(decision, retry_after_s=(reset - now) / 1e6)
        return decision

    async def finish(self, reservation: Reservation, tokens: int, cost_nano: int,
                     tombstone_ttl_s: float) -> FinishStatus:
        return await self.store.finish(reservation, tokens, cost_nano, tombstone_ttl_s)
