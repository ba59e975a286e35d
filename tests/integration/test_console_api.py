"""The console's JSON and files over real HTTP: who may see them, what they show after traffic
(decisions, tier figures, an opened breaker with its history, budget use and refusals), the
config digest across a good and a rejected reload, and two replicas on one Redis showing the
same breakers and budgets."""

from __future__ import annotations

import time

import httpx
import pytest

from policies.config import hash_api_key
from tests.gateway_harness import InstantUpstream, RunningGateway
from tests.integration.test_gateway_admin_access import OffLoopbackGateway
from tests.redis_server import RedisServer

APP_KEY = "sk-console-api-app"
ADMIN_KEY = "sk-console-api-admin"
MSG = [{"role": "user", "content": "hello there"}]


def _config(upstream: str, steady: str, *, admin: bool = True, store: str = "{backend: memory}") -> str:
    admin_keys = f"admin_keys: [{{sha256: {hash_api_key(ADMIN_KEY)}, name: ops}}]" if admin else ""
    return f"""
server: {{reload_poll_s: 0}}
auth:
  keys: [{{tenant: app, sha256: {hash_api_key(APP_KEY)}, name: app-key}}]
  {admin_keys}
tenants:
  app: {{}}
tiers:
  flaky: {{kind: upstream, base_url: "{upstream}", model: instant}}
  steady: {{kind: upstream, base_url: "{steady}", model: instant}}
models:
  m: {{chain: [flaky, steady]}}
limits:
  store: {store}
  tenants: {{by_id: {{app: {{tokens_per_day: 400, max_concurrent: 20}}}}}}
  breakers:
    by_name:
      flaky: {{window_s: 120, min_calls: 2, failure_rate: 0.5, open_s: 300}}
"""


def _ask(base: str, max_tokens: int = 5) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": max_tokens},
                      headers={"authorization": f"Bearer {APP_KEY}"}, timeout=30)


def _state(base: str, key: str | None = ADMIN_KEY, query: str = "") -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{base}/console/api/state{query}", headers=headers, timeout=10)


def _until(check, timeout_s: float = 20.0):
    """Poll `check()` until it returns something truthy (the console ticks once a second)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


@pytest.fixture
def upstream():
    up = InstantUpstream()          # flaky's, its own: these tests make it fail
    yield up
    up.stop()


@pytest.fixture(scope="module")
def steady():
    up = InstantUpstream()
    yield up.base_url
    up.stop()


def _control(up: InstantUpstream, **settings) -> None:
    httpx.post(f"http://127.0.0.1:{up.port}/__control", json=settings, timeout=10).raise_for_status()


def test_who_sees_the_console(upstream, steady, tmp_path):
    with_admin, without = tmp_path / "admin.yaml", tmp_path / "none.yaml"
    with_admin.write_text(_config(upstream.base_url, steady))
    without.write_text(_config(upstream.base_url, steady, admin=False))
    public = OffLoopbackGateway(with_admin, "0.0.0.0")
    closed = OffLoopbackGateway(without, "0.0.0.0")
    local = RunningGateway(without)
    try:
        page = httpx.get(f"{public.base}/console", timeout=10)
        assert page.status_code == 200 and "console.js" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        for asset in ("console.js", "console.css"):
            assert httpx.get(f"{public.base}/console/static/{asset}", timeout=10).status_code == 200
        missing = httpx.get(f"{public.base}/console/static/other.js", timeout=10)
        assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "param", "code"}
        assert _state(public.base, None).status_code == 401
        assert _state(public.base, APP_KEY).status_code == 403
        ok = _state(public.base)
        assert ok.status_code == 200 and {t["name"] for t in ok.json()["tiers"]} == {"flaky", "steady"}
        bad = _state(public.base, query="?since=soon")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        # Off loopback with no admin key configured, the console does not exist.
        for path in ("/console", "/console/static/console.js", "/console/api/state"):
            assert httpx.get(f"{closed.base}{path}", timeout=10).status_code == 404
        # On loopback it follows /metrics: open.
        assert _state(local.base, None).status_code == 200
    finally:
        public.stop()
        closed.stop()
        local.stop()


def test_traffic_breakers_budgets_and_reloads(upstream, steady, tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(_config(upstream.base_url, steady))
    gw = RunningGateway(path)
    try:
        first = _state(gw.base).json()
        assert first["routing"]["decisions"] == [] and first["breakers"]["tiers"]["flaky"]["state"] == "closed"
        for _ in range(2):
            assert _ask(gw.base).headers["x-tiergate-tier"] == "flaky"
        _control(upstream, fail_status=502)
        for _ in range(2):                  # two failures open flaky's breaker; steady answers
            resp = _ask(gw.base)
            assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "steady"
        _control(upstream, fail_status=None)
        while _ask(gw.base, max_tokens=100).status_code != 429:   # spend the tenant's tokens per day
            pass

        def settled():
            doc = _state(gw.base).json()
            flaky = doc["breakers"]["tiers"]["flaky"]
            return doc if flaky["history"] and doc["budgets"]["recent_refusals"] else None
        doc = _until(settled)
        flaky = doc["breakers"]["tiers"]["flaky"]
        assert flaky["state"] == "open" and flaky["open_for_s"] > 0
        assert flaky["history"][0]["event"] == "opened" and "tier_failure" in flaky["history"][0]["why"]
        decisions = doc["routing"]["decisions"]
        assert decisions[0]["status"] == 429 and decisions[-1]["tier"] == "flaky"
        failed_over = [d for d in decisions if d["fallbacks"]]
        assert failed_over[-1]["fallbacks"][0] == {"tier": "flaky", "reason": "tier_failure",
                                                    "detail": failed_over[-1]["fallbacks"][0]["detail"]}
        assert all(d["overhead_ms"] >= 0 for d in decisions)
        tiers = {t["name"]: t for t in doc["tiers"]}
        assert tiers["flaky"]["series"]["totals"] == {"requests": 4, "errors": 2, "output_tokens": 10}
        assert tiers["steady"]["series"]["totals"]["requests"] >= 2
        assert doc["routing"]["share"]["steady"]["requests"] >= 2
        (scope,) = doc["budgets"]["scopes"]
        assert scope["scope"] == "t:app" and scope["limits"]["tokens_per_day"] == 400
        assert 0 < scope["used"]["tokens_day"] <= 400 and scope["refusals"] >= 1
        assert doc["budgets"]["recent_refusals"][0]["kind"] == "tokens_per_day"
        # Only new sparkline points when the page says what it has.
        newest = max(p[0] for t in doc["tiers"] for p in t["series"]["points"])
        later = _state(gw.base, query=f"?since={newest}").json()
        assert all(p[0] > newest for t in later["tiers"] for p in t["series"]["points"])

        digest = doc["config"]["digest"]
        path.write_text("tiers: [")                       # not YAML: rejected, the old config stays
        assert gw.reload("test") is False
        rejected = _state(gw.base).json()["config"]
        assert rejected["digest"] == digest and rejected["rejected"]["why"] == "test"
        assert rejected["rejected"]["error"] and rejected["reloaded_at"] is None
        path.write_text(_config(upstream.base_url, steady).replace("max_concurrent: 20", "max_concurrent: 21"))
        assert gw.reload("test") is True
        reloaded = _state(gw.base).json()["config"]
        assert reloaded["digest"] != digest and reloaded["generation"] == 2 and reloaded["reloaded_at"]
    finally:
        gw.stop()


def test_replicas_on_redis_show_the_same_breakers_and_budgets(upstream, steady, tmp_path):
    redis = RedisServer().start()
    store = f'{{backend: redis, url: "{redis.url}", key_prefix: console{int(time.time() * 1000) % 100000}}}'
    path = tmp_path / "gateway.yaml"
    path.write_text(_config(upstream.base_url, steady, store=store))
    a, b = RunningGateway(path), RunningGateway(path)
    try:
        _control(upstream, fail_status=500)
        for _ in range(2):
            assert _ask(a.base).headers["x-tiergate-tier"] == "steady"    # replica A opens the breaker
        _control(upstream, fail_status=None)

        def seen_on_b():
            doc = _state(b.base).json()       # replica B served nothing
            flaky = doc["breakers"]["tiers"]["flaky"]
            return doc if flaky["history"] and doc["budgets"]["scopes"] else None
        doc = _until(seen_on_b)
        assert doc["breakers"]["shared"] and doc["breakers"]["tiers"]["flaky"]["state"] == "open"
        assert doc["breakers"]["tiers"]["flaky"]["history"][0]["event"] == "opened"
        assert doc["routing"]["decisions"] == []          # decisions stay per replica
        (scope,) = doc["budgets"]["scopes"]
        assert doc["budgets"]["shared"] and scope["scope"] == "t:app" and scope["used"]["tokens_day"] > 0
    finally:
        a.stop()
        b.stop()
        redis.stop()
