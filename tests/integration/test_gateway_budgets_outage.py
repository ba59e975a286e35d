"""The real redis-server behind the budgets is killed mid-load and restarted: a fail-closed
gateway answers 503 with Retry-After meanwhile, a fail-open one keeps serving, both recover,
and no reconciliation is lost: what Redis records after the restart is exactly the usage
served since the kill."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import redis.asyncio as aioredis

from tests.fakes.upstream import ANSWER
from policies.budgets.redis_store import RedisBudgetStore
from tests.gateway_harness import InstantUpstream, RunningGateway
from tests.redis_server import launch

MSG = [{"role": "user", "content": "Say something."}]
ACTUAL = 2 + len(ANSWER.split())


def _config(upstream: str, redis_url: str, policy: str) -> str:
    return f"""
auth: {{enabled: false, anonymous_tenant: app}}
server: {{reload_poll_s: 0, log_requests: false}}
tiers:
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
limits:
  store: {{backend: redis, url: "{redis_url}", key_prefix: {policy}, on_store_failure: {policy},
           timeout_s: 1.0, reconnect_interval_s: 0.2}}
  tenants:
    default: {{tokens_per_month: 1000000000}}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    redis = launch()
    upstream = InstantUpstream()
    gateways = {}
    try:
        for policy in ("closed", "open"):
            path = tmp_path_factory.mktemp(f"gw-{policy}") / "gateway.yaml"
            path.write_text(_config(upstream.base_url, redis.url, policy))
            gateways[policy] = RunningGateway(path)
        yield redis, gateways
    finally:
        for gw in gateways.values():
            gw.stop()
        upstream.stop()
        redis.stop()


async def _used(url: str, prefix: str) -> tuple[int, int, int]:
    """(used, reserved, held) tokens of tenant 'app' this month, read from Redis."""
    client = aioredis.Redis.from_url(url)
    try:
        store = RedisBudgetStore(client, prefix)
        usage = await store.usage("t:app")
        return usage.used_tokens_month, usage.reserved_tokens_month, await store.held()
    finally:
        await client.aclose()


async def _until(what: str, condition, deadline_s: float = 120) -> None:
    """Wait for a condition of the load (not for a time: a loaded machine only makes it slower)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        await asyncio.sleep(0.05)


async def _load(gateways: dict, redis) -> tuple[dict, dict, dict]:
    """Keep 6 requests in flight per gateway; once both have been served, pause writes, snapshot
    and kill Redis; restart it once fail-open has served requests and fail-closed has refused
    one meanwhile; stop once fail-closed serves again. Returns results, snapshots, phase times."""
    results = {policy: [] for policy in gateways}
    stop = asyncio.Event()
    marks = {}

    def served(policy: str, after: str | None = None, status: int = 200) -> int:
        since = marks.get(after, 0.0) if after else 0.0
        return sum(1 for t, s, _, _ in results[policy] if s == status and t > since)

    async def worker(client: httpx.AsyncClient, policy: str, base: str) -> None:
        while not stop.is_set():
            resp = await client.post(f"{base}/v1/chat/completions", json={"model": "up", "messages": MSG})
            results[policy].append((time.monotonic(), resp.status_code, resp.json(), resp.headers))

    async with httpx.AsyncClient(timeout=30) as client:
        workers = [asyncio.create_task(worker(client, policy, gw.base))
                   for policy, gw in gateways.items() for _ in range(6)]
        await _until("both gateways served", lambda: all(served(policy) >= 5 for policy in gateways))
        admin = aioredis.Redis.from_url(redis.url)
        marks["paused"] = time.monotonic()
        await admin.execute_command("CLIENT", "PAUSE", "10000", "WRITE")   # no script runs from here on...
        snapshots = {policy: await _used(redis.url, policy) for policy in gateways}
        await asyncio.to_thread(redis.kill)                                # ...to the crash
        await admin.aclose()
        marks["killed"] = time.monotonic()
        await _until("fail-open serves and fail-closed refuses while Redis is down",
                     lambda: served("open", "killed") > 10 and served("closed", "killed", 503) > 0)
        await asyncio.to_thread(redis.start)
        marks["restarted"] = time.monotonic()
        await _until("fail-closed serves again after the restart", lambda: served("closed", "restarted") > 0)
        stop.set()
        await asyncio.gather(*workers)
    return results, snapshots, marks


def test_redis_killed_mid_load(setup):
    redis, gateways = setup
    results, snapshots, marks = asyncio.run(_load(gateways, redis))

    closed = results["closed"]
    statuses = {status for _, status, _, _ in closed}
    assert statuses == {200, 503}, statuses
    refused = [(t, body, headers) for t, status, body, headers in closed if status == 503]
    assert all(body["error"]["code"] == "budget_store_unavailable" and headers["retry-after"] == "1"
               for _, body, headers in refused)
    assert all(t > marks["paused"] for t, _, _ in refused)          # refused only once Redis was gone
    assert any(t > marks["restarted"] and status == 200 for t, status, _, _ in closed)   # recovered

    opened = results["open"]
    assert {status for _, status, _, _ in opened} == {200}          # served all along
    assert sum(marks["killed"] < t < marks["restarted"] for t, _, _, _ in opened) > 10

    for policy, gw in gateways.items():
        flushed = asyncio.run_coroutine_threadsafe(gw.runtime.limits.budgets.flush(10), gw.server_loop())
        assert flushed.result(15), f"{policy}: reconciliations still queued"
        served = sum(body["usage"]["total_tokens"] for _, status, body, _ in results[policy] if status == 200)
        assert all(body["usage"]["total_tokens"] == ACTUAL for _, s, body, _ in results[policy] if s == 200)
        before_kill = snapshots[policy][0]
        used, reserved, held = asyncio.run(_used(redis.url, policy))
        # Redis lost everything at the kill (no persistence); since then it has counted every
        # token served, including requests in flight at the kill and those admitted meanwhile.
        assert used == served - before_kill, policy
        assert (reserved, held) == (0, 0)
        assert before_kill > 0 and used > 0
