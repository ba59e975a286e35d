"""Fail-open with a real redis-server killed: each replica's local limiter starts from the usage it
last saw in Redis, so an outage admits at most the budget's remainder per replica (not a fresh
budget per replica), and a reload during the outage keeps counting what was admitted locally."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.limits import GatewayLimits
from policies.budgets import Budgets, Scopes
from policies.limits_config import LimitsConfig
from tests.redis_server import launch

ACME = Scopes(tenant="acme", api_key="ci")
BUDGET = 1000                   # tokens per day of tenant acme
REQUEST = (50, 50)              # tokens reserved and used by each request here


@pytest.fixture
def server():
    s = launch()
    yield s
    s.stop()


def _config(url: str, prefix: str, budget: int = BUDGET) -> LimitsConfig:
    return LimitsConfig.model_validate({
        "store": {"backend": "redis", "url": url, "key_prefix": prefix, "on_store_failure": "open",
                  "reconnect_interval_s": 0.05, "timeout_s": 2},
        "tenants": {"by_id": {"acme": {"tokens_per_day": budget}}}})


async def _serve(budgets: Budgets, count: int) -> None:
    for _ in range(count):
        admission = await budgets.reserve(ACME, *REQUEST)
        assert admission.allowed and not admission.degraded
        await budgets.reconcile(admission.reservation, *REQUEST)


async def _admitted_locally(budgets: Budgets, budget: int = BUDGET) -> int:
    """Requests the local limiter admits (each held) until it refuses one."""
    admitted = 0
    while admitted <= BUDGET:
        admission = await budgets.reserve(ACME, *REQUEST)
        assert admission.degraded
        if not admission.allowed:
            # Everything admitted is still held: a short wait, not a spent budget.
            assert (admission.reason, admission.limit_kind) == ("rate_limit_exceeded", "tokens_per_day:held")
            assert admission.retry_after is not None and admission.retry_after > 0
            assert f"{budget} tokens per day" in admission.message      # the whole budget, as configured
            return admitted
        admitted += 1
    raise AssertionError("the local limiter never refused")


async def test_each_replica_starts_from_the_usage_it_last_saw(server):
    cfg = _config(server.url, "f" + uuid.uuid4().hex[:8])
    a, b = Budgets.from_config(cfg), Budgets.from_config(cfg)
    await _serve(a, 6)      # A last saw 600 (500 used + its own 100 reserved)
    await _serve(b, 1)      # B last saw 700
    await asyncio.to_thread(server.kill)
    assert await _admitted_locally(a) == 4          # 1000 - 600: a fresh budget would admit 10
    assert await _admitted_locally(b) == 3          # 1000 - 700
    # The bound: the usage when Redis went down (700) + each replica's remainder as it last saw
    # it (400 + 300) = 1400, where fresh local budgets gave 700 + 2 x 1000.
    await asyncio.to_thread(server.start)
    for budgets in (a, b):
        await budgets.close()


async def test_a_reload_during_an_outage_keeps_the_local_count(server):
    prefix = "r" + uuid.uuid4().hex[:8]
    limits = GatewayLimits.open(_config(server.url, prefix))
    await _serve(limits.budgets, 6)
    await asyncio.to_thread(server.kill)
    for _ in range(2):                              # 200 more, admitted locally
        admission = await limits.budgets.reserve(ACME, *REQUEST)
        assert admission.allowed and admission.degraded
        await limits.budgets.reconcile(admission.reservation, *REQUEST)
    reloaded = limits.reconfigured(_config(server.url, prefix, budget=BUDGET + 100))
    assert reloaded is not limits and reloaded.budgets.store is limits.budgets.store
    assert await _admitted_locally(reloaded.budgets, BUDGET + 100) == 3    # 1100 - 600 - 200, not a fresh 1100
    await asyncio.to_thread(server.start)
    assert await limits.budgets.flush(60)                       # the local usage reaches Redis
    usage = await reloaded.budgets.usage("t:acme")
    assert usage.used_tokens_day == 200                         # (a restart without persistence lost the rest)
    await limits.close()
    await reloaded.close()


async def test_an_outage_starts_from_what_finished_requests_used_not_what_they_reserved(server):
    """A request reserves its whole max_tokens and uses a little: the figure an outage starts
    from is what it used, so the tenant keeps the rest of its budget while Redis is down."""
    budgets = Budgets.from_config(_config(server.url, "s" + uuid.uuid4().hex[:8]))
    admission = await budgets.reserve(ACME, 50, 800)
    assert admission.allowed and not admission.degraded
    await budgets.reconcile(admission.reservation, 50, 10)     # 60 used of the 850 reserved
    await asyncio.to_thread(server.kill)
    admission = await budgets.reserve(ACME, 50, 800)           # 60 + 850 fit in 1000
    assert admission.allowed and admission.degraded
    await budgets.reconcile(admission.reservation, 50, 10)
    refused = await budgets.reserve(ACME, 50, 900)             # 120 + 950 do not
    assert not refused.allowed and refused.limit_kind == "tokens_per_day"
    await asyncio.to_thread(server.start)
    await budgets.close()
