"""Breakers shared by two replicas through a real redis-server: an upstream fails, traffic
moves to the fallback, half-open probes close the breaker when it recovers, and both
replicas see the same state. The upstream is an in-process stand-in (a status code per
call): what is under test is the breaker, not HTTP; the gateway's wiring tests that part.

Redis' clock cannot be stopped: waits here are lower bounds (sleeping past open_s always ends
the open state), and "still open" is asserted only while the test has measured that open_s
has not passed since the trip (on a machine loaded enough for it to pass, the breaker may
rightly be half-open, and the test checks only what holds either way)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import pytest

from policies.breakers import Breakers, Outcome
from policies.breakers.redis_store import RedisBreakerStore
from policies.budgets.redis_store import make_redis_client
from policies.limits_config import BreakerSettings, BreakerTable, StoreConfig
from tests.redis_server import launch

CHAIN = ["primary", "fallback"]
# window_s: longer than any test, so no call slides out of the window while a test runs.
SETTINGS = BreakerSettings(window_s=600, min_calls=10, failure_rate=0.5, open_s=0.5, half_open_probes=2)


@pytest.fixture
def server():
    s = launch()
    yield s
    s.stop()


class Upstreams:
    def __init__(self):
        self.healthy = {"primary": True, "fallback": True}
        self.calls = Counter()

    async def call(self, name: str) -> int:
        self.calls[name] += 1
        await asyncio.sleep(0.001)
        return 200 if self.healthy[name] else 503


async def serve(breakers: Breakers, upstreams: Upstreams) -> str | None:
    """What the gateway does per request: first tier the breakers allow, call it, record."""
    permit = await breakers.first_available(CHAIN)
    if not permit.allowed:
        return None
    status = await upstreams.call(permit.name)
    await breakers.record(permit, Outcome.from_status(status), ttft_s=0.01)
    return permit.name


def replica(url: str, prefix: str, reconnect_s: float = 0.5, closed_cache_s: float = 0.0, store_cls=RedisBreakerStore):
    client = make_redis_client(StoreConfig(backend="redis", url=url, timeout_s=0.5))
    breakers = Breakers(BreakerTable(default=SETTINGS), store_cls(client, prefix),
                        reconnect_interval_s=reconnect_s, closed_cache_s=closed_cache_s)
    return breakers, client


class CountingStore(RedisBreakerStore):
    """The real Redis store, counting its ALLOW calls."""

    allows = 0

    async def allow(self, *args):
        CountingStore.allows += 1
        return await super().allow(*args)


async def test_cached_closed_answer_skips_redis_and_a_trip_elsewhere_shows_up(server):
    prefix = "c" + uuid.uuid4().hex[:8]
    (one, c1) = replica(server.url, prefix)
    (two, c2) = replica(server.url, prefix, closed_cache_s=30, store_cls=CountingStore)
    CountingStore.allows = 0
    try:
        permits = [await two.allow("primary") for _ in range(50)]
        assert all(p.allowed and not p.is_probe for p in permits) and CountingStore.allows == 1
        for p in permits[:5]:
            assert await two.record(p, Outcome.SUCCESS, 0.01) == "counted"
        for _ in range(5):                      # replica one trips the shared breaker: 5 of 10 failed
            await one.record(await one.allow("primary"), Outcome.FAILURE)
        assert (await one.state("primary")).state == "open"
        # Replica two still holds its cached "closed" ...
        stale = await two.allow("primary")
        assert stale.allowed and CountingStore.allows == 1
        # ... its outcome is recognised as from before the trip and drops the cache at once.
        assert await two.record(stale, Outcome.SUCCESS, 0.01) == "stale"
        refused = await two.allow("primary")
        assert not refused.allowed and refused.state == "open" and CountingStore.allows == 2
    finally:
        await c1.aclose()
        await c2.aclose()


async def test_failover_and_recovery_across_two_replicas(server):
    prefix = "r" + uuid.uuid4().hex[:8]
    (one, c1), (two, c2) = replica(server.url, prefix), replica(server.url, prefix)
    up = Upstreams()
    try:
        assert [await serve(r, up) for r in (one, two) * 2] == ["primary"] * 4

        up.healthy["primary"] = False
        served = [await serve(r, up) for r in (one, two) * 2]
        tripped_after = time.time()                            # the tripping call starts after this
        served += [await serve(r, up) for r in (one, two)]     # 3 failures from each replica
        assert served == ["primary"] * 6
        # 6 failed of 10 calls: tripped by both replicas' failures together, seen by both.
        states = [(await one.state("primary")).state, (await two.state("primary")).state]
        if time.time() - tripped_after < SETTINGS.open_s:
            assert states == ["open", "open"]
        up.calls.clear()
        served = await asyncio.gather(*[serve(r, up) for r in (one, two) * 20])
        if time.time() - tripped_after < SETTINGS.open_s:
            assert set(served) == {"fallback"} and up.calls["primary"] == 0   # neither replica calls it

        up.healthy["primary"] = True
        await asyncio.sleep(0.55)                             # open_s elapsed: half-open
        up.calls.clear()
        p1, p2, p3 = await one.allow("primary"), await two.allow("primary"), await one.allow("primary")
        assert p1.is_probe and p2.is_probe and not p3.allowed  # two probes across both replicas
        assert await one.record(p1, Outcome.SUCCESS, 0.01) == "counted"
        assert await two.record(p2, Outcome.SUCCESS, 0.01) == "closed"
        assert (await one.state("primary")).state == "closed"
        served = await asyncio.gather(*[serve(r, up) for r in (one, two) * 10])
        assert set(served) == {"primary"}
    finally:
        await c1.aclose()
        await c2.aclose()


async def test_all_open_gives_the_shortest_retry_after(server):
    (b, client) = replica(server.url, "a" + uuid.uuid4().hex[:8])
    up = Upstreams()
    up.healthy = {"primary": False, "fallback": False}
    try:
        for _ in range(9):
            await serve(b, up)
        tripped_after = time.time()
        await serve(b, up)              # primary trips after 10 failures
        for _ in range(10):
            await serve(b, up)          # then the fallback
        answer = await b.first_available(CHAIN)
        if time.time() - tripped_after < SETTINGS.open_s:
            # The shortest wait of the chain: the primary's, which opened first.
            assert not answer.allowed
            assert SETTINGS.open_s - (time.time() - tripped_after) - 1e-3 <= answer.retry_after <= SETTINGS.open_s
    finally:
        await client.aclose()


async def test_breakers_keep_working_while_redis_is_down(server):
    prefix = "d" + uuid.uuid4().hex[:8]
    (b, client) = replica(server.url, prefix, reconnect_s=0.1)
    up = Upstreams()
    try:
        await serve(b, up)
        await asyncio.to_thread(server.kill)
        up.healthy["primary"] = False
        # Redis is gone: this replica's own breaker takes over and still protects the primary.
        served = [await serve(b, up) for _ in range(9)]
        tripped_after = time.time()
        served += [await serve(b, up) for _ in range(6)]
        assert served[:10] == ["primary"] * 10
        if time.time() - tripped_after < SETTINGS.open_s:
            assert set(served[10:]) == {"fallback"}
        await asyncio.to_thread(server.start)
        deadline = time.monotonic() + 60  # a pooled connection the kill broke fails once; retries wait
        while True:                       # reconnect_s between tries of the shared store
            state = await b.state("primary")
            if (state.generation == 0 and state.state == "closed") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        # Back on the (empty) shared state after the restart.
        assert (state.state, state.calls) == ("closed", 0)
        assert await serve(b, up) == "primary"
    finally:
        await client.aclose()


async def test_from_config_shares_the_budgets_client(server):
    from policies.budgets import Budgets
    from policies.limits_config import LimitsConfig

    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": server.url, "key_prefix": "f" + uuid.uuid4().hex[:8]},
        "breakers": {"default": {"min_calls": 1, "failure_rate": 1.0}, "by_name": {"big": {"min_calls": 2}}}})
    budgets_a, budgets_b = Budgets.from_config(cfg), Budgets.from_config(cfg)
    one, two = Breakers.from_config(cfg, redis=budgets_a.redis), Breakers.from_config(cfg, redis=budgets_b.redis)
    try:
        assert await one.record(await one.allow("big"), Outcome.FAILURE) == "counted"   # per-name settings
        assert await two.record(await two.allow("big"), Outcome.FAILURE) == "opened"
        assert (await one.state("big")).state == "open"
        assert await one.record(await one.allow("small"), Outcome.FAILURE) == "opened"  # the default
    finally:
        for b in (one, two):
            await b.close()
        for b in (budgets_a, budgets_b):
            await b.close()
    memory_only = Breakers.from_config(LimitsConfig())
    assert (await memory_only.allow("big")).allowed
