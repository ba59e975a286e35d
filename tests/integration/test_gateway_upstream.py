"""The gateway over real HTTP with the official openai client, in front of remote tiers:
the fake upstream (tests/fakes/upstream.py) and a closed port."""

from __future__ import annotations

import asyncio
import logging

import httpx
import openai
import pytest

from tests.fakes.upstream import ANSWER
from policies.config import hash_api_key
from tests.gateway_harness import InstantUpstream, RunningGateway, free_port, logged_request, shared

APP_KEY = "sk-app-0123456789"
BATCH_KEY = "sk-batch-9876543210"


def _config(upstream: str, dead_port: int) -> str:
    return f"""
server: {{max_body_bytes: 65536, reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(APP_KEY)}}}
    - {{tenant: batch, env: TIERGATE_TEST_BATCH_KEY}}
tenants:
  app: {{class: interactive}}
  batch: {{class: batch, allow_profile_hint: false, models: [remote]}}
tiers:
  dead: {{kind: upstream, base_url: "http://127.0.0.1:{dead_port}/v1", model: x, connect_timeout_s: 1}}
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
  tight: {{kind: upstream, base_url: "{upstream}", model: instant, max_model_len: 40}}
  running: {{kind: upstream, base_url: "{upstream}", model: instant, supports_continuous_usage: true}}
models:
  remote: {{chain: [dead, up]}}
  direct: {{chain: [up]}}
  running: {{chain: [running]}}
  tight-first: {{chain: [tight, up]}}
  tight-only: {{chain: [tight]}}
  nowhere: {{chain: [dead]}}
classification:
  rules:
    - {{name: big, profile: memory, when: {{prompt_tokens: {{gte: 100}}}}}}
routing:
  rules:
    - {{name: lat, match: {{profile: latency, model: remote}}, chain: [up]}}
"""


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("TIERGATE_TEST_BATCH_KEY", BATCH_KEY)
    upstream = shared(request, "instant-upstream", InstantUpstream)
    path = tmp_path_factory.mktemp("gw-up") / "gateway.yaml"
    path.write_text(_config(upstream.base_url, free_port()))
    server = RunningGateway(path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _client(gw, key=APP_KEY, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key=key, max_retries=0, **kw)


MSG = [{"role": "user", "content": "Say something."}]


def test_chat_sync_falls_back_past_dead_tier(gw):
    raw = _client(gw).chat.completions.with_raw_response.create(model="remote", messages=MSG, max_tokens=64)
    resp = raw.parse()
    assert resp.choices[0].message.content == ANSWER
    assert resp.usage.prompt_tokens == 2 and resp.usage.completion_tokens == len(ANSWER.split())
    assert raw.headers["x-tiergate-tier"] == "up"
    assert raw.headers["x-tiergate-fallbacks"] == "dead: tier_failure"
    assert raw.headers["x-tiergate-profile"] == "throughput"
    assert float(raw.headers["x-tiergate-overhead-ms"]) >= 0
    assert len(raw.headers["x-request-id"]) == 32


async def test_async_chat_and_completions(gw):
    client = openai.AsyncOpenAI(base_url=f"{gw.base}/v1", api_key=APP_KEY, max_retries=0)
    chat, text = await asyncio.gather(
        client.chat.completions.create(model="direct", messages=MSG, max_tokens=3, n=2),
        client.completions.create(model="direct", prompt="one two three", max_tokens=64))
    assert [c.message.content for c in chat.choices] == ["The quick brown"] * 2
    assert chat.choices[0].finish_reason == "length"
    assert text.choices[0].text == ANSWER and text.usage.prompt_tokens == 3
    await client.close()


def _running_usage_stream(gw, model: str):
    raw = _client(gw).chat.completions.with_raw_response.create(
        model=model, messages=MSG, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    return raw.parse(), raw.headers["x-request-id"]


def test_continuous_usage_is_relayed_and_counted_once(gw, caplog):
    """vLLM's continuous_usage_stats reach an upstream that supports them; every chunk's running
    usage is passed on, and only the closing usage is counted (not the sum of the running ones)."""
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    stream, request_id = _running_usage_stream(gw, "running")
    chunks = list(stream)
    words = len(ANSWER.split())
    running = [c.usage.completion_tokens for c in chunks if c.choices and c.choices[0].delta.content]
    assert running == list(range(1, words + 1))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == words
    line = logged_request(caplog, request_id)
    assert (line["prompt_tokens"], line["completion_tokens"]) == (2, words)


def test_continuous_usage_is_not_sent_to_an_upstream_that_may_refuse_it(gw, caplog):
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    stream, request_id = _running_usage_stream(gw, "direct")
    chunks = list(stream)
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-1].usage.completion_tokens == len(ANSWER.split())
    line = logged_request(caplog, request_id)
    assert line["completion_tokens"] == len(ANSWER.split())


def test_streaming_passthrough_with_and_without_usage(gw, caplog):
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    client = _client(gw)
    chunks = list(client.chat.completions.create(model="remote", messages=MSG, stream=True,
                                                 stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ANSWER
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ANSWER.split())
    raw = client.chat.completions.with_raw_response.create(model="remote", messages=MSG, stream=True)
    plain = list(raw.parse())
    assert all(c.choices for c in plain)   # the usage chunk the gateway asked for is not passed on
    line = logged_request(caplog, raw.headers["x-request-id"])    # ...but it was counted
    assert (line["prompt_tokens"], line["completion_tokens"]) == (2, len(ANSWER.split()))
    assert line["tier"] == "up" and line["stream"] is True
    assert line["fallbacks"][0].startswith("dead: tier_failure (failed: ")   # operators get the detail
    with httpx.stream("POST", f"{gw.base}/v1/completions", json={"model": "direct", "prompt": "x", "stream": True},
                      headers={"authorization": f"Bearer {APP_KEY}"}) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_auth_required(gw):
    with pytest.raises(openai.AuthenticationError) as info:
        _client(gw, key="sk-wrong-key-000").chat.completions.create(model="remote", messages=MSG)
    assert info.value.body["code"] == "invalid_api_key" and "sk-wrong" not in info.value.body["message"]
    raw = httpx.post(f"{gw.base}/v1/chat/completions", json={"model": "remote", "messages": MSG})
    assert raw.status_code == 401 and set(raw.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{gw.base}/v1/models").status_code == 401
    models = _client(gw, key=BATCH_KEY).models.list()
    assert [m.id for m in models.data] == ["remote"]   # tenants see only their models


def test_unknown_or_forbidden_model_is_404(gw):
    with pytest.raises(openai.NotFoundError) as info:
        _client(gw).chat.completions.create(model="no-such-model", messages=MSG)
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        _client(gw, key=BATCH_KEY).chat.completions.create(model="direct", messages=MSG)


@pytest.mark.parametrize("body,param", [
    (b"{not json", None),
    (b'["a list"]', None),
    (b'{"model": "remote", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', "max_tokens"),
    (b'{"model": "remote", "messages": [{"role": "user", "content": "x"}], "temperature": 5}', "temperature"),
    (b'{"model": "remote", "messages": [{"role": "robot", "content": "x"}]}', "messages[0].role"),
    (b'{"model": "remote", "messages": []}', "messages"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "remote", "messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
])
def test_bad_input_is_a_400_openai_error(gw, body, param):
    raw = httpx.post(f"{gw.base}/v1/chat/completions", content=body,
                     headers={"authorization": f"Bearer {APP_KEY}", "content-type": "application/json"})
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_oversized_body_is_413(gw):
    big = "x" * 70_000
    raw = httpx.post(f"{gw.base}/v1/chat/completions", json={"model": "remote", "messages": [
        {"role": "user", "content": big}]}, headers={"authorization": f"Bearer {APP_KEY}"})
    assert raw.status_code == 413 and raw.json()["error"]["code"] == "request_too_large"


def test_profile_hint_and_its_permission(gw):
    raw = _client(gw).chat.completions.with_raw_response.create(
        model="remote", messages=MSG, extra_headers={"x-tiergate-profile": "latency"})
    assert raw.headers["x-tiergate-profile"] == "latency"
    assert raw.headers["x-tiergate-tier"] == "up" and "x-tiergate-fallbacks" not in raw.headers   # route 'lat'
    raw = _client(gw, key=BATCH_KEY).chat.completions.with_raw_response.create(
        model="remote", messages=MSG, extra_headers={"x-tiergate-profile": "latency"})
    assert raw.headers["x-tiergate-profile"] == "throughput"
    assert "hint ignored" in raw.headers["x-tiergate-reasons"]
    with pytest.raises(openai.BadRequestError) as info:
        _client(gw).chat.completions.create(model="remote", messages=MSG, extra_headers={"x-tiergate-profile": "fast"})
    assert info.value.body["param"] == "x-tiergate-profile"


def test_long_prompt_is_memory_bound_and_skips_a_short_context_tier(gw):
    long_text = "word " * 200          # ~250 tokens by the 4-characters estimate
    raw = _client(gw).chat.completions.with_raw_response.create(
        model="tight-first", messages=[{"role": "user", "content": long_text}], max_tokens=8)
    assert raw.headers["x-tiergate-profile"] == "memory"
    assert raw.headers["x-tiergate-reasons"].startswith("rule big: prompt_tokens")
    assert raw.headers["x-tiergate-tier"] == "up" and raw.headers["x-tiergate-fallbacks"] == "tight: tier_unfit"
    with pytest.raises(openai.BadRequestError) as info:
        _client(gw).chat.completions.create(model="tight-only", messages=[{"role": "user", "content": long_text}])
    assert info.value.body["code"] == "context_length_exceeded"


def test_no_tier_left_is_503(gw):
    with pytest.raises(openai.InternalServerError) as info:
        _client(gw).chat.completions.create(model="nowhere", messages=MSG)
    assert info.value.status_code == 503 and info.value.body["code"] == "no_tier_available"
    with pytest.raises(openai.InternalServerError):
        list(_client(gw).chat.completions.create(model="nowhere", messages=MSG, stream=True))


def test_health_ready_openapi(gw):
    assert httpx.get(f"{gw.base}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{gw.base}/readyz").json()
    assert ready["status"] == "ready" and set(ready["tiers"]) == {"dead", "up", "tight", "running"}
    doc = httpx.get(f"{gw.base}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/readyz"} <= set(doc["paths"])
    chat_schema = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "stream_options", "seed", "n",
            "stop", "user"} <= set(chat_schema["properties"])
    # What the validators enforce is stated, so a schema-driven client reaches the tiers: the
    # model ids the caller may use as an enum, and the numeric bounds. Without a key the document
    # names no model (keys are on here: it would tell other tenants' model ids).
    assert gw.runtime.config.auth.enabled
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        model = doc["components"]["schemas"][request]["properties"]["model"]
        assert "enum" not in model and model["type"] == "string"
    seen = []
    for key in (APP_KEY, BATCH_KEY):        # with a key: that tenant's own model ids
        mine = httpx.get(f"{gw.base}/openapi.json", headers={"authorization": f"Bearer {key}"}).json()
        listed = {m.id for m in _client(gw, key=key).models.list()}
        for request in ("ChatCompletionRequest", "CompletionRequest"):
            assert set(mine["components"]["schemas"][request]["properties"]["model"]["enum"]) == listed
        seen.append(listed)
    assert seen[0] != seen[1]
    top_k = chat_schema["properties"]["top_k"]["anyOf"][0]
    assert (top_k["minimum"], top_k["maximum"]) == (-1, 2 ** 31 - 1)
    nf = httpx.get(f"{gw.base}/v2/nothing")
    assert nf.status_code == 404 and "error" in nf.json()
    wrong_method = httpx.delete(f"{gw.base}/v1/models")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert "GET" in wrong_method.headers["allow"]


def test_a_model_is_retrieved_as_openai_retrieves_it(gw):
    card = _client(gw).models.retrieve("direct")
    assert (card.id, card.object) == ("direct", "model")
    batch = _client(gw, key=BATCH_KEY)
    assert batch.models.retrieve("remote").id == "remote"
    # Another tenant's model and a name nobody serves get the same 404: nothing is learned.
    answers = [httpx.get(f"{gw.base}/v1/models/{name}", headers={"authorization": f"Bearer {BATCH_KEY}"})
               for name in ("direct", "nope")]
    assert [a.status_code for a in answers] == [404, 404]
    assert answers[0].json()["error"]["message"].replace("direct", "nope") == answers[1].json()["error"]["message"]
    assert answers[0].json()["error"]["code"] == "model_not_found"
    stranger = httpx.get(f"{gw.base}/v1/models/direct", headers={"authorization": "Bearer sk-wrong"})
    assert stranger.status_code == 401 and stranger.json()["error"]["code"] == "invalid_api_key"
