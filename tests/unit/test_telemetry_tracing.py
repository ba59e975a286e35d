"""Span tree and GenAI attributes of simulated requests, through the real SDK pipeline
(TracerProvider + BatchSpanProcessor) into an InMemorySpanExporter. The gateway wiring
test drives the same helpers from the app."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry.config import (
    TelemetryConfig,
    TelemetrySettings,
    resolve_telemetry,
)
from gateway.telemetry.tracing import CONTENT_EVENT, build_tracing

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_HEADERS = {"Traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=abc",
                  "authorization": "Bearer sk-secret-key"}
PROMPT_SECRET = "my password is hunter2"
COMPLETION_SECRET = "noted: hunter2"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT_SECRET}]


def traced(**settings) -> tuple:
    exporter = InMemorySpanExporter()
    tracing = build_tracing(TelemetrySettings(**settings), exporter=exporter)
    return tracing, exporter


def finished(tracing, exporter) -> list:
    assert tracing.force_flush()
    return list(exporter.get_finished_spans())


def by_name(spans, name):
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def simulate_embedded_stream(tracing, headers, *, record_content=False):
    """What the gateway does for a streamed chat request served by an embedded tier."""
    rt = tracing.start_request("POST", "/v1/chat/completions", headers, server_address="127.0.0.1",
                               server_port=8000)
    with rt.stage("tiergate.classify"):
        rt.classified("latency", ["short_prompt", "hint_header"])
    with rt.stage("tiergate.route"):
        rt.routed("small", ["large"])
    with rt.stage("tiergate.budget"):
        rt.budget("allow", tenant_class="pro")
    with rt.tier_call(tier="small", request_model="SmolLM2-135M", embedded=True, max_tokens=16,
                      temperature=0.7, top_p=0.9, seed=7, stream=True, record_content=record_content) as ts:
        ts.record_input(MESSAGES)
        ts.queued(queue_depth=2)
        ts.scheduled()
        ts.first_token()
        ts.preempted()
        ts.scheduled()
        ts.speculative(3, 4)
        ts.record_output([COMPLETION_SECRET], ["stop"])
        ts.finish(response_id="chatcmpl-1", response_model="SmolLM2-135M", finish_reasons=["stop"],
                  input_tokens=12, output_tokens=5, cache_read_tokens=8)
    rt.end(200)
    return rt


def test_streamed_request_through_an_embedded_tier():
    tracing, exporter = traced(exporter="otlp")
    simulate_embedded_stream(tracing, CLIENT_HEADERS)
    spans = finished(tracing, exporter)
    assert sorted(s.name for s in spans) == sorted(["POST /v1/chat/completions", "tiergate.classify",
                                                    "tiergate.route", "tiergate.budget", "chat SmolLM2-135M"])
    server = by_name(spans, "POST /v1/chat/completions")
    # The client's trace continues: same trace id, its span is our parent.
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert f"{server.parent.span_id:016x}" == CLIENT_SPAN and server.parent.is_remote
    assert server.kind is SpanKind.SERVER
    assert dict(server.attributes) == {
        "http.request.method": "POST", "http.route": "/v1/chat/completions", "url.path": "/v1/chat/completions",
        "server.address": "127.0.0.1", "server.port": 8000, "http.response.status_code": 200,
        "tiergate.profile": "latency", "tiergate.classify.reasons": ("short_prompt", "hint_header"),
        "tiergate.tier": "small", "tiergate.route.fallbacks": ("large",),
        "tiergate.budget.decision": "allow", "tiergate.tenant_class": "pro"}
    assert server.status.status_code is StatusCode.UNSET

    for stage in ("tiergate.classify", "tiergate.route", "tiergate.budget"):
        span = by_name(spans, stage)
        assert span.parent.span_id == server.context.span_id and span.kind is SpanKind.INTERNAL

    tier = by_name(spans, "chat SmolLM2-135M")
    assert tier.kind is SpanKind.INTERNAL
    assert tier.parent.span_id == server.context.span_id
    attrs = dict(tier.attributes)
    ttfc = attrs.pop("gen_ai.response.time_to_first_chunk")
    assert 0 <= ttfc < 5
    assert attrs == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "tiergate",
        "gen_ai.request.model": "SmolLM2-135M", "tiergate.tier": "small",
        "gen_ai.request.max_tokens": 16, "gen_ai.request.temperature": 0.7, "gen_ai.request.top_p": 0.9,
        "gen_ai.request.seed": 7, "gen_ai.request.stream": True,
        "gen_ai.response.id": "chatcmpl-1", "gen_ai.response.model": "SmolLM2-135M",
        "gen_ai.response.finish_reasons": ("stop",), "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5, "gen_ai.usage.cache_read.input_tokens": 8}
    assert [e.name for e in tier.events] == [
        "tiergate.engine.queued", "tiergate.engine.scheduled", "tiergate.engine.first_token",
        "tiergate.engine.preempted", "tiergate.engine.scheduled", "tiergate.engine.speculative"]
    assert dict(tier.events[0].attributes) == {"tiergate.engine.queue_depth": 2}
    assert dict(tier.events[-1].attributes) == {"tiergate.spec.accepted_tokens": 3,
                                                "tiergate.spec.proposed_tokens": 4}
    stamps = [e.timestamp for e in tier.events]
    assert stamps == sorted(stamps) and tier.start_time <= stamps[0] and stamps[-1] <= tier.end_time
    assert tier.status.status_code is StatusCode.UNSET
    # The API key never reaches a span.
    assert "sk-secret-key" not in _everything(spans)


def test_upstream_tier_is_a_client_span_and_carries_the_trace_on():
    tracing, exporter = traced(exporter="otlp")
    rt = tracing.start_request("POST", "/v1/completions", CLIENT_HEADERS)
    outgoing = {"content-type": "application/json"}
    with rt.tier_call(tier="remote", request_model="llama-3-8b", embedded=False, operation="text_completion",
                      server_address="10.0.0.5", server_port=8001, max_tokens=32) as ts:
        ts.inject(outgoing)
        ts.first_token()
        ts.finish(response_id="cmpl-9", response_model="meta-llama/Llama-3-8B", finish_reasons=["length"],
                  input_tokens=4, output_tokens=32)
    rt.end(200)
    spans = finished(tracing, exporter)
    tier = by_name(spans, "text_completion llama-3-8b")
    assert tier.kind is SpanKind.CLIENT
    assert tier.attributes["gen_ai.provider.name"] == "openai"
    assert tier.attributes["gen_ai.operation.name"] == "text_completion"
    assert (tier.attributes["server.address"], tier.attributes["server.port"]) == ("10.0.0.5", 8001)
    assert tier.attributes["gen_ai.response.model"] == "meta-llama/Llama-3-8B"
    assert "gen_ai.request.stream" not in tier.attributes
    # Upstream sees our CLIENT span as its parent, in the client's trace, with the client's tracestate.
    assert outgoing["traceparent"] == f"00-{CLIENT_TRACE}-{tier.context.span_id:016x}-01"
    assert outgoing["tracestate"] == "vendor=abc"


def test_fallback_after_a_failed_tier_call():
    tracing, exporter = traced(exporter="otlp")
    rt = tracing.start_request("POST", "/v1/chat/completions", {})
    rt.routed("small", ["large"])
    with pytest.raises(TimeoutError), rt.tier_call(tier="small", request_model="m-small", embedded=True):
        raise TimeoutError("upstream took too long")
    rt.fallback_taken("small", "large", "timeout")
    with rt.tier_call(tier="large", request_model="m-large", embedded=False, server_address="h", server_port=1):
        pass
    rt.end(200)
    spans = finished(tracing, exporter)
    failed, ok = by_name(spans, "chat m-small"), by_name(spans, "chat m-large")
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes["error.type"] == "TimeoutError"
    assert "upstream took too long" not in _everything(spans)  # no exception message recorded
    assert ok.status.status_code is StatusCode.UNSET
    server = by_name(spans, "POST /v1/chat/completions")
    assert server.attributes["tiergate.tier"] == "large"
    assert server.attributes["tiergate.route.fallbacks_taken"] == ("large",)
    (event,) = server.events
    assert event.name == "tiergate.fallback"
    assert dict(event.attributes) == {"tiergate.fallback.from": "small", "tiergate.fallback.to": "large",
                                      "tiergate.fallback.reason": "timeout"}


@pytest.mark.parametrize("operator, tenant", [(False, False), (False, True), (True, False), (True, True)])
def test_content_only_when_operator_and_tenant_both_opt_in(operator, tenant):
    tracing, exporter = traced(exporter="otlp", record_content=operator)
    simulate_embedded_stream(tracing, {}, record_content=tenant)
    spans = finished(tracing, exporter)
    dump = _everything(spans)
    tier = by_name(spans, "chat SmolLM2-135M")
    content_events = [e for e in tier.events if e.name == CONTENT_EVENT]
    if not (operator and tenant):
        assert content_events == []
        assert PROMPT_SECRET not in dump and COMPLETION_SECRET not in dump and "be brief" not in dump
        return
    (event,) = content_events
    assert json.loads(event.attributes["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": PROMPT_SECRET}]}]
    assert json.loads(event.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": COMPLETION_SECRET}], "finish_reason": "stop"}]


def test_tracing_off_records_nothing_but_passes_the_client_traceparent_on():
    tracing = build_tracing(resolve_telemetry(TelemetryConfig(exporter="none"), environ={}))
    assert not tracing.enabled and tracing.provider is None
    rt = tracing.start_request("POST", "/v1/chat/completions", CLIENT_HEADERS)
    assert not rt.span.is_recording()
    with rt.tier_call(tier="remote", request_model="m", embedded=False) as ts:
        assert not ts.span.is_recording()
        outgoing = ts.inject({})
    rt.end(200)
    assert outgoing == {"traceparent": CLIENT_HEADERS["Traceparent"], "tracestate": "vendor=abc"}
    # Without a client traceparent there is nothing to pass on.
    rt = tracing.start_request("POST", "/v1/chat/completions", {})
    assert rt.tier_call(tier="remote", request_model="m", embedded=False).inject({}) == {}


def test_sampling_ratio_zero_keeps_the_clients_sampled_decision():
    tracing, exporter = traced(exporter="otlp", sampler="parentbased_traceidratio", sampler_arg=0.0)
    # No client decision: ratio 0 records nothing, yet upstreams learn the trace is not sampled.
    rt = tracing.start_request("POST", "/v1/chat/completions", {})
    with rt.tier_call(tier="remote", request_model="m", embedded=False) as ts:
        outgoing = ts.inject({})
    rt.end(200)
    assert finished(tracing, exporter) == []
    assert int(outgoing["traceparent"].rsplit("-", 1)[1], 16) & 0x01 == 0  # the sampled flag is off
    # A client that sampled its trace gets our spans, whatever the local ratio.
    simulate_embedded_stream(tracing, CLIENT_HEADERS)
    assert len(finished(tracing, exporter)) == 5


def test_unsampled_client_parent_is_respected_at_ratio_one():
    tracing, exporter = traced(exporter="otlp")
    simulate_embedded_stream(tracing, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    assert finished(tracing, exporter) == []


@pytest.mark.parametrize("status, error", [(200, None), (429, None), (503, "503")])
def test_server_span_status_follows_http_semantics(status, error):
    tracing, exporter = traced(exporter="otlp")
    tracing.start_request("POST", "/v1/chat/completions", {}).end(status)
    (server,) = finished(tracing, exporter)
    assert server.attributes["http.response.status_code"] == status
    assert server.attributes.get("error.type") == error
    assert server.status.status_code is (StatusCode.ERROR if error else StatusCode.UNSET)


def test_stage_and_cancelled_call_are_marked():
    tracing, exporter = traced(exporter="otlp")
    rt = tracing.start_request("POST", "/v1/chat/completions", {})
    with pytest.raises(KeyError), rt.stage("tiergate.route"):
        raise KeyError("no tier")
    with pytest.raises(asyncio.CancelledError), rt.tier_call(tier="small", request_model="m", embedded=True):
        raise asyncio.CancelledError()
    rt.end(499)
    rt.end(200)  # a second end is ignored
    spans = finished(tracing, exporter)
    assert by_name(spans, "tiergate.route").attributes["error.type"] == "KeyError"
    assert by_name(spans, "chat m").attributes["error.type"] == "cancelled"
    assert by_name(spans, "POST /v1/chat/completions").attributes["http.response.status_code"] == 499


def test_each_gateway_has_its_own_provider_and_globals_stay_untouched():
    before = trace.get_tracer_provider()
    first, first_out = traced(exporter="otlp", service_name="a")
    second, second_out = traced(exporter="otlp", service_name="b")
    first.start_request("GET", "/a", {}).end(200)
    second.start_request("GET", "/b", {}).end(200)
    assert [s.name for s in finished(first, first_out)] == ["GET /a"]
    (b_span,) = finished(second, second_out)
    assert b_span.name == "GET /b" and b_span.resource.attributes["service.name"] == "b"
    assert trace.get_tracer_provider() is before


def test_console_exporter_prints_spans():
    out = io.StringIO()
    settings = resolve_telemetry(TelemetryConfig(exporter="console", service_name="console-test"), environ={})
    tracing = build_tracing(settings, console_out=out)
    simulate_embedded_stream(tracing, {})
    tracing.shutdown()
    text = out.getvalue()
    assert '"name": "chat SmolLM2-135M"' in text and '"service.name": "console-test"' in text
    assert PROMPT_SECRET not in text


def _everything(spans) -> str:
    """Every attribute and event of every span, as one string to search for leaks."""
    parts = []
    for s in spans:
        parts.append(s.name)
        parts.extend(f"{k}={v}" for k, v in (s.attributes or {}).items())
        for e in s.events:
            parts.append(e.name)
            parts.extend(f"{k}={v}" for k, v in (e.attributes or {}).items())
    return "\n".join(parts)


def test_fallback_reasons_are_a_small_fixed_set():
    from gateway.skips import Skip, SkipReason
    assert {r.value for r in SkipReason} == {"not_ready", "tier_busy", "breaker_open", "tier_budget", "budget", "tier_unfit",
                                             "tier_failure", "empty_stream", "pool_exhausted", "tenant_share",
                                             "capability"}
    skip = Skip("small", SkipReason.BREAKER_OPEN, "circuit breaker open (retry in 1.0s)")
    # What a client sees is the tier and the reason code; the detail is for the log line only.
    assert str(skip) == "small: breaker_open" and skip.reason == "breaker_open"
    assert skip.for_log() == "small: breaker_open (circuit breaker open (retry in 1.0s))"
