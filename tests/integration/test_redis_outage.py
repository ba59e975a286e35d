"""A real redis-server killed (SIGKILL, no persistence) and restarted on the same port while
requests run: the policy decides (fail-open: local limiter; fail-closed: 503), the client
reconnects by itself, and no reconciliation is lost."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis

from policies.budgets import Budgets, BudgetStoreUnavailable, FinishStatus, Scopes
from policies.limits_config import LimitsConfig
from tests.redis_server import launch

ACME = Scopes(tenant="acme", api_key="ci")


@pytest.fixture
def server():
    s = launch()
    yield s
    s.stop()


@dataclass
class Done:
    rid: str
    degraded: bool
    status: FinishStatus
    tokens: int


class Load:
    """Workers that reserve, 'generate' for a few ms, and reconcile, until told to stop."""

    def __init__(self, budgets: Budgets, workers: int = 16):
        self.budgets = budgets
        self.done: list[Done] = []
        self.unavailable = 0
        self.retry_afters: set[float] = set()
        self.stop = asyncio.Event()
        self.tasks = [asyncio.create_task(self._worker(random.Random(i))) for i in range(workers)]

    async def _worker(self, rng: random.Random) -> None:
        while not self.stop.is_set():
            try:
                admission = await self.budgets.reserve(ACME, 50, 50)
            except BudgetStoreUnavailable as exc:
                self.unavailable += 1
                self.retry_afters.add(exc.retry_after)
                await asyncio.sleep(0.01)
                continue
            assert admission.allowed, admission.message
            await asyncio.sleep(rng.random() * 0.02)
            out = rng.randint(0, 50)
            status = await self.budgets.reconcile(admission.reservation, 50, out)
            self.done.append(Done(admission.reservation.id, admission.degraded, status, 50 + out))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)


async def wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.parametrize("policy", ["open", "closed"])
async def test_redis_killed_mid_load(server, policy):
    prefix = "o" + uuid.uuid4().hex[:8]
    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": server.url, "key_prefix": prefix, "on_store_failure": policy,
                  "reconnect_interval_s": 0.1, "timeout_s": 0.5},
        "tenants": {"by_id": {"acme": {"tokens_per_day": 10**9, "max_concurrent": 1000}}},
        "api_keys": {"default": {"rpm": 100_000}}})
    budgets = Budgets.from_config(cfg)
    load = Load(budgets)
    assert await wait_for(lambda: len(load.done) >= 50, 10)

    await asyncio.to_thread(server.kill)
    killed_at = len(load.done)
    await asyncio.sleep(0.8)
    during = load.done[killed_at:]
    if policy == "closed":
        assert load.unavailable > 0 and load.retry_afters == {0.1}   # 503s with Retry-After
        assert not any(d.degraded for d in load.done)
    else:
        assert load.unavailable == 0
        assert sum(d.degraded for d in during) >= 20                 # the local limiter admitted
    assert budgets.pending_replays > 0

    await asyncio.to_thread(server.start)                            # same port, empty data
    restarted_at = len(load.done)
    recovered = await wait_for(
        lambda: sum(not d.degraded and d.status is FinishStatus.APPLIED for d in load.done[restarted_at:]) >= 30, 5)
    assert recovered, "did not go back to Redis by itself after the restart"
    await load.finish()
    assert await budgets.flush(5), "queued reconciliations were not replayed"

    # Every reconciliation queued during the outage, or made after the restart, is in Redis.
    client = aioredis.Redis.from_url(server.url)
    try:
        async with client.pipeline(transaction=False) as pipe:
            for d in load.done:
                pipe.hget(f"{{{prefix}}}:res:{d.rid}", "st")
            states = await pipe.execute()
    finally:
        await client.aclose()
    landed = {d.rid for d, st in zip(load.done, states, strict=True) if st == b"d"}
    must_land = [d for i, d in enumerate(load.done)
                 if d.status is FinishStatus.QUEUED or d.degraded or i >= restarted_at]
    assert len(must_land) > 30 and all(d.rid in landed for d in must_land)
    usage = await budgets.usage("t:acme")
    assert usage.used_tokens_day == sum(d.tokens for d in load.done if d.rid in landed)
    assert (usage.reserved_tokens_day, usage.in_flight, await budgets.held()) == (0, 0, 0)
    await budgets.close()


async def test_scripts_are_reloaded_after_a_restart(server):
    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": server.url, "reconnect_interval_s": 0.05},
        "tenants": {"default": {"rpm": 100}}})
    budgets = Budgets.from_config(cfg)
    assert (await budgets.reserve(ACME, 1, 1)).allowed
    client = aioredis.Redis.from_url(server.url)
    await client.script_flush()          # NOSCRIPT on the next EVALSHA: redis-py loads it again
    await client.aclose()
    assert (await budgets.reserve(ACME, 1, 1)).allowed
    await asyncio.to_thread(server.restart)
    await asyncio.sleep(0.06)
    admission = None
    for _ in range(3):                   # the first call may meet a connection the kill closed
        try:
            admission = await budgets.reserve(ACME, 1, 1)
            break
        except BudgetStoreUnavailable:
            await asyncio.sleep(0.06)
    assert admission is not None and admission.allowed and not admission.degraded
    await budgets.close()


async def test_local_limiter_while_down_then_replay(server):
    """Fail-open keeps enforcing limits locally; the usage admitted meanwhile reaches Redis later."""
    port_url = server.url
    await asyncio.to_thread(server.kill)
    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": port_url, "on_store_failure": "open", "reconnect_interval_s": 0.05},
        "tenants": {"by_id": {"acme": {"rpm": 2, "tokens_per_day": 1000}}}})
    budgets = Budgets.from_config(cfg)
    a, b, c = [await budgets.reserve(ACME, 10, 10) for _ in range(3)]
    assert a.allowed and b.allowed and a.degraded and b.degraded
    assert not c.allowed and c.degraded and c.limit_kind == "rpm"      # the local limiter refused
    assert await budgets.reconcile(a.reservation, 10, 5) is FinishStatus.QUEUED    # local, Redis later
    assert await budgets.reconcile(a.reservation, 10, 5) is FinishStatus.DUPLICATE
    await budgets.release(b.reservation)
    await asyncio.to_thread(server.start)
    assert await budgets.flush(3)
    usage = await budgets.usage("t:acme")
    assert (usage.used_tokens_day, usage.reserved_tokens_day) == (15, 0)   # counted once, in Redis
    fresh = await budgets.reserve(ACME, 10, 10)
    assert fresh.allowed and not fresh.degraded
    await budgets.close()

    closed = Budgets.from_config(cfg.model_copy(update={"store": cfg.store.model_copy(
        update={"on_store_failure": "closed"})}))
    await asyncio.to_thread(server.kill)
    with pytest.raises(BudgetStoreUnavailable) as info:
        await closed.reserve(ACME, 10, 10)
    assert info.value.retry_after == 0.05
    await closed.close()


async def test_a_reserve_that_timed_out_after_running_holds_nothing(server):
    """Redis is busy: our reserve times out client-side but runs later. The queued release frees
    it, so no phantom reservation holds capacity until its expiry."""
    prefix = "b" + uuid.uuid4().hex[:8]
    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": server.url, "key_prefix": prefix, "on_store_failure": "open",
                  "timeout_s": 0.1, "reconnect_interval_s": 0.05},
        "tenants": {"by_id": {"acme": {"max_concurrent": 10, "tokens_per_day": 1000}}}})
    budgets = Budgets.from_config(cfg)
    assert (await budgets.reserve(ACME, 1, 1)).allowed     # scripts loaded, a connection open
    blocker = aioredis.Redis.from_url(server.url)
    busy = asyncio.create_task(blocker.eval(
        "local s = redis.call('TIME')[1] + 0 local t repeat t = redis.call('TIME') "
        "until t[1] + t[2] / 1e6 > s + 1.5 return 1", 0))
    await asyncio.sleep(0.05)
    timed_out = await budgets.reserve(ACME, 100, 100)
    assert timed_out.allowed and timed_out.degraded
    await busy
    await blocker.aclose()
    assert await budgets.flush(3)
    await asyncio.sleep(0.1)
    usage = await budgets.usage("t:acme")
    assert usage.in_flight == 1 and usage.reserved_tokens_day == 2          # only the first one
    client = aioredis.Redis.from_url(server.url)
    keys = [k async for k in client.scan_iter(match=f"{{{prefix}}}:res:*")]
    statuses = sorted([await client.hget(k, "st") for k in keys])
    await client.aclose()
    assert len(statuses) == 2 and statuses.count(b"d") == 1     # the late-running reserve was released
    await budgets.close()


async def test_usage_admitted_while_down_survives_the_release_replay(server):
    """A reserve that fails against a dead Redis queues a release of its id and is admitted locally.
    Replaying that release first must not make the request's own usage replay look like a duplicate."""
    cfg = LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": server.url, "key_prefix": "u" + uuid.uuid4().hex[:8],
                  "on_store_failure": "open", "reconnect_interval_s": 0.05},
        "tenants": {"by_id": {"acme": {"tokens_per_day": 1000}}}})
    budgets = Budgets.from_config(cfg)
    await asyncio.to_thread(server.kill)
    admitted = await budgets.reserve(ACME, 10, 10)
    assert admitted.allowed and admitted.degraded
    await asyncio.to_thread(server.start)
    assert await budgets.flush(3)                       # the queued release lands first
    assert await budgets.reconcile(admitted.reservation, 10, 5) is FinishStatus.QUEUED
    assert await budgets.flush(3)
    usage = await budgets.usage("t:acme")
    assert (usage.used_tokens_day, usage.reserved_tokens_day) == (15, 0)
    await budgets.close()
