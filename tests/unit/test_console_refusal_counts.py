"""The console's refusal counts stay bounded whatever session ids clients choose, keep the most
refused scopes and exact totals, and never confuse one scope id with another that shares its
first characters ("v" and "v|x0"), in memory and in a real Redis."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from gateway.console.history import MemoryHistory, RedisHistory
from gateway.console.refusal_counts import MAX_COUNTED, REFUSALS_TTL_S
from tests.redis_server import running_redis

FLOOD = 3 * MAX_COUNTED


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
async def history(request):
    if request.param == "memory":
        yield MemoryHistory()
        return
    client = aioredis.from_url(request.getfixturevalue("redis_url"))
    history = RedisHistory(client, "t" + uuid.uuid4().hex[:8])
    history.client = client
    yield history
    await client.aclose()


def _refusal(scope: str, kind: str = "tokens_per_day") -> dict:
    return {"at": 0.0, "scope": scope, "kind": kind, "degraded": False, "replica": "test:1"}


async def test_a_flood_of_session_ids_keeps_the_table_bounded_and_the_totals_exact(history):
    await history.add_refusals([_refusal("t:acme")] * 5 + [_refusal("s:evil/heavy")] * 3)
    for batch in range(3):       # the recorder flushes in batches
        await history.add_refusals(_refusal(f"s:evil/sess-{batch}-{i}-" + "x" * 150) for i in range(FLOOD // 3))
    counts, recent = await history.refusals()
    sessions = [c for c in counts.counted if c.scope.startswith("s:")]
    assert len(sessions) == MAX_COUNTED
    assert sum(c.count for c in counts.counted) + counts.others == 8 + FLOOD
    assert counts.of_scope("t:acme") == 5 and counts.of_scope("s:evil/heavy") == 3    # the most refused stay
    assert counts.counted[0].scope == "t:acme" and len(recent) == 50
    shown = counts.as_json(20)        # what one poll carries
    assert len(shown["counted"]) == 21 and shown["others"] == 8 + FLOOD - 5 - 3 - 19
    if isinstance(history, RedisHistory):   # counts of a kind of scope nobody is refused in expire
        ttl = await history.client.ttl(history._key("rejc", "session"))
        assert 0 < ttl <= REFUSALS_TTL_S


async def test_scope_ids_are_never_split_on_a_separator(history):
    await history.add_refusals([_refusal("s:evil/v"), _refusal("s:evil/v", "rpm")]
                               + [_refusal(f"s:evil/v|x{i}") for i in range(5)])
    counts, _ = await history.refusals()
    assert counts.of_scope("s:evil/v") == 2 and counts.of_scope("s:evil/v|x0") == 1
    assert {(c.scope, c.kind) for c in counts.counted if c.scope == "s:evil/v"} == {
        ("s:evil/v", "tokens_per_day"), ("s:evil/v", "rpm")}
