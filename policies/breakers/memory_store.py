"""In-memory circuit-breaker state: one replica's own, and the fallback when Redis is down.

Follows lua_scripts.py step for step (same buckets, same generations), so both stores agree.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from policies.breakers.types import (
    BUCKETS,
    BUSY_RETRY_S,
    STATE_NAMES,
    BreakerState,
    StoreAllow,
)
from policies.limits_config import BreakerSettings


@dataclass
class _Breaker:
    st: str = "c"
    open_until: int = 0
    gen: int = 0
    hs: int = 0
    probes: dict[str, int] = field(default_factory=dict)    # probe id -> expiry (µs)
    window: dict[int, list[int]] = field(default_factory=dict)  # slot -> [epoch, calls, fails, slow]


class MemoryBreakerStore:
    def __init__(self, clock_us=None):
        self._clock = clock_us or (lambda: time.time_ns() // 1000)
        self._breakers: dict[str, _Breaker] = {}

    def _get(self, name: str) -> _Breaker:
        return self._breakers.setdefault(name, _Breaker())

    async def allow(self, name: str, settings: BreakerSettings, probe_id: str) -> StoreAllow:
        now = self._clock()
        b = self._get(name)
        if b.st == "c":
            return StoreAllow("ok", b.gen, 0.0)
        if b.st == "o":
            if now < b.open_until:
                return StoreAllow("open", b.gen, (b.open_until - now) / 1e6)
            b.st, b.gen, b.hs, b.probes = "h", b.gen + 1, 0, {}
        b.probes = {p: e for p, e in b.probes.items() if e > now}
        if len(b.probes) + b.hs < settings.half_open_probes:
            b.probes[probe_id] = now + int(settings.probe_timeout_s * 1e6)
            return StoreAllow("probe", b.gen, 0.0)
        return StoreAllow("busy", b.gen, BUSY_RETRY_S)

    async def record(self, name: str, settings: BreakerSettings, generation: int, probe_id: str,
                     outcome: str, slow: bool) -> str:
        now = self._clock()
        b = self._get(name)

        def open_() -> str:
            b.st, b.open_until, b.gen, b.hs = "o", now + int(settings.open_s * 1e6), b.gen + 1, 0
            b.probes, b.window = {}, {}
            return "opened"

        if generation != b.gen or b.st == "o":
            b.probes.pop(probe_id, None)
            return "stale"
        if b.st == "h":
            if not probe_id:
                return "stale"
            b.probes.pop(probe_id, None)
            if outcome == "n":
                return "ignored"
            if outcome == "f" or slow:
                return open_()
            b.hs += 1
            if b.hs >= settings.half_open_probes:
                b.st, b.gen, b.hs, b.probes, b.window = "c", b.gen + 1, 0, {}, {}
                return "closed"
            return "counted"
        if outcome == "n":
            return "ignored"
        width = settings.window_s * 1e6 / BUCKETS
        idx = math.floor(now / width)
        slot = idx % BUCKETS
        bucket = b.window.get(slot)
        if bucket is None or bucket[0] != idx:
            bucket = b.window[slot] = [idx, 0, 0, 0]
        bucket[1] += 1
        bucket[2] += outcome == "f"
        bucket[3] += slow
        calls, fails, slows = self._totals(b, idx)
        if calls >= settings.min_calls and (fails >= settings.failure_rate * calls
                                            or slows >= settings.slow_rate * calls):
            return open_()
        return "counted"

    @staticmethod
    def _totals(b: _Breaker, idx: int) -> tuple[int, int, int]:
        live = [v for v in b.window.values() if v[0] > idx - BUCKETS]
        return sum(v[1] for v in live), sum(v[2] for v in live), sum(v[3] for v in live)

    async def state(self, name: str, settings: BreakerSettings) -> BreakerState:
        now = self._clock()
        b = self._get(name)
        calls, fails, slows = self._totals(b, math.floor(now / (settings.window_s * 1e6 / BUCKETS)))
        left = (b.open_until - now) / 1e6 if b.st == "o" and b.open_until > now else 0.0
        probes = sum(1 for e in b.probes.values() if e > now)
        return BreakerState(name, STATE_NAMES[b.st], b.gen, left, calls, fails, slows, probes, b.hs)

    async def close(self) -> None:
        return None
