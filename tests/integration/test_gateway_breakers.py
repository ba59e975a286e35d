"""Circuit breakers, the retry budget and the deadline through the gateway over real HTTP.

Shared through Redis by two gateway processes: a failing upstream opens its breaker, traffic
goes to the fallback tier, the other replica skips the open tier at once, half-open probes
close it once the upstream recovers, and 4xx answers never count. In memory (one process):
the same breaker, the retry budget and the request deadline.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes.upstream import ANSWER
from policies.breakers.redis_store import RedisBreakerStore
from policies.limits_config import BreakerSettings
from tests.gateway_harness import InstantUpstream, RunningGateway, shared
from tests.integration.test_gateway_budgets_replicas import APP_KEY, MSG, Replicas

PRIMARY = BreakerSettings(window_s=60, min_calls=4, failure_rate=0.5, open_s=3, half_open_probes=2)


def _ask(base: str, model: str = "flaky", key: str = APP_KEY) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json={"model": model, "messages": MSG, "max_tokens": 9},
                      headers={"authorization": f"Bearer {key}"}, timeout=30)


async def _state(replicas: Replicas, name: str):
    import redis.asyncio as aioredis
    client = aioredis.Redis.from_url(replicas.redis.url)
    try:
        return await RedisBreakerStore(client, replicas.prefix).state(name, PRIMARY)
    finally:
        await client.aclose()


def _breaker(replicas: Replicas):
    return asyncio.run(_state(replicas, "primary"))


@pytest.mark.slow
def test_breaker_state_is_shared_by_replicas_and_probes_close_it(request):
    replicas = shared(request, "budget-replicas", Replicas)
    a, b = replicas.bases
    replicas.control(fail_status=500)
    try:
        for _ in range(4):                 # min_calls failures on replica A, each served by the fallback
            resp = _ask(a)
            assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "backup"
            assert resp.headers["x-tiergate-fallbacks"] == "primary: tier_failure"
        state = _breaker(replicas)
        assert state.state == "open" and state.open_for_s > 0
        failed = replicas.control()["failed"]
        # Replica B has not called `primary` yet: its /metrics still shows the shared state.
        assert _scraped_breaker_state(b, "primary") == "open"

        resp = _ask(b)                      # replica B's first request skips the open tier
        assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "backup"
        assert resp.headers["x-tiergate-fallbacks"] == "primary: breaker_open"
        only = _ask(b, "flaky-only")        # a chain with every breaker open: 503 + Retry-After
        assert only.status_code == 503 and only.json()["error"]["code"] == "no_tier_available"
        assert "circuit breakers open for primary" in only.json()["error"]["message"]
        assert 1 <= int(only.headers["retry-after"]) <= 3
        assert replicas.control()["failed"] == failed      # the open tier saw none of them
    finally:
        replicas.control(fail_status=None)                  # the upstream recovers

    deadline = time.time() + 120
    while _breaker(replicas).open_for_s > 0 and time.time() < deadline:
        time.sleep(0.05)
    answered = replicas.control()["completions"]
    first = _ask(b)                          # half-open: a probe, on replica B
    assert first.status_code == 200 and first.headers["x-tiergate-tier"] == "primary"
    assert first.json()["choices"][0]["message"]["content"] == ANSWER
    state = _breaker(replicas)
    assert (state.state, state.probe_successes) == ("half_open", 1)
    second = _ask(a)                         # the second probe, on replica A, closes it
    assert second.status_code == 200 and second.headers["x-tiergate-tier"] == "primary"
    assert _breaker(replicas).state == "closed"
    assert replicas.control()["completions"] == answered + 2
    for base in (a, b):
        resp = _ask(base)
        assert resp.headers["x-tiergate-tier"] == "primary" and "x-tiergate-fallbacks" not in resp.headers


def test_client_errors_never_trip_the_breaker(request):
    replicas = shared(request, "budget-replicas", Replicas)
    before = _breaker(replicas)
    assert before.state == "closed"
    replicas.control(fail_status=400)
    try:
        for i in range(6):
            resp = _ask(replicas.bases[i % 2])
            assert resp.status_code == 400                  # the upstream's 4xx goes back as is, no fallback
            assert resp.json()["error"]["message"] == "failing on purpose (400)"
    finally:
        replicas.control(fail_status=None)
    state = _breaker(replicas)
    assert (state.state, state.calls, state.failures) == ("closed", before.calls, before.failures)


# ---- one process, memory store ------------------------------------------------------------

@pytest.fixture(scope="module")
def flaky():
    server = InstantUpstream()
    yield server
    server.stop()


def _control(upstream: InstantUpstream, **update) -> dict:
    return httpx.post(upstream.base_url.removesuffix("/v1") + "/__control", json=update).json()


def _memory_gateway(tmp_path, flaky_url: str, backup_url: str, extra: str = "") -> RunningGateway:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  primary: {{kind: upstream, base_url: "{flaky_url}", model: flaky}}
  backup: {{kind: upstream, base_url: "{backup_url}", model: instant}}
models:
  m: {{chain: [primary, backup]}}
{extra}""")
    return RunningGateway(path)


def test_memory_breaker_opens_and_sends_traffic_to_the_fallback(tmp_path, flaky):
    backup = InstantUpstream()
    gw = _memory_gateway(tmp_path, flaky.base_url, backup.base_url,
                         "limits: {breakers: {default: {min_calls: 6, open_s: 60}}, "
                         "retry: {min_retries_per_window: 100}}\n")
    _control(flaky, fail_status=503)
    try:
        tiers = [_ask(gw.base, "m").headers["x-tiergate-tier"] for _ in range(10)]
        assert tiers == ["backup"] * 10
        # The breaker opened after 6 failures: the last 4 requests never reached the failing upstream.
        assert _control(flaky)["failed"] == 6
        assert asyncio.run_coroutine_threadsafe(gw.runtime.limits.breakers.state("primary"),
                                                gw.server_loop()).result(5).state == "open"
    finally:
        _control(flaky, fail_status=None)
        gw.stop()
        backup.stop()


def test_retry_budget_and_deadline_stop_retries(tmp_path, flaky):
    backup = InstantUpstream()
    gw = _memory_gateway(tmp_path, flaky.base_url, backup.base_url,
                         "limits: {retry: {budget_ratio: 0.0, min_retries_per_window: 1, deadline_s: 0.5}}\n")
    _control(flaky, fail_status=500)
    try:
        assert _ask(gw.base, "m").headers["x-tiergate-tier"] == "backup"     # the one retry allowed
        denied = _ask(gw.base, "m")
        assert denied.status_code == 503 and denied.json()["error"]["code"] == "retry_budget_exhausted"
        assert "(http_500)" in denied.json()["error"]["message"] and "retry-after" in denied.headers
        # Now slow, not failing: its answer would come after the client's own 30 s timeout, so
        # a 504 at all shows the 0.5 s deadline cut the call (no wall-clock bound needed).
        _control(flaky, fail_status=None, delay_s=45.0)
        late = _ask(gw.base, "m")
        assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    finally:
        _control(flaky, fail_status=None, delay_s=0)
        gw.stop()
        backup.stop()


def _scraped_breaker_state(base: str, tier: str) -> str:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    states = [sample.labels["state"] for family in text_string_to_metric_families(text)
              if family.name == "tiergate_breaker_state" for sample in family.samples
              if sample.labels["tier"] == tier and sample.value == 1]
    assert len(states) == 1, states
    return states[0]
