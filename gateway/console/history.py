"""What the console remembers beyond one request: breaker transitions, budget refusals and the
budget scopes seen lately. In memory for one gateway, in Redis when the limits' store is Redis,
so that every replica's console shows what all replicas saw.

Bounded everywhere: a capped list per breaker, one capped list of recent refusals, refusal
counts per (scope, limit kind) for at most 100 entries per kind of scope plus an aggregate
(refusal_counts.py), and a sorted set of scopes by last use, trimmed to MAX_SCOPES. Writes come in batches from the console's once-a-second flush, never from a
request's path.

Redis keys, under the limits' hash tag `{prefix}`:
  {prefix}:con:brh:<tier>   list  JSON breaker events, newest first
  {prefix}:con:rejc:<kind>  zset  refusal counts, {prefix}:con:rejo:<kind> the rest (refusal_counts.py)
  {prefix}:con:rejl         list  JSON refusals, newest first
  {prefix}:con:seen:<kind>  zset  scope id -> last seen (epoch s)
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Iterable

from gateway.console.refusal_counts import MemoryRefusalCounts, RedisRefusalCounts, RefusalCounts

BREAKER_EVENTS = 50        # kept per breaker
RECENT_REFUSALS = 50
MAX_SCOPES = 100           # per kind (tenant, api_key, session)
SCOPE_KINDS = ("tenant", "api_key", "session")


class MemoryHistory:
    def __init__(self) -> None:
        self._breakers: dict[str, deque[dict]] = {}
        self._refusals = MemoryRefusalCounts()
        self._recent: deque[dict] = deque(maxlen=RECENT_REFUSALS)
        self._seen: dict[str, OrderedDict[str, float]] = {k: OrderedDict() for k in SCOPE_KINDS}

    async def add_breaker_events(self, events: Iterable[dict]) -> None:
        for event in events:
            self._breakers.setdefault(event["tier"], deque(maxlen=BREAKER_EVENTS)).appendleft(event)

    async def breaker_events(self, tiers: Iterable[str]) -> dict[str, list[dict]]:
        return {t: list(self._breakers.get(t, ())) for t in tiers}

    async def add_refusals(self, refusals: Iterable[dict]) -> None:
        for refusal in refusals:
            self._refusals.add(refusal["scope"], refusal["kind"])
            self._recent.appendleft(refusal)

    async def refusals(self) -> tuple[RefusalCounts, list[dict]]:
        return self._refusals.read(), list(self._recent)

    async def add_seen(self, seen: dict[str, dict[str, float]]) -> None:
        for kind, scopes in seen.items():
            table = self._seen[kind]
            for scope, at in scopes.items():
                table[scope] = at
                table.move_to_end(scope)
            while len(table) > MAX_SCOPES:
                table.popitem(last=False)

    async def seen(self, limit: int) -> dict[str, list[str]]:
        """Per kind, the scopes used most recently first."""
        return {kind: list(reversed(table))[:limit] for kind, table in self._seen.items()}


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisHistory:
    def __init__(self, client, key_prefix: str):
        self._redis = client
        self._tag = "{" + key_prefix + "}"
        self._counts = RedisRefusalCounts(client, self._key)

    def _key(self, *parts: str) -> str:
        return ":".join((self._tag, "con", *parts))

    async def add_breaker_events(self, events: Iterable[dict]) -> None:
        events = list(events)
        if not events:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for event in events:
                key = self._key("brh", event["tier"])
                pipe.lpush(key, json.dumps(event))
                pipe.ltrim(key, 0, BREAKER_EVENTS - 1)
            await pipe.execute()

    async def breaker_events(self, tiers: Iterable[str]) -> dict[str, list[dict]]:
        tiers = list(tiers)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tier in tiers:
                pipe.lrange(self._key("brh", tier), 0, BREAKER_EVENTS - 1)
            lists = await pipe.execute()
        return {t: [json.loads(_text(item)) for item in items] for t, items in zip(tiers, lists)}

    async def add_refusals(self, refusals: Iterable[dict]) -> None:
        refusals = list(refusals)
        if not refusals:
            return
        await self._counts.add((r["scope"], r["kind"]) for r in refusals)
        async with self._redis.pipeline(transaction=False) as pipe:
            for refusal in refusals[-RECENT_REFUSALS:]:   # the newest of the batch
                pipe.lpush(self._key("rejl"), json.dumps(refusal))
            pipe.ltrim(self._key("rejl"), 0, RECENT_REFUSALS - 1)
            await pipe.execute()

    async def refusals(self) -> tuple[RefusalCounts, list[dict]]:
        recent = await self._redis.lrange(self._key("rejl"), 0, RECENT_REFUSALS - 1)
        return await self._counts.read(), [json.loads(_text(r)) for r in recent]

    async def add_seen(self, seen: dict[str, dict[str, float]]) -> None:
        if not any(seen.values()):
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for kind, scopes in seen.items():
                if scopes:
                    pipe.zadd(self._key("seen", kind), scopes)
                    pipe.zremrangebyrank(self._key("seen", kind), 0, -MAX_SCOPES - 1)
            await pipe.execute()

    async def seen(self, limit: int) -> dict[str, list[str]]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for kind in SCOPE_KINDS:
                pipe.zrevrange(self._key("seen", kind), 0, limit - 1)
            lists = await pipe.execute()
        return {kind: [_text(s) for s in items] for kind, items in zip(SCOPE_KINDS, lists)}
