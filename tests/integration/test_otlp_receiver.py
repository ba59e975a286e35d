"""Spans exported by the real OTLP/HTTP (protobuf) exporter to a receiver on loopback that
decodes ExportTraceServiceRequest with opentelemetry-proto; the same receiver stands in for an
upstream tier, so the traceparent it gets is checked against the exported CLIENT span."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from gateway.telemetry.config import TelemetryConfig, resolve_telemetry
from gateway.telemetry.tracing import build_tracing

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


class Receiver:
    """OTLP/HTTP traces endpoint plus a stand-in upstream, on an ephemeral loopback port."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        self.export_headers: list[dict] = []
        self.upstream_headers: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver.exports.append(request)
                    receiver.export_headers.append({k.lower(): v for k, v in self.headers.items()})
                    self._reply(ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")
                elif self.path == "/upstream/v1/completions":
                    receiver.upstream_headers.append({k.lower(): v for k, v in self.headers.items()})
                    self._reply(b'{"id": "cmpl-1"}', "application/json")
                else:
                    self.send_error(404)

            def _reply(self, payload: bytes, content_type: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict, str, PbSpan]]:
        """(resource attributes, scope name, span) of everything received."""
        out = []
        for request in self.exports:
            for rs in request.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((resource, ss.scope.name, span) for span in ss.spans)
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind)


def _attrs(span: PbSpan) -> dict:
    return {kv.key: _value(kv.value) for kv in span.attributes}


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _request_through_upstream(tracing, upstream_url: str) -> None:
    rt = tracing.start_request("POST", "/v1/completions",
                               {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    with rt.stage("tiergate.route"):
        rt.routed("remote")
    with rt.tier_call(tier="remote", request_model="up-model", embedded=False, operation="text_completion",
                      server_address="127.0.0.1", server_port=1234, max_tokens=8) as ts:
        headers = ts.inject({"content-type": "application/json"})
        assert httpx.post(upstream_url, headers=headers, content=b"{}", timeout=5).status_code == 200
        ts.first_token()
        ts.finish(response_id="cmpl-1", finish_reasons=["stop"], input_tokens=3, output_tokens=2)
    rt.end(200)


def test_yaml_configured_otlp_exporter_delivers_the_span_tree(receiver):
    cfg = TelemetryConfig(exporter="otlp", endpoint=receiver.base, headers={"x-collector-token": "t0k"},
                          service_name="tiergate-test")
    tracing = build_tracing(resolve_telemetry(cfg, environ={}))
    _request_through_upstream(tracing, f"{receiver.base}/upstream/v1/completions")
    tracing.shutdown()  # flushes the batch processor

    assert receiver.export_headers, "no OTLP export arrived"
    assert receiver.export_headers[0]["content-type"] == "application/x-protobuf"
    assert receiver.export_headers[0]["x-collector-token"] == "t0k"
    received = receiver.spans()
    assert {res["service.name"] for res, _, _ in received} == {"tiergate-test"}
    assert {scope for _, scope, _ in received} == {"tiergate.gateway"}
    spans = {span.name: span for _, _, span in received}
    assert set(spans) == {"POST /v1/completions", "tiergate.route", "text_completion up-model"}

    server, stage, tier = spans["POST /v1/completions"], spans["tiergate.route"], spans["text_completion up-model"]
    assert {s.trace_id.hex() for s in spans.values()} == {CLIENT_TRACE}
    assert server.parent_span_id.hex() == CLIENT_SPAN and server.kind == PbSpan.SPAN_KIND_SERVER
    assert stage.parent_span_id == server.span_id and stage.kind == PbSpan.SPAN_KIND_INTERNAL
    assert tier.parent_span_id == server.span_id and tier.kind == PbSpan.SPAN_KIND_CLIENT
    attrs = _attrs(tier)
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.max_tokens"] == 8
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (3, 2)
    assert [e.name for e in tier.events] == ["tiergate.engine.first_token"]
    assert _attrs(server)["http.response.status_code"] == 200

    # The upstream received our CLIENT span as its parent, in the client's trace.
    (upstream,) = receiver.upstream_headers
    assert upstream["traceparent"] == f"00-{CLIENT_TRACE}-{tier.span_id.hex()}-01"


def test_environment_alone_configures_the_exporter(receiver):
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.base}/v1/traces",
           "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc", "OTEL_SERVICE_NAME": "from-env"}
    tracing = build_tracing(resolve_telemetry(TelemetryConfig(), environ=env))
    tracing.start_request("GET", "/v1/models", {}).end(200)
    tracing.shutdown()
    ((resource, _, span),) = receiver.spans()
    assert span.name == "GET /v1/models" and resource["service.name"] == "from-env"
    assert receiver.export_headers[0]["authorization"] == "Bearer abc"


def test_an_unreachable_collector_does_not_slow_requests(receiver, monkeypatch):
    """Export happens off the request path: requests complete while an export to a dead collector
    is stuck, and shutdown still ends. No elapsed time is asserted (a loaded machine is slow, not
    wrong); the export is held until the requests are done, so a request that waited on it
    would hang, and the deadlines below only bound how long the test waits to see that."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    dead_port = receiver.port
    receiver.close()  # nothing listens there any more
    entered, release = threading.Event(), threading.Event()
    real_export = OTLPSpanExporter.export

    def held_export(self, spans):
        entered.set()
        release.wait(120)
        return real_export(self, spans)

    monkeypatch.setattr(OTLPSpanExporter, "export", held_export)
    cfg = TelemetryConfig(exporter="otlp", endpoint=f"http://127.0.0.1:{dead_port}", timeout_s=1)
    tracing = build_tracing(resolve_telemetry(cfg, environ={}))

    def requests(n):
        for _ in range(n):
            rt = tracing.start_request("POST", "/v1/chat/completions", {})
            with rt.tier_call(tier="small", request_model="m", embedded=True) as ts:
                ts.first_token()
            rt.end(200)

    requests(1)
    flusher = threading.Thread(target=tracing.force_flush, daemon=True)
    flusher.start()
    assert entered.wait(60), "the exporter was never called"
    worker = threading.Thread(target=requests, args=(50,), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "requests waited on a stuck export"
    assert not release.is_set()
    release.set()
    closer = threading.Thread(target=tracing.shutdown, daemon=True)
    closer.start()
    closer.join(120)              # the exporter's own timeout (1 s, with retries) bounds it
    assert not closer.is_alive(), "shutdown hung on an unreachable collector"
    flusher.join(60)
