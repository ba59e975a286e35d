"""Spans of real requests through the gateway (real HTTP, the official openai client, a tiny
random Llama as the embedded tier, a recording upstream), exported into an InMemorySpanExporter:
the span tree, GenAI attributes, engine events, fallbacks, the traceparent the upstream gets,
and prompt text only for a tenant that opted in."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry.tracing import CONTENT_EVENT
from tests.gateway_harness import shared
from tests.telemetry_harness import (
    APP_KEY,
    AUDITED_KEY,
    UPSTREAM_ID,
    UPSTREAM_TEXT,
    RecordingUpstream,
    TracedGateway,
    client_traceparent,
)

SECRET = "zebra-password-4711"
MESSAGES = [{"role": "system", "content": "w5 w6"}, {"role": "user", "content": f"w7 w8 w9 {SECRET}"}]


@pytest.fixture(scope="module")
def upstream(request):
    return shared(request, "recording-upstream", RecordingUpstream)


@pytest.fixture(scope="module")
def traced(request, tmp_path_factory, upstream):
    return shared(request, "traced-gateway",
                  lambda: TracedGateway(tmp_path_factory.mktemp("traced"), upstream))


def _client(gw, traceparent: str | None = None, key: str = APP_KEY) -> openai.OpenAI:
    headers = {"traceparent": traceparent, "tracestate": "vendor=abc"} if traceparent else None
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key=key, max_retries=0, default_headers=headers)


def _stream(client, model: str, **kw) -> tuple[str, object, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=8, temperature=0, seed=3, stream=True,
        stream_options={"include_usage": True}, **kw)
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage, raw.headers["x-request-id"]


def _one(spans, kind: SpanKind):
    found = [s for s in spans if s.kind == kind]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


def _dump(spans) -> str:
    return "\n".join(s.to_json() for s in spans)


def test_streamed_embedded_request_span_tree(traced):
    trace_id, client_span, traceparent = client_traceparent()
    text, usage, request_id = _stream(_client(traced, traceparent), "tiny")
    spans = traced.spans_of(trace_id, count=2)
    assert len(spans) == 2, [s.name for s in spans]
    server, tier = _one(spans, SpanKind.SERVER), _one(spans, SpanKind.INTERNAL)

    # The server span continues the client's trace; the tier span is its child.
    assert server.name == "POST /v1/chat/completions"
    assert server.parent.span_id == client_span and server.parent.is_remote
    assert tier.parent.span_id == server.context.span_id
    sa = server.attributes
    assert sa["http.response.status_code"] == 200 and sa["http.route"] == "/v1/chat/completions"
    assert sa["tiergate.request_id"] == request_id and sa["tiergate.tenant_class"] == "interactive"
    assert sa["tiergate.profile"] in ("latency", "throughput", "memory")
    # The chain was [broken, tiny]: broken failed to load, so the request fell back to tiny.
    assert sa["tiergate.tier"] == "tiny" and tuple(sa["tiergate.route.fallbacks_taken"]) == ("tiny",)
    fallback = [e for e in server.events if e.name == "tiergate.fallback"]
    assert [(e.attributes["tiergate.fallback.from"], e.attributes["tiergate.fallback.to"],
             e.attributes["tiergate.fallback.reason"]) for e in fallback] == [("broken", "tiny", "not_ready")]
    assert server.status.status_code != StatusCode.ERROR

    # The GenAI tier span: `chat tiny`, request parameters, response and usage as the client saw them.
    assert tier.name == "chat tiny"
    ta = tier.attributes
    assert ta["gen_ai.operation.name"] == "chat" and ta["gen_ai.provider.name"] == "tiergate"
    assert ta["gen_ai.request.model"] == "tiny" and ta["tiergate.tier"] == "tiny"
    assert (ta["gen_ai.request.max_tokens"], ta["gen_ai.request.temperature"], ta["gen_ai.request.seed"]) == (8, 0, 3)
    assert ta["gen_ai.request.stream"] is True
    assert ta["gen_ai.response.id"] == f"chatcmpl-{request_id}" and ta["gen_ai.response.model"] == "tiny"
    assert ta["gen_ai.usage.input_tokens"] == usage.prompt_tokens > 0
    assert ta["gen_ai.usage.output_tokens"] == usage.completion_tokens > 0
    assert ta["gen_ai.usage.cache_read.input_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert tuple(ta["gen_ai.response.finish_reasons"]) in (("stop",), ("length",))
    assert 0 < ta["gen_ai.response.time_to_first_chunk"] < 30
    # Engine events: submitted (queued), admitted to a batch (the engine's own time), first token.
    names = [e.name for e in tier.events]
    assert names == ["tiergate.engine.queued", "tiergate.engine.scheduled", "tiergate.engine.first_token"], names
    stamps = [e.timestamp for e in tier.events]
    assert tier.start_time <= stamps[0] <= stamps[1] <= stamps[2] <= tier.end_time, stamps
    assert server.start_time <= tier.start_time and tier.end_time <= server.end_time
    # Nothing of the prompt or the answer is recorded for a tenant that did not opt in.
    dumped = _dump(spans)
    assert SECRET not in dumped and "w7 w8 w9" not in dumped and CONTENT_EVENT not in dumped
    assert APP_KEY not in dumped
    if text.strip():
        assert json.dumps(text)[1:-1] not in dumped


def test_streamed_upstream_request_passes_the_trace_on(traced, upstream):
    trace_id, _, traceparent = client_traceparent()
    seen_before = len(upstream.requests)
    text, usage, _ = _stream(_client(traced, traceparent), "remote")
    assert text == "".join(UPSTREAM_TEXT)
    spans = traced.spans_of(trace_id, count=3)
    server = _one(spans, SpanKind.SERVER)
    tiers = sorted((s for s in spans if s.kind == SpanKind.CLIENT), key=lambda s: s.start_time)
    assert [s.name for s in tiers] == ["chat nobody", "chat upstream-model"]
    dead, up = tiers
    assert all(s.parent.span_id == server.context.span_id for s in tiers)

    # The dead upstream: a CLIENT span marked failed; the request fell back to `up`.
    assert dead.status.status_code == StatusCode.ERROR and dead.attributes["error.type"] == "tier_failure"
    fallback = [e.attributes for e in server.events if e.name == "tiergate.fallback"]
    assert [(f["tiergate.fallback.from"], f["tiergate.fallback.to"], f["tiergate.fallback.reason"])
            for f in fallback] == [("dead", "up", "tier_failure")]

    ua = up.attributes
    assert ua["gen_ai.provider.name"] == "openai" and ua["gen_ai.request.model"] == "upstream-model"
    assert ua["server.address"] == "127.0.0.1" and ua["server.port"] == upstream.port
    assert ua["gen_ai.response.id"] == UPSTREAM_ID and ua["gen_ai.response.model"] == "upstream-model-served"
    assert tuple(ua["gen_ai.response.finish_reasons"]) == ("stop",)
    assert (ua["gen_ai.usage.input_tokens"], ua["gen_ai.usage.output_tokens"]) == (11, len(UPSTREAM_TEXT))
    # The span keeps the upstream's cached count; the client (an isolated tenant, the tier without
    # cache_salt: the count could be another tenant's prompt) is told 0.
    assert ua["gen_ai.usage.cache_read.input_tokens"] == 3 and usage.prompt_tokens_details.cached_tokens == 0
    assert [e.name for e in up.events] == ["tiergate.engine.first_token"]
    assert up.status.status_code != StatusCode.ERROR

    # The upstream got a traceparent naming the client's trace and the gateway's CLIENT span as parent.
    got = upstream.requests[seen_before:]
    assert len(got) == 1
    version, got_trace, got_parent, flags = got[0]["headers"]["traceparent"].split("-")
    assert (version, int(got_trace, 16), int(got_parent, 16), flags) == ("00", trace_id, up.context.span_id, "01")
    assert got[0]["headers"].get("tracestate") == "vendor=abc"
    assert APP_KEY not in json.dumps(got[0]["headers"])   # the client's key is not passed on


def test_non_streamed_upstream_answer_on_the_span(traced):
    trace_id, _, traceparent = client_traceparent()
    resp = _client(traced, traceparent).completions.create(model="remote", prompt=f"w1 w2 {SECRET}", max_tokens=5)
    assert resp.choices[0].text == "".join(UPSTREAM_TEXT)
    spans = traced.spans_of(trace_id, count=3)
    up = [s for s in spans if s.name == "text_completion upstream-model"]
    assert len(up) == 1 and up[0].kind == SpanKind.CLIENT
    a = up[0].attributes
    assert a["gen_ai.operation.name"] == "text_completion" and "gen_ai.request.stream" not in a
    assert (a["gen_ai.response.id"], a["gen_ai.usage.output_tokens"]) == (UPSTREAM_ID, len(UPSTREAM_TEXT))
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert SECRET not in _dump(spans)


def test_content_recorded_only_for_the_tenant_that_opted_in(traced):
    trace_id, _, traceparent = client_traceparent()
    text, _, _ = _stream(_client(traced, traceparent, key=AUDITED_KEY), "tiny")
    spans = traced.spans_of(trace_id, count=2)
    tier = _one(spans, SpanKind.INTERNAL)
    details = [e for e in tier.events if e.name == CONTENT_EVENT]
    assert len(details) == 1
    messages = json.loads(details[0].attributes["gen_ai.input.messages"])
    assert messages == [{"role": "system", "parts": [{"type": "text", "content": "w5 w6"}]},
                        {"role": "user", "parts": [{"type": "text", "content": f"w7 w8 w9 {SECRET}"}]}]
    output = json.loads(details[0].attributes["gen_ai.output.messages"])
    assert [o["parts"][0]["content"] for o in output] == [text]
    # Only in the tier span's content event: never in the server span.
    assert SECRET not in _one(spans, SpanKind.SERVER).to_json()


def test_untraced_gateway_still_passes_the_client_traceparent_on(tmp_path_factory, upstream):
    gw = TracedGateway(tmp_path_factory.mktemp("untraced"), upstream, traced=False)
    try:
        assert not gw.telemetry.tracing.enabled
        trace_id, client_span, traceparent = client_traceparent()
        before = len(upstream.requests)
        _stream(_client(gw, traceparent), "remote")
        got = upstream.requests[before:]
        assert len(got) == 1
        _, got_trace, got_parent, _ = got[0]["headers"]["traceparent"].split("-")
        # No span of its own is recorded: the upstream's parent is the client's span itself.
        assert (int(got_trace, 16), int(got_parent, 16)) == (trace_id, client_span)
        # And without a client traceparent nothing is invented.
        before = len(upstream.requests)
        _stream(_client(gw), "remote")
        assert "traceparent" not in upstream.requests[before]["headers"]
    finally:
        gw.stop()


def test_client_leaving_mid_stream_ends_every_span(traced):
    trace_id, _, traceparent = client_traceparent()
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 200, "ignore_eos": True, "stream": True}
    headers = {"authorization": f"Bearer {APP_KEY}", "traceparent": traceparent}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{traced.base}/v1/chat/completions",
                                                       json=body, headers=headers) as resp:
        assert resp.status_code == 200
        for _ in resp.iter_bytes():
            break   # one chunk, then hang up
    spans = traced.spans_of(trace_id, count=2)
    server, tier = _one(spans, SpanKind.SERVER), _one(spans, SpanKind.INTERNAL)
    assert server.attributes["tiergate.client_disconnected"] is True
    assert server.status.status_code != StatusCode.ERROR   # the client's doing, not a server error
    assert tier.attributes["error.type"] == "cancelled"
    assert tier.attributes["gen_ai.usage.output_tokens"] < 200
    deadline = time.time() + 120
    while traced.gw.runtime.tiers["tiny"].in_flight and time.time() < deadline:
        time.sleep(0.05)
    assert traced.gw.runtime.tiers["tiny"].in_flight == 0
