"""/metrics of a real gateway scraped over HTTP and parsed with prometheus_client's parser after
real requests; budget rejections counted and on the span; /openapi.json lists /metrics; and
`tiergate serve` as a user runs it: spans exported over OTLP/HTTP to a receiver on loopback,
a bad OTEL_* variable ending in exit 2 with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway_harness import free_port, shared
from tests.integration.test_otlp_receiver import Receiver
from tests.telemetry_harness import (
    APP_KEY,
    LIMITED_KEY,
    UPSTREAM_TEXT,
    RecordingUpstream,
    TracedGateway,
    client_traceparent,
)

SECRET = "okapi-secret-0042"
MESSAGES = [{"role": "user", "content": f"w3 w4 {SECRET}"}]
# Labels whose values are bounded by the config or the code (no request text, no ids):
# "capability" is one of policies.needs.CAPABILITIES (or a comma list of them).
ALLOWED_LABELS = {"tier", "profile", "tenant_class", "type", "reason", "state", "le", "capability", "code"}


@pytest.fixture(scope="module")
def upstream(request):
    return shared(request, "recording-upstream", RecordingUpstream)


@pytest.fixture(scope="module")
def traced(request, tmp_path_factory, upstream):
    return shared(request, "traced-gateway",
                  lambda: TracedGateway(tmp_path_factory.mktemp("traced"), upstream))


def _scrape(gw) -> tuple[str, dict[tuple[str, frozenset], float]]:
    resp = httpx.get(f"{gw.base}/metrics", timeout=10)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return resp.text, samples


def _value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_after_real_requests(traced):
    _, before = _scrape(traced)
    client = openai.OpenAI(base_url=f"{traced.base}/v1", api_key=APP_KEY, max_retries=0)
    usages = []
    for _ in range(2):   # streamed, through the tiny engine: 8 tokens each (eos ignored)
        chunks = list(client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        usages.append(chunks[-1].usage)
    usages.append(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                                 extra_body={"ignore_eos": True}).usage)
    remote = list(client.chat.completions.create(model="remote", messages=MESSAGES, max_tokens=8, stream=True,
                                                 stream_options={"include_usage": True}))
    assert remote[-1].usage.completion_tokens == len(UPSTREAM_TEXT)
    assert [u.completion_tokens for u in usages] == [8, 8, 8]

    deadline = time.time() + 120   # request metrics are written just after the response goes out
    while True:
        text, after = _scrape(traced)
        tiny = {"tier": "tiny", "profile": "throughput", "tenant_class": "interactive"}
        done = _value(after, "gen_ai_server_request_duration_seconds_count", **tiny) - \
            _value(before, "gen_ai_server_request_duration_seconds_count", **tiny) >= 3
        if done or time.time() > deadline:
            break
        time.sleep(0.05)

    def grew(name: str, **labels) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    up = {"tier": "up", "profile": "throughput", "tenant_class": "interactive"}
    assert grew("gen_ai_server_request_duration_seconds_count", **tiny) == 3
    assert grew("gen_ai_server_request_duration_seconds_count", **up) == 1
    assert grew("gen_ai_server_time_to_first_token_seconds_count", **tiny) == 3
    assert grew("gen_ai_server_time_to_first_token_seconds_count", **up) == 1
    assert grew("gen_ai_server_time_per_output_token_seconds_count", **tiny) == 3
    assert grew("gen_ai_server_request_duration_seconds_sum", **tiny) > 0
    assert grew("tiergate_tokens_total", **tiny, type="input") == sum(u.prompt_tokens for u in usages)
    assert grew("tiergate_tokens_total", **tiny, type="output") == 24
    assert grew("tiergate_tokens_total", **up, type="output") == len(UPSTREAM_TEXT)
    assert grew("tiergate_tokens_total", **up, type="cache_read") == 3

    # Per-tier figures, read from the engine (tiny) and from the gateway's open calls (every tier).
    assert 0.0 <= _value(after, "tiergate_tier_kv_cache_usage_ratio", tier="tiny") <= 1.0
    assert ("tiergate_tier_kv_cache_usage_ratio", frozenset({("tier", "tiny")})) in after
    assert ("tiergate_tier_queue_depth", frozenset({("tier", "tiny")})) in after
    assert ("tiergate_tier_running_sequences", frozenset({("tier", "tiny")})) in after
    assert _value(after, "tiergate_tier_prefix_cache_queried_tokens_total", tier="tiny") >= \
        sum(u.prompt_tokens for u in usages)
    for tier in ("tiny", "broken", "dead", "up"):
        assert ("tiergate_tier_in_flight_requests", frozenset({("tier", tier)})) in after
        assert _value(after, "tiergate_tier_in_flight_requests", tier=tier) == 0
    assert ("tiergate_tier_kv_cache_usage_ratio", frozenset({("tier", "up")})) not in after

    # Low-cardinality labels only; no key, prompt text or request id anywhere in the exposition.
    assert {k for _, labels in after for k, _ in labels} <= ALLOWED_LABELS
    assert APP_KEY not in text and SECRET not in text and "w3 w4" not in text
    assert "chatcmpl-" not in text


def test_budget_rejection_is_counted_and_on_the_span(traced):
    _, before = _scrape(traced)
    client = openai.OpenAI(base_url=f"{traced.base}/v1", api_key=LIMITED_KEY, max_retries=0)
    first_trace, _, first_parent = client_traceparent()
    client.chat.completions.create(model="direct", messages=MESSAGES, max_tokens=4,
                                   extra_headers={"traceparent": first_parent})
    trace_id, _, traceparent = client_traceparent()
    with pytest.raises(openai.RateLimitError):   # rpm: 1 for this tenant
        client.chat.completions.create(model="direct", messages=MESSAGES, max_tokens=4,
                                       extra_headers={"traceparent": traceparent})
    server = [s for s in traced.spans_of(trace_id) if s.kind == SpanKind.SERVER]
    assert len(server) == 1
    a = server[0].attributes
    assert (a["tiergate.budget.decision"], a["tiergate.budget.reason"]) == ("reject", "rpm")
    assert a["http.response.status_code"] == 429 and a["tiergate.tenant_class"] == "trial"
    allowed = [s for s in traced.spans_of(first_trace) if s.kind == SpanKind.SERVER]
    assert allowed[0].attributes["tiergate.budget.decision"] == "allow"

    _, after = _scrape(traced)
    rejections = "tiergate_budget_rejections_total"
    assert _value(after, rejections, tenant_class="trial", reason="rpm") - \
        _value(before, rejections, tenant_class="trial", reason="rpm") == 1
    errors = "tiergate_request_errors_total"
    assert _value(after, errors, tier="none", reason="http_429") - \
        _value(before, errors, tier="none", reason="http_429") == 1


def test_requests_refused_before_routing_are_counted(traced):
    _, before = _scrape(traced)
    url = f"{traced.base}/v1/chat/completions"
    app = {"authorization": f"Bearer {APP_KEY}"}
    ask = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    statuses = [httpx.post(url, json=ask, headers={"authorization": "Bearer sk-wrong"}, timeout=10).status_code
                for _ in range(3)]
    statuses.append(httpx.post(url, content=b"{bad", headers=app, timeout=10).status_code)
    statuses.append(httpx.post(url, json={**ask, "model": "nope"}, headers=app, timeout=10).status_code)
    long_model = httpx.post(url, json={**ask, "model": "M" * 100_000}, headers=app, timeout=10)
    assert statuses == [401, 401, 401, 400, 404] and long_model.status_code == 400
    # A model id longer than any in a config is refused by the schema, and not sent back.
    assert long_model.json()["error"]["param"] == "model" and len(long_model.content) < 1000
    _, after = _scrape(traced)
    rejected = "tiergate_requests_rejected_total"
    assert {code: _value(after, rejected, code=code) - _value(before, rejected, code=code)
            for code in ("http_401", "http_400", "http_404")} == {"http_401": 3, "http_400": 2, "http_404": 1}


def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_clients_host(traced):
    resp = httpx.get(f"{traced.base}/metrics/", headers={"host": "evil.example"}, timeout=10)
    assert resp.status_code == 404 and "location" not in resp.headers
    assert resp.json()["error"]["code"] == "not_found"


def test_breaker_state_as_the_requests_saw_it(traced):
    client = openai.OpenAI(base_url=f"{traced.base}/v1", api_key=APP_KEY, max_retries=0)
    for _ in range(3):   # flaky refuses connections: two failures open its breaker (min_calls 2)
        resp = client.chat.completions.with_raw_response.create(model="flaky-first", messages=MESSAGES, max_tokens=4)
        assert resp.headers["x-tiergate-tier"] == "up"
    assert "breaker_open" in resp.headers["x-tiergate-fallbacks"]
    deadline = time.time() + 120
    while True:
        _, after = _scrape(traced)
        state = {s: _value(after, "tiergate_breaker_state", tier="flaky", state=s)
                 for s in ("closed", "open", "half_open")}
        if state["open"] == 1 or time.time() > deadline:
            break
        time.sleep(0.05)
    assert state == {"closed": 0, "open": 1, "half_open": 0}
    assert _value(after, "tiergate_breaker_state", tier="up", state="closed") == 1


def test_openapi_lists_metrics(traced):
    doc = httpx.get(f"{traced.base}/openapi.json", timeout=10).json()
    assert "/metrics" in doc["paths"] and "get" in doc["paths"]["/metrics"]


def _serve_config(tmp_path, upstream_url: str) -> str:
    path = tmp_path / "serve.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0, log_requests: false}}
telemetry: {{exporter: none, service_name: from-yaml}}
tiers:
  up: {{kind: upstream, base_url: "{upstream_url}", model: upstream-model}}
""")
    return str(path)


def _attrs(span: PbSpan) -> dict:
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


@pytest.mark.slow
def test_serve_exports_spans_over_otlp_from_the_environment(tmp_path, upstream):
    receiver = Receiver()
    port = free_port()
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base,
           "OTEL_SERVICE_NAME": "edge-test"}
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                             _serve_config(tmp_path, upstream.base_url), "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "gateway did not become ready"
            time.sleep(0.2)
        trace_id, client_span, traceparent = client_traceparent()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                               default_headers={"traceparent": traceparent})
        chunks = list(client.chat.completions.create(model="up", messages=MESSAGES, max_tokens=4, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(UPSTREAM_TEXT)
    finally:
        proc.send_signal(signal.SIGTERM)   # the lifespan's shutdown exports what is still queued
        proc.wait(timeout=60)
        receiver.close()
    spans = [(resource, span) for resource, _, span in receiver.spans()
             if int.from_bytes(span.trace_id, "big") == trace_id]
    by_kind = {span.kind: (resource, span) for resource, span in spans}
    assert len(spans) == 2 and set(by_kind) == {PbSpan.SPAN_KIND_SERVER, PbSpan.SPAN_KIND_CLIENT}
    resource, server = by_kind[PbSpan.SPAN_KIND_SERVER]
    assert resource["service.name"] == "edge-test"   # the environment wins over YAML
    assert int.from_bytes(server.parent_span_id, "big") == client_span
    _, tier = by_kind[PbSpan.SPAN_KIND_CLIENT]
    assert tier.name == "chat upstream-model" and tier.parent_span_id == server.span_id
    assert _attrs(tier)["gen_ai.usage.output_tokens"] == len(UPSTREAM_TEXT)
    sent = upstream.requests[-1]["headers"]["traceparent"].split("-")
    assert (int(sent[1], 16), sent[2]) == (trace_id, tier.span_id.hex())


def test_bad_otel_variable_ends_serve_with_exit_2(tmp_path, upstream):
    env = {**os.environ, "OTEL_TRACES_SAMPLER": "sometimes"}
    result = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config",
                             _serve_config(tmp_path, upstream.base_url), "--port", str(free_port())],
                            check=False, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tiergate: error: OTEL_TRACES_SAMPLER: 'sometimes'"), \
        result.stderr
