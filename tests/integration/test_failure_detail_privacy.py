"""What an upstream answered when it failed (its bytes may quote the prompt) reaches the log
lines and the console only for a tenant whose content the operator lets be recorded; for any
other tenant they say the tier, the reason code and the HTTP status, over real HTTP."""

from __future__ import annotations

import logging
import time

import httpx
import pytest

from policies.config import hash_api_key
from tests.fakes.upstream import _INTERNAL
from tests.gateway_harness import InstantUpstream, RunningGateway, logged_request

PLAIN_KEY = "sk-detail-plain-0123456789"
AUDITED_KEY = "sk-detail-audited-0123456789"
UPSTREAM_BYTES = "failing on purpose"        # what the fake upstream answers with its 500


def _config(failing: str, steady: str) -> str:
    return f"""
server: {{reload_poll_s: 0}}
auth:
  keys:
    - {{tenant: plain, sha256: {hash_api_key(PLAIN_KEY)}}}
    - {{tenant: audited, sha256: {hash_api_key(AUDITED_KEY)}}}
tenants:
  plain: {{}}
  audited: {{record_content: true}}
telemetry: {{exporter: none, record_content: true}}
tiers:
  flaky_a: {{kind: upstream, base_url: "{failing}", model: instant}}
  flaky_b: {{kind: upstream, base_url: "{failing}", model: instant}}
  steady: {{kind: upstream, base_url: "{steady}", model: instant}}
models:
  a: {{chain: [flaky_a, steady]}}
  b: {{chain: [flaky_b, steady]}}
  s: {{chain: [steady]}}
limits:
  retry: {{min_retries_per_window: 1000}}
  breakers: {{by_name: {{flaky_a: {{min_calls: 2, failure_rate: 0.5, open_s: 600}},
                        flaky_b: {{min_calls: 2, failure_rate: 0.5, open_s: 600}}}}}}
"""


@pytest.fixture
def gateway(tmp_path):
    failing, steady = InstantUpstream(), InstantUpstream()
    httpx.post(f"http://127.0.0.1:{failing.port}/__control", json={"fail_status": 500}, timeout=10).raise_for_status()
    path = tmp_path / "gateway.yaml"
    path.write_text(_config(failing.base_url, steady.base_url))
    gw = RunningGateway(path)
    gw.steady_port = steady.port
    yield gw
    gw.stop()
    failing.stop()
    steady.stop()


def _ask(gw: RunningGateway, key: str, model: str) -> httpx.Response:
    resp = httpx.post(f"{gw.base}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, timeout=30,
                      json={"model": model, "messages": [{"role": "user", "content": "private words"}],
                            "max_tokens": 3})
    assert resp.status_code == 200 and resp.headers["x-tiergate-fallbacks"].endswith("tier_failure")
    return resp


def test_upstream_bytes_reach_logs_and_console_only_with_content_permission(gateway, caplog):
    caplog.set_level(logging.INFO)
    plain = [_ask(gateway, PLAIN_KEY, "a").headers["x-request-id"] for _ in range(2)]
    audited = [_ask(gateway, AUDITED_KEY, "b").headers["x-request-id"] for _ in range(2)]

    for rid in plain:
        (fallback,) = logged_request(caplog, rid)["fallbacks"]
        assert UPSTREAM_BYTES not in fallback and "http_500" in fallback and fallback.startswith("flaky_a")
    assert UPSTREAM_BYTES in logged_request(caplog, audited[0])["fallbacks"][0]
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.pipeline"]
    assert [w for w in warnings if plain[0] in w] and not any(UPSTREAM_BYTES in w for w in warnings if "flaky_a" in w)
    assert any(UPSTREAM_BYTES in w for w in warnings if audited[0] in w)

    deadline = time.monotonic() + 20
    while True:       # the console writes breaker history once a second
        doc = httpx.get(f"{gateway.base}/console/api/state", timeout=10).json()
        history = {name: b["history"] for name, b in doc["breakers"]["tiers"].items()}
        if history["flaky_a"] and history["flaky_b"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    decisions = {d["request_id"]: d for d in doc["routing"]["decisions"]}
    assert all(UPSTREAM_BYTES not in decisions[rid]["fallbacks"][0]["detail"] for rid in plain)
    assert "http_500" in decisions[plain[0]]["fallbacks"][0]["detail"]
    assert UPSTREAM_BYTES in decisions[audited[0]]["fallbacks"][0]["detail"]
    assert history["flaky_a"][0]["event"] == "opened" and UPSTREAM_BYTES not in history["flaky_a"][0]["why"]
    assert "http_500" in history["flaky_a"][0]["why"] and UPSTREAM_BYTES in history["flaky_b"][0]["why"]


def test_a_failure_mid_stream_is_logged_with_its_bytes_only_with_content_permission(gateway, caplog):
    """After the first event the upstream tier logs the failure itself (the chain walk is done)."""
    caplog.set_level(logging.INFO)
    control = f"http://127.0.0.1:{gateway.steady_port}/__control"
    httpx.post(control, json={"mode": "error_event"}, timeout=10).raise_for_status()
    try:
        ids = {}
        for name, key in (("plain", PLAIN_KEY), ("audited", AUDITED_KEY)):
            with httpx.stream("POST", f"{gateway.base}/v1/chat/completions", timeout=30,
                              headers={"authorization": f"Bearer {key}"},
                              json={"model": "s", "stream": True, "max_tokens": 3,
                                    "messages": [{"role": "user", "content": "private words"}]}) as resp:
                body = resp.read().decode()
            assert resp.status_code == 200 and '"error"' in body and _INTERNAL not in body
            ids[name] = resp.headers["x-request-id"]
            logged_request(caplog, ids[name])
    finally:
        httpx.post(control, json={"mode": None}, timeout=10)
    warnings = [r.getMessage() for r in caplog.records if "mid-stream" in r.getMessage()]
    plain = [w for w in warnings if ids["plain"] in w]
    audited = [w for w in warnings if ids["audited"] in w]
    assert plain and audited
    assert not any(_INTERNAL in w for w in plain) and any(_INTERNAL in w for w in audited)
