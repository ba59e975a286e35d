"""Circuit-breaker state in Redis, shared by every gateway replica."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from policies.breakers.lua_scripts import ALLOW, RECORD, STATE
from policies.breakers.types import (
    BUCKETS,
    BUSY_RETRY_S,
    STATE_NAMES,
    BreakerState,
    StoreAllow,
)
from policies.budgets.types import StoreError
from policies.limits_config import BreakerSettings

# RuntimeError: uvloop's transport raises it (not ConnectionError) when redis-py writes on a
# connection the server has just closed, e.g. while Redis restarts.
_FAILURES = (RedisError, OSError, asyncio.TimeoutError, RuntimeError)


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class RedisBreakerStore:
    def __init__(self, client: aioredis.Redis, key_prefix: str = "tiergate"):
        self._redis = client
        self._tag = "{" + key_prefix + "}"
        self._allow = client.register_script(ALLOW)
        self._record = client.register_script(RECORD)
        self._state = client.register_script(STATE)

    def _keys(self, name: str) -> list[str]:
        return [f"{self._tag}:br:{name}", f"{self._tag}:brp:{name}", f"{self._tag}:brw:{name}"]

    async def allow(self, name: str, settings: BreakerSettings, probe_id: str) -> StoreAllow:
        args = [probe_id, settings.half_open_probes, int(settings.probe_timeout_s * 1e6), int(BUSY_RETRY_S * 1e6)]
        try:
            code, gen, retry_us = await self._allow(keys=self._keys(name), args=args)
        except _FAILURES as exc:
            raise StoreError(f"redis breaker allow failed: {exc!r}") from exc
        return StoreAllow(_s(code), int(gen), int(retry_us) / 1e6)

    async def record(self, name: str, settings: BreakerSettings, generation: int, probe_id: str,
                     outcome: str, slow: bool) -> str:
        args = [generation, probe_id, outcome, int(slow), int(settings.window_s * 1e6), BUCKETS,
                settings.min_calls, repr(settings.failure_rate), repr(settings.slow_rate),
                int(settings.open_s * 1e6), settings.half_open_probes]
        try:
            (result,) = await self._record(keys=self._keys(name), args=args)
        except _FAILURES as exc:
            raise StoreError(f"redis breaker record failed: {exc!r}") from exc
        return _s(result)

    async def state(self, name: str, settings: BreakerSettings) -> BreakerState:
        try:
            raw = await self._state(keys=self._keys(name), args=[int(settings.window_s * 1e6), BUCKETS])
        except _FAILURES as exc:
            raise StoreError(f"redis breaker state failed: {exc!r}") from exc
        st, gen, left, calls, fails, slows, probes, hs = raw
        return BreakerState(name, STATE_NAMES[_s(st)], int(gen), int(left) / 1e6, int(calls), int(fails),
                            int(slows), int(probes), int(hs))

    async def close(self) -> None:
        return None
