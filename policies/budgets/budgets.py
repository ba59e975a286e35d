"""Budgets: the gateway's one entry point for rate limits and budgets of every scope.

    admission = await budgets.reserve(scopes, input_tokens, max_output_tokens)
    ... run the request ...
    await budgets.reconcile(admission.reservation, input_tokens, output_tokens)   # or release()

When the shared store (Redis) fails, the policy decides: fail-closed raises
BudgetStoreUnavailable (503), fail-open admits under a local in-memory limiter that starts from
the usage last seen in the shared store (fail_open.py). Finishes that
cannot reach Redis are queued and replayed once it answers again; each carries its reservation,
so the store applies it exactly once even if it lost the reservation (see lua_scripts.FINISH).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from collections import deque

from policies.budgets.fail_open import FailOpenLimiter
from policies.budgets.memory_store import MemoryBudgetStore
from policies.budgets.messages import reason_for, refusal_message
from policies.budgets.rules import cost_nano, scope_rules
from policies.budgets.store import BudgetStore, ScopeUsage
from policies.budgets.types import (
    Admission,
    BudgetStoreUnavailable,
    FinishStatus,
    RateLimitInfo,
    Reservation,
    ReservePlan,
    Scopes,
    StoreError,
)
from policies.limits_config import LimitsConfig

log = logging.getLogger("tiergate.budgets")

_MAX_PENDING_RELEASES = 10_000


class Budgets:
    def __init__(self, config: LimitsConfig, store: BudgetStore, *, shared: bool,
                 fail_open: FailOpenLimiter | None = None):
        """`shared`: the store is remote and may fail (Redis); the memory store never does.
        `fail_open`: the local limiter, shared by every Budgets on the same store (a reload keeps
        what it has counted and seen)."""
        self._config = config
        # Rules depend only on the (immutable) config and the scopes: build them once per scope set.
        self._rules_for = functools.lru_cache(maxsize=4096)(functools.partial(scope_rules, config))
        self._store = store
        self._shared = shared
        self._local = fail_open if fail_open is not None else FailOpenLimiter()  # admits while the store is down
        self._down_until = 0.0             # monotonic: skip the shared store until then
        self._in_outage = False            # logged once per outage, not once per retry
        self._pending: deque[tuple[Reservation, int, int]] = deque()  # usage to replay
        self._releases: deque[Reservation] = deque()  # reserves that may have run before a failure
        self._replayer: asyncio.Task | None = None
        self.stats = {"degraded_admissions": 0, "store_failures": 0, "replayed": 0, "dropped": 0}
        # The last outages of the shared store (the operator console shows them): when each began
        # and ended, the error, the policy, and how many requests were admitted locally meanwhile.
        self.outages: deque[dict] = deque(maxlen=20)

    @classmethod
    def from_config(cls, config: LimitsConfig) -> Budgets:
        if config.store.backend == "memory":
            return cls(config, MemoryBudgetStore(), shared=False)
        from policies.budgets.redis_store import RedisBudgetStore, make_redis_client
        store = RedisBudgetStore(make_redis_client(config.store), config.store.key_prefix, owns_client=True)
        return cls(config, store, shared=True)

    @property
    def store(self) -> BudgetStore:
        return self._store

    @property
    def redis(self):
        """The Redis client (to share with Breakers), or None for the memory store."""
        return getattr(self._store, "client", None)

    @property
    def pending_replays(self) -> int:
        return len(self._pending) + len(self._releases)

    # --- the request path ---

    async def reserve(self, scopes: Scopes, input_tokens: int, max_output_tokens: int) -> Admission:
        """Check and reserve every scope at once. Raises BudgetStoreUnavailable (fail-closed, store down)
        and InvalidScope (a malformed scope id: the gateway answers 400)."""
        if input_tokens < 0 or max_output_tokens < 0:
            raise ValueError("token counts must not be negative")
        rules = self._rules_for(scopes)
        tokens = input_tokens + max_output_tokens
        cost = cost_nano(self._config.prices.get(scopes.tier or ""), input_tokens, max_output_tokens)
        rid = uuid.uuid4().hex
        if not rules:  # nothing limits this request: no store round trip
            noop = Reservation(rid, scopes.tier, tokens, cost, "", "", (), (), float("inf"))
            return Admission(True, None, "", None, RateLimitInfo(), noop, store_time=time.time())
        store_cfg = self._config.store
        plan = ReservePlan(rid, rules, tokens, cost, store_cfg.reservation_ttl_s, store_cfg.tombstone_ttl_s)
        if self._shared and time.monotonic() < self._down_until:
            return await self._degraded(plan, scopes.tier)
        try:
            decision = await self._store.reserve(plan)
        except StoreError as exc:
            self._mark_down(exc)
            # The script may have run before the connection broke: release that id once Redis is back.
            self._queue_release(Reservation(rid, scopes.tier, tokens, cost, "", "",
                                            tuple(r.scope for r in rules), tuple(r.budget_flags for r in rules), 0))
            # A fresh id for the local admission: the queued release above owns `rid`, and replaying it
            # first must not turn this request's usage replay into a duplicate.
            return await self._degraded(dataclasses.replace(plan, rid=uuid.uuid4().hex), scopes.tier)
        self._mark_up()
        if self._shared and decision.code != "duplicate":
            self._local.observe(rules, decision)      # the usage a later outage starts from
        return self._admission(plan, decision, scopes.tier, local=False)

    async def reconcile(self, reservation: Reservation, input_tokens: int, output_tokens: int) -> FinishStatus:
        """Commit the actual usage and free the reservation; a second call changes nothing."""
        if input_tokens < 0 or output_tokens < 0:
            raise ValueError("token counts must not be negative")
        if not reservation.scopes:
            return FinishStatus.NOOP
        cost = cost_nano(self._config.prices.get(reservation.tier or ""), input_tokens, output_tokens)
        return await self._finish(reservation, input_tokens + output_tokens, cost)

    async def release(self, reservation: Reservation) -> FinishStatus:
        """Nothing was consumed (an error before any token, a refusal downstream): free it all.
        A client that disconnects mid-stream consumed tokens: reconcile with the counts so far."""
        return await self.reconcile(reservation, 0, 0)

    # --- inspection (metrics, tests) ---

    async def usage(self, scope_id: str) -> ScopeUsage:
        return await self._store.usage(scope_id)

    async def held(self) -> int:
        return await self._store.held()

    # --- store failure handling ---

    def _admission(self, plan: ReservePlan, decision, tier: str | None, *, local: bool) -> Admission:
        if decision.code == "duplicate":  # a uuid4 collision or a replayed id: never admit twice
            raise RuntimeError(f"reservation id {plan.rid} already known to the store")
        if decision.code != "ok":
            return Admission(False, reason_for(decision.code),
                             refusal_message(decision, plan.rules, plan.tokens, plan.cost_nano),
                             decision.retry_after_s, decision.info, None, scope=decision.scope,
                             limit_kind=decision.code, store_time=decision.now, degraded=local)
        reservation = Reservation(plan.rid, tier, plan.tokens, plan.cost_nano, decision.day, decision.month,
                                  tuple(r.scope for r in plan.rules), tuple(r.budget_flags for r in plan.rules),
                                  decision.now + plan.ttl_s, local=local)
        return Admission(True, None, "", None, decision.info, reservation, store_time=decision.now, degraded=local)

    async def _degraded(self, plan: ReservePlan, tier: str | None) -> Admission:
        store_cfg = self._config.store
        if store_cfg.on_store_failure == "closed":
            raise BudgetStoreUnavailable("The budget store is unreachable; try again shortly.",
                                         retry_after=store_cfg.reconnect_interval_s)
        self.stats["degraded_admissions"] += 1
        return self._admission(plan, await self._local.reserve(plan), tier, local=True)

    async def _finish(self, reservation: Reservation, tokens: int, cost: int) -> FinishStatus:
        tomb = self._config.store.tombstone_ttl_s
        if reservation.local:
            status = await self._local.finish(reservation, tokens, cost, tomb)
            if not self._shared or status is FinishStatus.DUPLICATE:
                return status
            # Usage admitted during the outage still counts against the shared budgets.
            self._queue_usage(reservation, tokens, cost)
            return FinishStatus.QUEUED
        if not self._shared:
            return await self._store.finish(reservation, tokens, cost, tomb)
        if time.monotonic() < self._down_until:
            self._queue_usage(reservation, tokens, cost)
            return FinishStatus.QUEUED
        try:
            status = await self._store.finish(reservation, tokens, cost, tomb)
        except StoreError as exc:
            self._mark_down(exc)
            self._queue_usage(reservation, tokens, cost)
            return FinishStatus.QUEUED
        if status is FinishStatus.APPLIED:
            self._local.settled(reservation, tokens, cost)     # what a later outage starts from
        return status

    def _mark_down(self, exc: Exception) -> None:
        self.stats["store_failures"] += 1
        if not self._in_outage:
            self._in_outage = True
            log.warning("budget store unreachable (%s); policy: fail-%s", exc, self._config.store.on_store_failure)
            self.outages.append({"started": time.time(), "ended": None, "error": str(exc)[:300],
                                 "policy": self._config.store.on_store_failure,
                                 "degraded_at_start": self.stats["degraded_admissions"], "degraded_admissions": 0})
        self._down_until = time.monotonic() + self._config.store.reconnect_interval_s

    def _mark_up(self) -> None:
        self._down_until = 0.0
        if self._in_outage:
            self._in_outage = False
            if self.outages:
                self._outage_figures(self.outages[-1])["ended"] = time.time()
            log.warning("budget store reachable again; %d reconciliations to replay", self.pending_replays)

    def _outage_figures(self, outage: dict) -> dict:
        if outage["ended"] is None:
            outage["degraded_admissions"] = self.stats["degraded_admissions"] - outage["degraded_at_start"]
        return outage

    def outage_log(self) -> list[dict]:
        """The last outages, oldest first, with the local admissions of the one still going on."""
        return [dict(self._outage_figures(o)) for o in self.outages]

    def _queue_usage(self, reservation: Reservation, tokens: int, cost: int) -> None:
        if len(self._pending) >= self._config.store.replay_queue_max:
            self._pending.popleft()
            self.stats["dropped"] += 1
            log.error("budget replay queue full: the oldest reconciliation was dropped")
        self._pending.append((reservation, tokens, cost))
        self._start_replayer()

    def _queue_release(self, reservation: Reservation) -> None:
        # Bounded apart from usage: if these are lost, the reservation still expires on its own.
        if len(self._releases) >= _MAX_PENDING_RELEASES:
            self._releases.popleft()
        self._releases.append(reservation)
        self._start_replayer()

    def _start_replayer(self) -> None:
        if self._replayer is None or self._replayer.done():
            self._replayer = asyncio.get_running_loop().create_task(self._replay())

    async def _replay(self) -> None:
        """Wait for the store to answer, then apply queued finishes oldest first."""
        tomb = self._config.store.tombstone_ttl_s
        interval = self._config.store.reconnect_interval_s
        while self._pending or self._releases:
            try:
                await self._store.ping()
                self._mark_up()
                while self._pending:
                    reservation, tokens, cost = self._pending[0]
                    await self._store.finish(reservation, tokens, cost, tomb)
                    self._pending.popleft()
                    self.stats["replayed"] += 1
                    if reservation.local:       # now in the shared counters the limiter sees
                        self._local.replayed(reservation, tokens, cost)
                while self._releases:
                    await self._store.finish(self._releases[0], 0, 0, tomb)
                    self._releases.popleft()
            except StoreError as exc:
                self._mark_down(exc)
                await asyncio.sleep(interval)

    async def flush(self, timeout: float) -> bool:
        """Wait until queued finishes are applied (shutdown, tests). True when none is left."""
        deadline = time.monotonic() + timeout
        while self.pending_replays and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        return not self.pending_replays

    async def close(self, flush_timeout: float = 2.0) -> None:
        if self.pending_replays:
            await self.flush(flush_timeout)
            if self.pending_replays:
                log.error("closing with %d budget reconciliations not applied", self.pending_replays)
        if self._replayer is not None:
            self._replayer.cancel()
            try:
                await self._replayer
            except asyncio.CancelledError:
                pass
        await self._store.close()
