"""Circuit breakers per tier or upstream: closed / open / half-open, shared through Redis.

    permit = await breakers.allow("big")            # Permit or Rejection
    ... call the tier ...
    await breakers.record(permit, Outcome.from_status(status), ttft_s=0.42)

Trips when, over the sliding window and with at least `min_calls` calls, the failure rate or
the slow-TTFT rate reaches its threshold. 4xx and cancelled calls are not counted. After
`open_s` it lets `half_open_probes` probe calls through; all of them succeeding closes it,
any failing (or slow) one opens it again. If Redis fails, a replica falls back to its own
in-memory breakers (never fail-closed: a lost Redis must not stop all traffic) and goes back
to the shared state `reconnect_interval_s` later.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from policies.breakers.memory_store import MemoryBreakerStore
from policies.breakers.types import AllOpen, BreakerState, Outcome, Permit, Rejection
from policies.budgets.types import StoreError
from policies.limits_config import BreakerTable, LimitsConfig

log = logging.getLogger("tiergate.breakers")


class Breakers:
    def __init__(self, table: BreakerTable, store=None, *, reconnect_interval_s: float = 0.5,
                 closed_cache_s: float = 0.0):
        """`store`: a RedisBreakerStore to share state across replicas; None: this process only.
        `closed_cache_s`: reuse a shared breaker's "closed" answer (a read-only one in the store)
        this long, so most calls skip a Redis round trip; its generation rides along, so a record
        made after another replica tripped the breaker is recognised as stale there."""
        self._table = table
        self._closed_cache_s = closed_cache_s
        self._closed_until: dict[str, tuple[float, int]] = {}   # name -> (monotonic deadline, generation)
        # Bumped whenever a cached answer is dropped: an ALLOW that was in flight meanwhile (and
        # may have read the state before the trip) must not cache its "closed" afterwards.
        self._closed_epoch: dict[str, int] = {}
        self._local = MemoryBreakerStore()
        self._store = store or self._local
        self._shared = store is not None
        self._reconnect_interval_s = reconnect_interval_s
        self._down_until = 0.0
        self._in_outage = False
        # name -> monotonic time until which this replica's last ALLOW was refused: what a caller
        # that cannot wait on the store (a cascade choosing its target) knows of an open breaker.
        self._refused_until: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: LimitsConfig, redis=None) -> Breakers:
        """`redis`: the client the Budgets use (Budgets.redis); None keeps breakers in memory."""
        if redis is None:
            return cls(config.breakers)
        from policies.breakers.redis_store import RedisBreakerStore
        return cls(config.breakers, RedisBreakerStore(redis, config.store.key_prefix),
                   reconnect_interval_s=config.store.reconnect_interval_s,
                   closed_cache_s=config.store.breaker_closed_cache_s)

    def settings(self, name: str):
        return self._table.for_name(name)

    def _use_shared(self) -> bool:
        return self._shared and time.monotonic() >= self._down_until

    def _mark_down(self, exc: Exception) -> None:
        if not self._in_outage:
            self._in_outage = True
            log.warning("breaker store unreachable (%s): using this replica's own breakers", exc)
        self._down_until = time.monotonic() + self._reconnect_interval_s

    def _mark_up(self) -> None:
        if self._in_outage:
            self._in_outage = False
            log.warning("breaker store reachable again: shared breaker state in use")

    async def allow(self, name: str) -> Permit | Rejection:
        local = not self._use_shared()
        if not local and self._closed_cache_s:
            cached = self._closed_until.get(name)
            if cached is not None and time.monotonic() < cached[0]:
                return Permit(name, cached[1])
        settings = self.settings(name)
        probe_id = uuid.uuid4().hex
        epoch = self._closed_epoch.get(name, 0)
        if not local:
            try:
                answer = await self._store.allow(name, settings, probe_id)
                self._mark_up()
            except StoreError as exc:
                self._mark_down(exc)
                local = True
        if local:
            answer = await self._local.allow(name, settings, probe_id)
        elif self._closed_cache_s:
            if answer.code != "ok":
                self._drop_cached(name)
            elif self._closed_epoch.get(name, 0) == epoch:
                self._closed_until[name] = (time.monotonic() + self._closed_cache_s, answer.generation)
        if answer.code == "ok":
            self._refused_until.pop(name, None)
            return Permit(name, answer.generation, local=local and self._shared)
        if answer.code == "probe":
            self._refused_until.pop(name, None)
            return Permit(name, answer.generation, probe_id=probe_id, local=local and self._shared)
        self._refused_until[name] = time.monotonic() + answer.retry_after_s
        return Rejection(name, "open" if answer.code == "open" else "half_open", answer.retry_after_s)

    def known_refusing(self, name: str) -> float | None:
        """Seconds until the tier's breaker may let a call through again, as this replica last
        heard when it asked (None: it was not refused, or that time has passed). No store
        round trip: for decisions that cannot wait on one."""
        until = self._refused_until.get(name)
        left = None if until is None else until - time.monotonic()
        return left if left is not None and left > 0 else None

    async def record(self, permit: Permit, outcome: Outcome, ttft_s: float | None = None) -> str:
        """Once per permit, as soon as the outcome is known. Returns what happened to the breaker:
        counted, ignored, stale, opened or closed."""
        settings = self.settings(permit.name)
        slow = (outcome is Outcome.SUCCESS and ttft_s is not None and settings.slow_ttft_s is not None
                and ttft_s > settings.slow_ttft_s)
        code = outcome.value if outcome.counted else "n"
        if not permit.local and self._shared:
            try:
                result = await self._store.record(permit.name, settings, permit.generation, permit.probe_id,
                                                  code, slow)
                if result in ("opened", "stale"):      # the cached "closed" is out of date
                    self._drop_cached(permit.name)
                return result
            except StoreError as exc:
                self._mark_down(exc)  # this call's outcome is lost to the shared window: one sample
                return "lost"
        return await self._local.record(permit.name, settings, permit.generation, permit.probe_id, code, slow)

    def _drop_cached(self, name: str) -> None:
        self._closed_until.pop(name, None)
        self._closed_epoch[name] = self._closed_epoch.get(name, 0) + 1

    async def first_available(self, names: Sequence[str]) -> Permit | AllOpen:
        """The first tier of a fallback chain whose breaker lets a call through."""
        rejections = []
        for name in names:
            answer = await self.allow(name)
            if answer.allowed:
                return answer
            rejections.append(answer)
        retry = min((r.retry_after for r in rejections), default=0.0)
        return AllOpen(tuple(names), retry)

    async def shared_state(self, name: str) -> BreakerState:
        """The state every replica sees (this process's own when not shared). Unlike state(), a
        store failure raises StoreError and leaves the request path as it is: for /metrics."""
        return await self._store.state(name, self.settings(name))

    async def state(self, name: str) -> BreakerState:
        settings = self.settings(name)
        if self._use_shared():
            try:
                return await self._store.state(name, settings)
            except StoreError as exc:
                self._mark_down(exc)
        return await self._local.state(name, settings)

    async def close(self) -> None:
        await self._store.close()
