"""Budgets and rate limits through the gateway over real HTTP, on the in-memory store: rpm with
Retry-After and x-ratelimit-* headers, insufficient_quota, agent sessions, streams reconciled
(also when the client leaves), a reload that keeps the counters, and no limits by default."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from gateway.schema import ChatCompletionRequest
from gateway.token_bounds import prompt_bound
from tests.fakes.upstream import ANSWER
from policies.config import hash_api_key
from tests.gateway_harness import InstantUpstream, RunningGateway

KEYS = {"rpm": "sk-rpm-000000001", "small": "sk-small-0000002", "sess": "sk-sess-00000003",
        "meter": "sk-meter-0000004"}
MSG = [{"role": "user", "content": "Say something."}]
# What a reservation holds for MSG's prompt: an upper bound of any upstream's count.
PROMPT_ESTIMATE = prompt_bound(ChatCompletionRequest.model_validate({"model": "m", "messages": MSG}))
PROMPT_WORDS = 2                                           # what the instant upstream counts
ANSWER_WORDS = len(ANSWER.split())
# Each request reserves PROMPT_ESTIMATE + ANSWER_WORDS and uses PROMPT_WORDS + ANSWER_WORDS: 8 fit.
SMALL_BUDGET = PROMPT_ESTIMATE + ANSWER_WORDS + 7 * (PROMPT_WORDS + ANSWER_WORDS)


def _config(upstream: str, small_budget: int = SMALL_BUDGET, prefix: str = "tiergate") -> str:
    return f"""
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(KEYS["rpm"])}, name: rpm-key}}
    - {{tenant: small, sha256: {hash_api_key(KEYS["small"])}}}
    - {{tenant: app, sha256: {hash_api_key(KEYS["sess"])}, name: sess-key}}
    - {{tenant: meter, sha256: {hash_api_key(KEYS["meter"])}, name: meter-key}}
tenants: {{app: {{}}, small: {{}}, meter: {{}}}}
tiers:
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
models:
  m: {{chain: [up]}}
limits:
  store: {{key_prefix: {prefix}}}
  api_keys:
    by_id:
      rpm-key: {{rpm: 120}}
  tenants:
    by_id:
      small: {{tokens_per_day: {small_budget}}}
      meter: {{tokens_per_day: 1000000}}
  sessions:
    default: {{rpm: 2}}
"""


@pytest.fixture(scope="module")
def upstream():
    server = InstantUpstream()     # our own: tests below change its behaviour
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw(upstream, tmp_path_factory):
    path = tmp_path_factory.mktemp("gw-budgets") / "gateway.yaml"
    path.write_text(_config(upstream.base_url))
    server = RunningGateway(path)
    server.http = httpx.Client(base_url=server.base, timeout=10)   # keep-alive: requests in ms
    yield server
    server.http.close()
    server.stop()


def _post(gw, key: str, headers: dict | None = None, **body) -> httpx.Response:
    payload = {"model": "m", "messages": MSG, "max_tokens": ANSWER_WORDS, **body}
    return gw.http.post("/v1/chat/completions", json=payload,
                        headers={"authorization": f"Bearer {KEYS[key]}", **(headers or {})})


def _on_gateway(gw, coro):
    """Run a coroutine on the gateway's own event loop (its budget objects live there)."""
    return asyncio.run_coroutine_threadsafe(coro, gw.server_loop()).result(timeout=10)


def test_rpm_limit_is_a_429_with_retry_after_and_headers(gw):
    first = _post(gw, "rpm")
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "120"
    assert first.headers["x-ratelimit-remaining-requests"] == "119"
    assert "retry-after" not in first.headers
    admitted = 1
    while (refused := _post(gw, "rpm")).status_code == 200 and admitted < 400:
        admitted += 1
    # A burst of 120 (one minute's worth), plus what refilled while it ran (one per 500 ms).
    assert refused.status_code == 429 and admitted >= 120
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
    assert "rpm-key" in error["message"] and "120 requests per minute" in error["message"]
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    wait_ms = int(refused.headers["retry-after-ms"])
    assert 0 < wait_ms <= 500                      # 60 s / 120: one request every 500 ms
    assert refused.headers["retry-after"] == "1"   # whole seconds, rounded up
    time.sleep(wait_ms / 1000 + 0.05)
    again = _post(gw, "rpm")
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == ANSWER


def test_budget_exhausted_is_insufficient_quota_and_a_reload_keeps_the_counters(gw, upstream):
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEYS["small"], max_retries=0)
    served = 0
    with pytest.raises(openai.RateLimitError) as info:
        for _ in range(20):
            served += client.chat.completions.create(model="m", messages=MSG, max_tokens=ANSWER_WORDS).usage.total_tokens
    # Each request reserves PROMPT_ESTIMATE + 9 and uses 2 + 9: the 9th no longer fits.
    assert served == 8 * (PROMPT_WORDS + ANSWER_WORDS)
    assert (info.value.code, info.value.type) == ("insufficient_quota", "insufficient_quota")
    assert "tenant 'small'" in info.value.message
    assert int(info.value.response.headers["retry-after"]) > 0      # the budget renews at the next UTC day
    limits = gw.runtime.limits
    usage = _on_gateway(gw, limits.budgets.usage("t:small"))
    assert (usage.used_tokens_day, usage.reserved_tokens_day, usage.in_flight) == (served, 0, 0)

    gw.config_path.write_text(_config(upstream.base_url, small_budget=SMALL_BUDGET + 100))
    assert gw.reload()
    assert gw.runtime.limits is not limits                       # new limits...
    assert gw.runtime.limits.budgets.store is limits.budgets.store   # ...on the same store
    resp = _post(gw, "small")
    assert resp.status_code == 200
    usage = _on_gateway(gw, gw.runtime.limits.budgets.usage("t:small"))
    assert usage.used_tokens_day == served + PROMPT_WORDS + ANSWER_WORDS
    _wait_closed(limits)          # retired once its requests were done; the store lives on

    # Another store: a fresh one for new requests (counters do not move across stores).
    kept = gw.runtime.limits
    gw.config_path.write_text(_config(upstream.base_url, small_budget=SMALL_BUDGET + 100, prefix="other"))
    assert gw.reload()
    assert gw.runtime.limits.budgets.store is not kept.budgets.store
    assert _on_gateway(gw, gw.runtime.limits.budgets.usage("t:small")).used_tokens_day == 0
    _wait_closed(kept)


def _wait_closed(limits) -> None:
    deadline = time.time() + 120
    while not limits.closed and time.time() < deadline:
        time.sleep(0.02)
    assert limits.closed


def test_agent_session_scope(gw):
    ok = [_post(gw, "sess", {"x-session-id": "agent-1"}).status_code for _ in range(2)]
    refused = _post(gw, "sess", {"x-session-id": "agent-1"})
    assert ok == [200, 200] and refused.status_code == 429
    assert "session 'agent-1'" in refused.json()["error"]["message"]
    assert _post(gw, "sess", {"x-session-id": "agent-2"}).status_code == 200
    assert _post(gw, "sess").status_code == 200           # no session: no session limit
    bad = _post(gw, "sess", {"x-session-id": "x" * 300})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-session-id"


def test_streams_are_reconciled_with_their_usage_and_when_the_client_leaves(gw, upstream):
    limits = gw.runtime.limits
    before = _on_gateway(gw, limits.budgets.usage("t:meter")).used_tokens_day
    client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=KEYS["meter"], max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=MSG, max_tokens=ANSWER_WORDS, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.total_tokens == PROMPT_WORDS + ANSWER_WORDS
    deadline = time.time() + 120
    while _on_gateway(gw, limits.budgets.usage("t:meter")).used_tokens_day == before and time.time() < deadline:
        time.sleep(0.02)        # the relay reconciles as the stream closes, just after [DONE]
    usage = _on_gateway(gw, limits.budgets.usage("t:meter"))
    assert (usage.used_tokens_day - before, usage.reserved_tokens_day) == (PROMPT_WORDS + ANSWER_WORDS, 0)

    # A client that leaves after two events: charged the prompt estimate + the events relayed.
    httpx.post(upstream.base_url.removesuffix("/v1") + "/__control", json={"stream_interval_s": 0.3})
    try:
        before = usage.used_tokens_day
        with httpx.stream("POST", f"{gw.base}/v1/chat/completions", timeout=10,
                          json={"model": "m", "messages": MSG, "max_tokens": ANSWER_WORDS, "stream": True},
                          headers={"authorization": f"Bearer {KEYS['meter']}"}) as resp:
            lines = resp.iter_lines()
            got = [next(lines) for _ in range(3)]   # role event, blank line, first word
        assert got[0].startswith("data: ")
        deadline = time.time() + 120
        while limits.in_flight and time.time() < deadline:
            time.sleep(0.02)
        usage = _on_gateway(gw, limits.budgets.usage("t:meter"))
        charged = usage.used_tokens_day - before
        assert PROMPT_ESTIMATE + 2 <= charged <= PROMPT_ESTIMATE + 4    # 2-4 events relayed of 11
        assert usage.reserved_tokens_day == 0 and usage.in_flight == 0 and limits.in_flight == 0
    finally:
        httpx.post(upstream.base_url.removesuffix("/v1") + "/__control", json={"stream_interval_s": 0})


def test_no_limits_section_means_no_budget_path(upstream, tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers: {{up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}}}
""")
    gw = RunningGateway(path)
    try:
        client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="up", messages=MSG)
        assert raw.parse().choices[0].message.content == ANSWER
        assert not any(h.startswith("x-ratelimit") for h in raw.headers)
        limits = gw.runtime.limits
        assert limits.config.store.backend == "memory" and not limits.active and not limits.shared
        assert limits.in_flight == 0 and limits.retry.snapshot() == (1, 0)   # one request, no retry
    finally:
        gw.stop()


@pytest.mark.parametrize("limits,needle", [
    ("{tiers: {by_id: {upp: {rpm: 1}}}}", "limits.tiers.by_id: unknown tier 'upp'"),
    ("{prices: {nope: {input_per_1m: 1}}}", "limits.prices: unknown tier 'nope'"),
    ("{breakers: {by_name: {x: {min_calls: 2}}}}", "limits.breakers.by_name: unknown tier 'x'"),
    ("{tenants: {by_id: {ghost: {rpm: 1}}}}", "limits.tenants.by_id: unknown tenant 'ghost'"),
    ("{store: {backend: redis}}", "limits.store: the redis backend needs a url"),
])
def test_limits_that_name_nothing_fail_at_load(limits, needle):
    from policies.config import ConfigError, parse_config
    with pytest.raises(ConfigError, match=needle):
        parse_config(f"tiers: {{up: {{kind: upstream, base_url: 'http://x/v1', model: m}}}}\nlimits: {limits}\n")
