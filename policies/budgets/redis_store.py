"""The Redis budget store: one EVALSHA per decision (redis-py reloads a script on NOSCRIPT)."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from policies.budgets.lua_scripts import FINISH, RESERVE
from policies.budgets.rules import periods
from policies.budgets.store import ScopeUsage, decision_from_raw
from policies.budgets.types import (
    Decision,
    FinishStatus,
    Reservation,
    ReservePlan,
    StoreError,
)
from policies.limits_config import StoreConfig

# RuntimeError: uvloop's transport raises it (not ConnectionError) when redis-py writes on a
# connection the server has just closed, e.g. while Redis restarts.
_FAILURES = (RedisError, OSError, asyncio.TimeoutError, RuntimeError)


def make_redis_client(config: StoreConfig) -> aioredis.Redis:
    """A client that fails fast: no retries inside redis-py (a retried reserve could apply twice;
    the caller decides between fail-open and fail-closed instead), short timeouts, a bounded pool."""
    pool = aioredis.BlockingConnectionPool.from_url(
        config.url, max_connections=config.max_connections, timeout=max(config.timeout_s * 5, 1.0),
        socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s,
        retry=Retry(NoBackoff(), 0))
    return aioredis.Redis(connection_pool=pool)


def hash_tag(key_prefix: str) -> str:
    return "{" + key_prefix + "}"


class RedisBudgetStore:
    def __init__(self, client: aioredis.Redis, key_prefix: str = "tiergate", *, owns_client: bool = False):
        self._redis = client
        self._tag = hash_tag(key_prefix)
        self._resx = self._tag + ":resx"
        self._reserve = client.register_script(RESERVE)
        self._finish = client.register_script(FINISH)
        self._owns_client = owns_client

    @property
    def client(self) -> aioredis.Redis:
        return self._redis

    async def reserve(self, plan: ReservePlan) -> Decision:
        args: list = [self._tag, plan.rid, int(plan.ttl_s * 1e6), plan.tokens, plan.cost_nano,
                      int(plan.tombstone_ttl_s * 1000), len(plan.rules)]
        for rule in plan.rules:
            args.append(rule.scope)
            args.extend(rule.limits())
        try:
            raw = await self._reserve(keys=[self._resx], args=args)
        except _FAILURES as exc:
            raise StoreError(f"redis reserve failed: {exc!r}") from exc
        return decision_from_raw(raw)

    async def finish(self, reservation: Reservation, tokens: int, cost_nano: int,
                     tombstone_ttl_s: float) -> FinishStatus:
        args = [self._tag, reservation.id, tokens, cost_nano, int(tombstone_ttl_s * 1000),
                json.dumps(reservation.record())]
        try:
            status, _now = await self._finish(keys=[self._resx], args=args)
        except _FAILURES as exc:
            raise StoreError(f"redis finish failed: {exc!r}") from exc
        return FinishStatus(status.decode() if isinstance(status, bytes) else status)

    async def _now_us(self) -> int:
        sec, usec = await self._redis.time()
        return int(sec) * 1_000_000 + int(usec)

    async def usage(self, scope: str) -> ScopeUsage:
        try:
            now = await self._now_us()
            day, month, _, _ = periods(now)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hmget(f"{self._tag}:bd:{scope}:{day}", "ut", "rt", "uc", "rc")
                pipe.hmget(f"{self._tag}:bm:{scope}:{month}", "ut", "rt", "uc", "rc")
                pipe.zcount(f"{self._tag}:cc:{scope}", f"({now}", "+inf")
                d, m, live = await pipe.execute()
        except _FAILURES as exc:
            raise StoreError(f"redis usage failed: {exc!r}") from exc
        d = [int(v or 0) for v in d]
        m = [int(v or 0) for v in m]
        return ScopeUsage(scope, day, month, *d, *m, int(live))

    async def held(self) -> int:
        try:
            now = await self._now_us()
            return int(await self._redis.zcount(self._resx, f"({now}", "+inf"))
        except _FAILURES as exc:
            raise StoreError(f"redis held failed: {exc!r}") from exc

    async def ping(self) -> None:
        try:
            await self._redis.ping()
        except _FAILURES as exc:
            raise StoreError(f"redis ping failed: {exc!r}") from exc

    async def close(self) -> None:
        if self._owns_client:
            await self._redis.aclose()
