"""What the console learns from the traffic: the pipeline hands every finished request to
`request_ended` (in-memory work only: a ring append, a few counter additions), and the app's
once-a-second `tick` closes the sparkline points and writes what must be shared (breaker
transitions, budget refusals, scopes seen) to the console history in one batch, in Redis when
the limits live there.

Breaker transitions are read off the request's breaker steps (RequestContext.breaker_events):
"probe" marks a call a half-open breaker let through, "opened" / "closed" a transition the
request's outcome caused; why it opened comes from the failure the request met on that tier.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from gateway.console.history import SCOPE_KINDS, MemoryHistory, RedisHistory
from gateway.skips import SkipReason
from gateway.telemetry.decision_log import DecisionLog
from gateway.telemetry.tier_series import TierSeries
from gateway.telemetry.tier_stats import tier_stats
from gateway.token_bounds import sequences

if TYPE_CHECKING:
    from gateway.context import RequestContext
    from gateway.request_limits import RequestLimits
    from gateway.runtime import Runtime, RuntimeHolder

log = logging.getLogger(__name__)

TICK_S = 1.0
SEEN_REFRESH_S = 30.0       # a scope's "last seen" is written to the history at most this often
_MAX_PENDING = 1000         # per kind of pending write: a store that stays down does not grow memory
_MAX_SEEN_MEMO = 10_000
_FAILED_CALLS = frozenset({SkipReason.TIER_FAILURE, SkipReason.EMPTY_STREAM})


def replica_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class ConsoleRecorder:
    def __init__(self, holder: RuntimeHolder, replica: str | None = None):
        self.holder = holder
        self.replica = replica or replica_name()
        self.decisions = DecisionLog()
        self.series = TierSeries()
        self.memory = MemoryHistory()
        self._redis: tuple[object, RedisHistory] | None = None
        self._breaker_events: list[dict] = []
        self._refusals: list[dict] = []
        self._seen: dict[str, dict[str, float]] = {k: {} for k in SCOPE_KINDS}
        self._seen_written: dict[tuple[str, str], float] = {}
        self.flush_error: str | None = None
        self.dropped = 0

    # ---- per request (event loop, no I/O) ----------------------------------------------
    def request_ended(self, rt: Runtime, ctx: RequestContext, limits: RequestLimits | None) -> None:
        if self.decisions.record(ctx) is None:
            return
        decoded = sequences(limits.call.body) if limits is not None else 1   # side by side
        if ctx.tier is not None:
            ttft = None if ctx.first_token_at is None else ctx.first_token_at - ctx.started
            tpot = None
            per_sequence = ctx.usage.completion_tokens / max(decoded, 1)
            if ttft is not None and ctx.status < 400 and not ctx.client_disconnected and per_sequence > 1:
                tpot = max((ctx.finished_at or time.perf_counter()) - ctx.first_token_at, 0.0) / (per_sequence - 1)
            self.series.request_done(ctx.tier, output_tokens=ctx.usage.completion_tokens,
                                     failed=ctx.status >= 400 or bool(ctx.error), ttft_s=ttft, tpot_s=tpot)
        for skip in ctx.fallbacks:           # a call that failed there: the tier's error, not the answer's
            if skip.reason in _FAILED_CALLS:
                self.series.request_done(skip.tier, output_tokens=0, failed=True, ttft_s=None, tpot_s=None)
        if ctx.breaker_events:
            self._note_breakers(rt, ctx)
        admission = ctx.admission
        if admission is not None and not admission.allowed and len(self._refusals) < _MAX_PENDING:
            self._refusals.append({"at": ctx.received_at, "scope": admission.scope or "?",
                                   "kind": admission.limit_kind or admission.reason or "unknown",
                                   "degraded": admission.degraded, "replica": self.replica})
        if limits is not None and limits.limits.active:
            now = time.time()
            session = None if limits.session is None else f"{ctx.tenant or ''}/{limits.session}"
            for kind, scope in (("tenant", ctx.tenant), ("api_key", limits.api_key), ("session", session)):
                if scope is not None:
                    self._saw(kind, scope, now)

    def _saw(self, kind: str, scope: str, now: float) -> None:
        key = (kind, scope)
        written = self._seen_written.get(key)
        if written is not None and now - written < SEEN_REFRESH_S:
            return
        if len(self._seen_written) >= _MAX_SEEN_MEMO:
            self._seen_written.clear()
        self._seen_written[key] = now
        if len(self._seen[kind]) < _MAX_PENDING:
            self._seen[kind][scope] = now

    def _note_breakers(self, rt: Runtime, ctx: RequestContext) -> None:
        probing: set[str] = set()
        for tier, event in ctx.breaker_events:
            if event == "probe":
                probing.add(tier)
                continue
            if event in ("success", "failure", "client_error", "cancelled") and tier in probing:
                self._breaker_event(ctx, tier, "probe", f"half-open probe: {event}")
            elif event == "opened":
                self._breaker_event(ctx, tier, "opened", self._why_opened(rt, ctx, tier, tier in probing))
            elif event == "closed":
                self._breaker_event(ctx, tier, "closed", "every half-open probe succeeded")

    @staticmethod
    def _why_opened(rt: Runtime, ctx: RequestContext, tier: str, probe: bool) -> str:
        failure = next((s for s in reversed(ctx.fallbacks) if s.tier == tier), None)
        met = f"{failure.reason.value}: {failure.detail}" if failure is not None else "slow time to first token"
        if probe:
            return f"half-open probe failed ({met})"
        if rt.limits is None:
            return met
        s = rt.limits.breakers.settings(tier)
        return (f"failure rate >= {s.failure_rate:g} (or slow rate >= {s.slow_rate:g}) over {s.window_s:g}s with "
                f">= {s.min_calls} calls; last: {met}")

    def _breaker_event(self, ctx: RequestContext, tier: str, event: str, why: str) -> None:
        if len(self._breaker_events) < _MAX_PENDING:
            self._breaker_events.append({"at": time.time(), "tier": tier, "event": event, "why": why[:300],
                                         "request_id": ctx.request_id, "replica": self.replica})

    # ---- once a second ----------------------------------------------------------------
    def history(self, rt: Runtime | None = None):
        """Where the shared part lives: Redis when the current limits use it, else memory."""
        limits = (rt or self.holder.current).limits
        client = getattr(limits, "redis", None) if limits is not None and limits.shared else None
        if client is None:
            return self.memory
        if self._redis is None or self._redis[0] is not client:
            self._redis = (client, RedisHistory(client, limits.config.store.key_prefix))
        return self._redis[1]

    def sample(self, rt: Runtime) -> None:
        gauges = {}
        for name, tier in rt.tiers.items():
            stats = tier_stats(tier)
            gauges[name] = {"in_flight": stats.in_flight, "queue": getattr(stats, "queue_depth", None),
                            "running": getattr(stats, "running", None),
                            "kv_usage": _rounded(getattr(stats, "kv_usage", None))}
        self.series.sample(gauges)

    async def flush(self, rt: Runtime) -> None:
        events, refusals, seen = self._breaker_events, self._refusals, self._seen
        if not (events or refusals or any(seen.values())):
            return
        self._breaker_events, self._refusals, self._seen = [], [], {k: {} for k in SCOPE_KINDS}
        history = self.history(rt)
        try:
            await history.add_breaker_events(events)
            await history.add_refusals(refusals)
            await history.add_seen(seen)
            self.flush_error = None
        except Exception as exc:  # noqa: BLE001 - the console must never take the gateway down
            self.dropped += len(events) + len(refusals)
            if self.flush_error is None:
                log.warning("console: writing its history to the store failed (%r); dropped", exc)
            self.flush_error = repr(exc)

    async def tick(self) -> None:
        rt = self.holder.current
        self.sample(rt)
        await self.flush(rt)

    async def run(self) -> None:
        """The app's background task: a tick a second until cancelled."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                async with asyncio.timeout(5.0):
                    await self.tick()
            except Exception:  # noqa: BLE001 - logged; the next tick tries again
                log.warning("console: tick failed", exc_info=True)


def _rounded(value):
    return round(value, 4) if isinstance(value, float) else value
