"""The in-memory budget store: the embedded default, and the local limiter when Redis is down.

It follows the Redis scripts (lua_scripts.py) step for step, with the same float arithmetic,
so both stores decide alike; the shared test suite runs against both. Each method runs
without an await, so on one event loop every decision is atomic.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from policies.budgets.rules import periods
from policies.budgets.store import CONCURRENCY_RETRY_S, ScopeUsage, decision_from_raw
from policies.budgets.types import SCOPE_PREFIX, Decision, FinishStatus, Reservation, ReservePlan, held_kind

MINUTE = 60_000_000
_CONC_RETRY = int(CONCURRENCY_RETRY_S * 1e6)
_HELD_RETRY = _CONC_RETRY      # budgets held by requests in flight free up as they finish
_SWEEP_EVERY_US = 60 * 1_000_000


@dataclass
class _Record:
    state: str            # "h" held, "e" expired, "d" done
    rec: dict
    drop_at: int          # µs: when the record (or tombstone) is forgotten


class MemoryBudgetStore:
    def __init__(self, clock_us=None):
        self._clock = clock_us or (lambda: time.time_ns() // 1000)
        self._tat: dict[str, list[float]] = {}                 # scope -> [requests TAT, tokens TAT]
        self._in_flight: dict[str, dict[str, int]] = {}        # scope -> {rid: expiry}
        self._counters: dict[tuple[str, str, str], dict[str, int]] = {}  # (kind, scope, label)
        self._records: dict[str, _Record] = {}
        self._expiries: list[tuple[int, str]] = []             # heap: (expiry, rid) of held ones
        self._next_sweep = 0

    # --- shared helpers (the script's PRELUDE) ---

    def _counter_keys(self, rec: dict, i: int) -> list[tuple[str, str, str]]:
        flags, sid = int(rec["b"][i]), rec["s"][i]
        keys = []
        if flags % 2 == 1:
            keys.append(("bd", sid, rec["d"]))
        if flags >= 2:
            keys.append(("bm", sid, rec["m"]))
        return keys

    def _counter(self, key) -> dict[str, int]:
        return self._counters.setdefault(key, {})

    def _unreserve(self, rid: str, rec: dict) -> None:
        tokens, cost = int(rec["t"]), int(rec["c"])
        for i, sid in enumerate(rec["s"]):
            for key in self._counter_keys(rec, i):
                c = self._counter(key)
                c["rt"] = max(0, c.get("rt", 0) - tokens)
                c["rc"] = max(0, c.get("rc", 0) - cost)
            if rec.get("q") and int(rec["q"][i]) == 1:
                self._in_flight.get(sid, {}).pop(rid, None)

    def _reap(self, now: int) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            _, rid = heapq.heappop(self._expiries)
            r = self._records.get(rid)
            if r is not None and r.state == "h":
                self._unreserve(rid, r.rec)
                r.state = "e"

    def _sweep(self, now: int) -> None:
        """Forget idle state once a minute, as Redis' key expiries do."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_EVERY_US
        self._records = {k: r for k, r in self._records.items() if r.drop_at > now}
        self._tat = {k: v for k, v in self._tat.items() if max(v) > now}
        self._in_flight = {k: v for k, v in self._in_flight.items() if v}
        # Keep periods as long as Redis keeps their keys (3 days, 40 days): late finishes land there.
        oldest_day = periods(now - 3 * 86_400 * 1_000_000)[0]
        oldest_month = periods(now - 40 * 86_400 * 1_000_000)[1]
        self._counters = {k: v for k, v in self._counters.items()
                          if any(v.values()) and k[2] >= (oldest_day if k[0] == "bd" else oldest_month)}

    # --- the decision ---

    async def reserve(self, plan: ReservePlan) -> Decision:
        now = self._clock()
        self._sweep(now)
        self._reap(now)
        day, month, next_day, next_month = periods(now)
        tokens, cost = plan.tokens, plan.cost_nano
        existing = self._records.get(plan.rid)
        if existing is not None and existing.drop_at > now:
            return decision_from_raw(["duplicate", "", "", -1, now, day, month, -1, -1, -1, -1, -1, -1])

        rate_fail = quota_fail = None
        # Header values: `after` if the request is admitted, `before` (state without it) if refused.
        after, before = [-1] * 6, [-1] * 6

        def fail(cur, sid, what, retry):
            if cur is None or (cur[2] != -1 and (retry == -1 or retry > cur[2])):
                return (sid, what, retry)
            return cur

        def header(h, off, limit, remaining, reset):
            if h[off] == -1 or remaining < h[off + 1]:
                h[off:off + 3] = [limit, max(remaining, 0), math.ceil(max(reset, 0))]

        def gcra(limit, units, tat, off, after=after, before=before):
            base = max(tat, now)
            if limit == 0:
                header(after, off, 0, 0, 0)
                header(before, off, 0, 0, 0)
                return (None, -1) if units > 0 else (base, None)
            T = MINUTE / limit
            new = base + T * units
            rem_before = math.floor((MINUTE - (base - now)) / T + 1e-9)
            header(before, off, limit, rem_before, base - now)
            if units > limit:
                header(after, off, limit, rem_before, base - now)
                return None, -1
            if new - now > MINUTE + 1:
                header(after, off, limit, rem_before, base - now)
                return None, math.ceil(new - now - MINUTE - 1)
            header(after, off, limit, math.floor((MINUTE - (new - now)) / T + 1e-9), new - now)
            return new, None

        def check_budget(sid, key, tlim, clim, reset_at, what_t, what_c):
            nonlocal quota_fail
            c = self._counters.get(key, {})
            ut, rt, uc, rc = c.get("ut", 0), c.get("rt", 0), c.get("uc", 0), c.get("rc", 0)
            nonlocal rate_fail
            # Over only with what requests in flight hold: a short wait, as in the Redis script.
            if tlim >= 0 and ut + rt + tokens > tlim:
                if ut + tokens <= tlim:
                    rate_fail = fail(rate_fail, sid, held_kind(what_t), _HELD_RETRY)
                else:
                    quota_fail = fail(quota_fail, sid, what_t, reset_at - now if tokens <= tlim else -1)
            if clim >= 0 and uc + rc + cost > clim:
                if uc + cost <= clim:
                    rate_fail = fail(rate_fail, sid, held_kind(what_c), _HELD_RETRY)
                else:
                    quota_fail = fail(quota_fail, sid, what_c, reset_at - now if cost <= clim else -1)
            return [ut + rt, uc + rc]

        def with_counters(reply: list, add: int) -> list:
            # The budget counters of every scope after the decision (`add`: this reservation's share).
            for pair in budget_counters:
                for t, c in (pair[:2], pair[2:]):
                    reply += [-1, -1] if t < 0 else [t + add * tokens, c + add * cost]
            return reply

        updates = []
        budget_counters = []
        for rule in plan.rules:
            sid = rule.scope
            new_r = new_t = None
            tats = self._tat.get(sid, [0.0, 0.0])
            # A tier's scope is shared by every tenant: its state stays out of the caller's headers.
            hidden = ([-1] * 6, [-1] * 6) if sid.startswith(SCOPE_PREFIX["tier"]) else ()
            if rule.rpm >= 0:
                new_r, retry = gcra(rule.rpm, 1, tats[0], 0, *hidden)
                if retry is not None:
                    rate_fail = fail(rate_fail, sid, "rpm", retry)
            if rule.tpm >= 0:
                new_t, retry = gcra(rule.tpm, tokens, tats[1], 3, *hidden)
                if retry is not None:
                    rate_fail = fail(rate_fail, sid, "tpm", retry)
            if rule.max_concurrent >= 0:
                live = {r: e for r, e in self._in_flight.get(sid, {}).items() if e > now}
                self._in_flight[sid] = live
                if len(live) + 1 > rule.max_concurrent:
                    rate_fail = fail(rate_fail, sid, "max_concurrent",
                                     -1 if rule.max_concurrent == 0 else _CONC_RETRY)
            day_counts = month_counts = [-1, -1]
            if rule.budget_flags & 1:
                day_counts = check_budget(sid, ("bd", sid, day), rule.tokens_per_day, rule.cost_per_day, next_day,
                                          "tokens_per_day", "cost_per_day")
            if rule.budget_flags & 2:
                month_counts = check_budget(sid, ("bm", sid, month), rule.tokens_per_month, rule.cost_per_month,
                                            next_month, "tokens_per_month", "cost_per_month")
            budget_counters.append(day_counts + month_counts)
            updates.append((rule, new_r, new_t))

        refused = quota_fail or rate_fail
        if refused:
            return decision_from_raw(with_counters(
                [refused[1], refused[0], refused[1], refused[2], now, day, month, *before], 0))

        ttl = int(plan.ttl_s * 1e6)
        expiry = now + ttl
        rec = {"t": str(tokens), "c": str(cost), "d": day, "m": month, "s": [], "b": [], "r": [], "q": []}
        for i, (rule, new_r, new_t) in enumerate(updates):
            tats = self._tat.setdefault(rule.scope, [0.0, 0.0])
            if rule.rpm >= 0:
                tats[0] = new_r
            if rule.tpm >= 0:
                tats[1] = new_t
            if rule.max_concurrent >= 0:
                self._in_flight.setdefault(rule.scope, {})[plan.rid] = expiry
            rec["s"].append(rule.scope)
            rec["b"].append(rule.budget_flags)
            rec["r"].append(rule.tpm)
            rec["q"].append(1 if rule.max_concurrent >= 0 else 0)
            for key in self._counter_keys(rec, i):
                c = self._counter(key)
                c["rt"] = c.get("rt", 0) + tokens
                c["rc"] = c.get("rc", 0) + cost
        self._records[plan.rid] = _Record("h", rec, expiry + int(plan.tombstone_ttl_s * 1e6))
        heapq.heappush(self._expiries, (expiry, plan.rid))
        return decision_from_raw(with_counters(["ok", "", "", -1, now, day, month, *after], 1))

    async def finish(self, reservation: Reservation, tokens: int, cost_nano: int,
                     tombstone_ttl_s: float) -> FinishStatus:
        now = self._clock()
        r = self._records.get(reservation.id)
        if r is not None and r.drop_at <= now:
            r = None
        if r is not None and r.state == "d":
            return FinishStatus.DUPLICATE
        rec = r.rec if r is not None else reservation.record()
        if r is not None and r.state == "h":
            self._unreserve(reservation.id, rec)
            diff = tokens - int(rec["t"])
            for i, sid in enumerate(rec["s"]):
                tpm = int(rec["r"][i])
                if tpm > 0 and diff != 0:
                    tats = self._tat.setdefault(sid, [0.0, 0.0])
                    tats[1] = max(max(tats[1], now) + diff * (MINUTE / tpm), now)
        for i, _ in enumerate(rec["s"]):
            for key in self._counter_keys(rec, i):
                c = self._counter(key)
                c["ut"] = c.get("ut", 0) + tokens
                c["uc"] = c.get("uc", 0) + cost_nano
        state = None if r is None else r.state
        self._records[reservation.id] = _Record("d", {}, now + int(tombstone_ttl_s * 1e6))  # state only
        return {"h": FinishStatus.APPLIED, "e": FinishStatus.LATE}.get(state, FinishStatus.ORPHAN)

    # --- inspection ---

    async def usage(self, scope: str) -> ScopeUsage:
        now = self._clock()
        self._reap(now)
        day, month, _, _ = periods(now)
        d = self._counters.get(("bd", scope, day), {})
        m = self._counters.get(("bm", scope, month), {})
        live = sum(1 for e in self._in_flight.get(scope, {}).values() if e > now)
        return ScopeUsage(scope, day, month, d.get("ut", 0), d.get("rt", 0), d.get("uc", 0), d.get("rc", 0),
                          m.get("ut", 0), m.get("rt", 0), m.get("uc", 0), m.get("rc", 0), live)

    async def held(self) -> int:
        self._reap(self._clock())
        return sum(1 for r in self._records.values() if r.state == "h")

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
