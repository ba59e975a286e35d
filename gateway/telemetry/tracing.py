"""Traces for one gateway: its own TracerProvider, the request span tree and GenAI tier spans.

Nothing here touches the OTel globals (no set_tracer_provider, no current-context use): the
gateway holds a `Tracing`, and each request a `RequestTrace` whose spans are parented
explicitly. That survives Starlette streaming, whose body runs in another task.

Span tree of one request:

    POST /v1/chat/completions            SERVER  (parent: the client's traceparent, if any)
    ├── tiergate.classify                INTERNAL  (stage(): timing of each policy step)
    ├── tiergate.route / budget / ...    INTERNAL
    └── chat SmolLM2-135M                INTERNAL for embedded tiers, CLIENT for upstreams
          events: tiergate.engine.queued, .scheduled, .first_token, .preempted,
                  .speculative (accepted/proposed), gen_ai.client.inference.operation.details
                  (content, opt-in only)

With the exporter "none" no span is recorded, but a client's traceparent still reaches the
upstreams unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from typing import IO, Any, Self

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.sdk.version import __version__ as _sdk_version
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.telemetry import content
from gateway.telemetry.config import TelemetrySettings

SCOPE = "tiergate.gateway"
CONTENT_EVENT = "gen_ai.client.inference.operation.details"
EMBEDDED_PROVIDER = "tiergate"
_PROPAGATOR = TraceContextTextMapPropagator()  # stateless: W3C traceparent + tracestate only


class Tracing:
    """One gateway's tracing: provider, sampler, exporter. Build with `build_tracing`."""

    def __init__(self, settings: TelemetrySettings, provider: TracerProvider | None):
        self.settings = settings
        self.provider = provider
        self._tracer = provider.get_tracer(SCOPE) if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start_request(self, method: str, route: str, headers: Mapping[str, str], *,
                      server_address: str | None = None, server_port: int | None = None) -> RequestTrace:
        """The SERVER span of one HTTP request, child of the client's traceparent if it sent one."""
        carrier = {k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")}
        parent = _PROPAGATOR.extract(carrier) if carrier else Context()   # no parent: a new trace
        if self._tracer is None:
            span: Span = NonRecordingSpan(_span_context_of(parent))
        else:
            attributes: dict[str, Any] = {"http.request.method": method, "http.route": route, "url.path": route}
            if server_address:
                attributes["server.address"] = server_address
            if server_port:
                attributes["server.port"] = server_port
            span = self._tracer.start_span(f"{method} {route}", context=parent, kind=SpanKind.SERVER,
                                           attributes=attributes)
        return RequestTrace(self, span)

    def _child(self, parent: Span, name: str, kind: SpanKind, attributes: Mapping[str, Any] | None) -> Span:
        if self._tracer is None or not parent.is_recording():
            # Unsampled or off: carry the parent's context so propagation still works.
            return NonRecordingSpan(parent.get_span_context())
        return self._tracer.start_span(name, context=set_span_in_context(parent), kind=kind,
                                       attributes=attributes)

    def force_flush(self, timeout_ms: int = 30_000) -> bool:
        return self.provider.force_flush(timeout_ms) if self.provider is not None else True

    def shutdown(self) -> None:
        """Export what is queued and stop the exporter; call once when the gateway stops."""
        if self.provider is not None:
            self.provider.shutdown()


def build_tracing(settings: TelemetrySettings, *, exporter: SpanExporter | None = None,
                  console_out: IO[str] | None = None) -> Tracing:
    """A Tracing for one gateway. `exporter` replaces the configured one (tests, benchmarks)."""
    if exporter is None:
        if not settings.enabled:
            return Tracing(settings, None)
        exporter = _exporter(settings, console_out)
    resource = Resource({"service.name": settings.service_name, "telemetry.sdk.name": "opentelemetry",
                         "telemetry.sdk.language": "python", "telemetry.sdk.version": _sdk_version})
    # shutdown_on_exit=False: no atexit hook per provider; the gateway's lifespan calls shutdown().
    provider = TracerProvider(sampler=make_sampler(settings), resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(settings, provider)


def make_sampler(settings: TelemetrySettings) -> Sampler:
    name, arg = settings.sampler, settings.sampler_arg
    root = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}.get(name.removeprefix("parentbased_"))
    if root is None:  # traceidratio
        root = TraceIdRatioBased(1.0 if arg is None else arg)
    return ParentBased(root) if name.startswith("parentbased_") else root


def _exporter(settings: TelemetrySettings, console_out: IO[str] | None) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter(out=console_out) if console_out is not None else ConsoleSpanExporter()
    # Imported here: it pulls in requests and protobuf, which a gateway without OTLP never needs.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.traces_endpoint, headers=dict(settings.headers),
                            timeout=settings.timeout_s)


def untraced_tier_span() -> TierSpan:
    """A TierSpan that records and propagates nothing: for tier calls made outside a request."""
    return TierSpan(NonRecordingSpan(INVALID_SPAN_CONTEXT), content_allowed=False)


def _span_context_of(context) -> SpanContext:
    return get_current_span(context).get_span_context()


class RequestTrace:
    """The spans of one request. Not thread-safe beyond what SDK spans are; end() exactly once."""

    def __init__(self, tracing: Tracing, span: Span):
        self._tracing = tracing
        self.span = span
        self.recording = span.is_recording()
        self._fallbacks_taken: list[str] = []
        self._ended = False

    @contextmanager
    def stage(self, name: str, **attributes: Any) -> Iterator[Span]:
        """A short INTERNAL child span timing one policy step, e.g. stage("tiergate.classify")."""
        span = self._tracing._child(self.span, name, SpanKind.INTERNAL, attributes or None)
        try:
            yield span
        except BaseException as exc:
            _mark_error(span, type(exc).__name__)
            raise
        finally:
            span.end()

    def classified(self, profile: str, reasons: Sequence[str] = ()) -> None:
        if self.recording:
            self.span.set_attributes({"tiergate.profile": profile, "tiergate.classify.reasons": list(reasons)})

    def routed(self, tier: str, fallbacks: Sequence[str] = ()) -> None:
        """The chosen tier and the fallback chain planned behind it."""
        if self.recording:
            self.span.set_attributes({"tiergate.tier": tier, "tiergate.route.fallbacks": list(fallbacks)})

    def fallback_taken(self, from_tier: str, to_tier: str, reason: str) -> None:
        self._fallbacks_taken.append(to_tier)
        if self.recording:
            self.span.add_event("tiergate.fallback", {"tiergate.fallback.from": from_tier,
                                                      "tiergate.fallback.to": to_tier,
                                                      "tiergate.fallback.reason": reason})
            self.span.set_attributes({"tiergate.tier": to_tier,
                                      "tiergate.route.fallbacks_taken": list(self._fallbacks_taken)})

    def budget(self, decision: str, reason: str | None = None, *, tenant_class: str | None = None) -> None:
        """decision: "allow" or "reject"; reason: the low-cardinality rejection reason."""
        if self.recording:
            attributes = {"tiergate.budget.decision": decision}
            if reason:
                attributes["tiergate.budget.reason"] = reason
            if tenant_class:
                attributes["tiergate.tenant_class"] = tenant_class
            self.span.set_attributes(attributes)

    def tier_call(self, *, tier: str, request_model: str, embedded: bool, operation: str = "chat",
                  provider: str | None = None, server_address: str | None = None,
                  server_port: int | None = None, max_tokens: int | None = None,
                  temperature: float | None = None, top_p: float | None = None, seed: int | None = None,
                  stream: bool = False, choice_count: int = 1, record_content: bool = False) -> TierSpan:
        """One call to a tier: `{operation} {request_model}`, INTERNAL if embedded else CLIENT.

        record_content: the tenant's opt-in; text is recorded only if the operator allows it too.
        """
        attributes: dict[str, Any] | None = None
        if self.recording:
            attributes = {"gen_ai.operation.name": operation,
                          "gen_ai.provider.name": provider or (EMBEDDED_PROVIDER if embedded else "openai"),
                          "gen_ai.request.model": request_model, "tiergate.tier": tier}
            optional = {"gen_ai.request.max_tokens": max_tokens, "gen_ai.request.temperature": temperature,
                        "gen_ai.request.top_p": top_p, "gen_ai.request.seed": seed,
                        "server.address": server_address, "server.port": server_port}
            attributes.update({k: v for k, v in optional.items() if v is not None})
            if stream:
                attributes["gen_ai.request.stream"] = True
            if choice_count != 1:
                attributes["gen_ai.request.choice.count"] = choice_count
        kind = SpanKind.INTERNAL if embedded else SpanKind.CLIENT
        span = self._tracing._child(self.span, f"{operation} {request_model}", kind, attributes)
        allowed = record_content and self._tracing.settings.record_content
        return TierSpan(span, content_allowed=allowed and span.is_recording(), content_permitted=allowed)

    def end(self, status_code: int, error_type: str | None = None) -> None:
        """Close the server span with the HTTP status (5xx marks it an error; 4xx does not)."""
        if self._ended:
            return
        self._ended = True
        if self.recording:
            self.span.set_attribute("http.response.status_code", status_code)
            if error_type or status_code >= 500:
                _mark_error(self.span, error_type or str(status_code))
        self.span.end()


class TierSpan:
    """The GenAI span of one tier call. Use as a context manager or call end() yourself."""

    def __init__(self, span: Span, *, content_allowed: bool, content_permitted: bool | None = None):
        self.span = span
        self.recording = span.is_recording()
        self.content_allowed = content_allowed      # text goes on this span (permitted, and it records)
        # The operator and the tenant opted in to content: what may quote the prompt (an upstream's
        # error bytes) may then reach logs and the console too, sampled or not.
        self.content_permitted = content_allowed if content_permitted is None else content_permitted
        self._start_ns = time.time_ns()
        self._input: str | None = None
        self._output: str | None = None
        self._ended = False

    def inject(self, headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
        """Write traceparent (this span as parent) and tracestate into outgoing headers."""
        # An invalid context (tracing off, no client traceparent) writes nothing.
        if self.span.get_span_context().is_valid:
            _PROPAGATOR.inject(headers, context=set_span_in_context(self.span))
        return headers

    # ---- engine events (timestamps default to now; pass the engine's own time if it has one)
    def queued(self, *, queue_depth: int | None = None, at_ns: int | None = None) -> None:
        self._event("tiergate.engine.queued", {"tiergate.engine.queue_depth": queue_depth}, at_ns)

    def scheduled(self, *, at_ns: int | None = None) -> None:
        self._event("tiergate.engine.scheduled", None, at_ns)

    def first_token(self, *, at_ns: int | None = None) -> None:
        at_ns = at_ns or time.time_ns()
        if self.recording:
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", (at_ns - self._start_ns) / 1e9)
        self._event("tiergate.engine.first_token", None, at_ns)

    def preempted(self, *, at_ns: int | None = None) -> None:
        self._event("tiergate.engine.preempted", None, at_ns)

    def speculative(self, accepted: int, proposed: int, *, at_ns: int | None = None) -> None:
        self._event("tiergate.engine.speculative", {"tiergate.spec.accepted_tokens": accepted,
                                                    "tiergate.spec.proposed_tokens": proposed}, at_ns)

    def _event(self, name: str, attributes: Mapping[str, Any] | None, at_ns: int | None) -> None:
        if self.recording:
            attrs = {k: v for k, v in attributes.items() if v is not None} if attributes else None
            self.span.add_event(name, attrs, timestamp=at_ns)

    # ---- content: kept only when allowed; never stored otherwise
    def record_input(self, messages: Sequence[Mapping[str, Any]] | str) -> None:
        if self.content_allowed:
            self._input = content.input_messages(messages)

    def record_output(self, texts: Sequence[str], finish_reasons: Sequence[str | None]) -> None:
        if self.content_allowed:
            self._output = content.output_messages(texts, finish_reasons)

    # ---- outcome
    def finish(self, *, response_id: str | None = None, response_model: str | None = None,
               finish_reasons: Sequence[str] = (), input_tokens: int | None = None,
               output_tokens: int | None = None, cache_read_tokens: int | None = None) -> None:
        """Response attributes and usage; call before end() on success."""
        if not self.recording:
            return
        values = {"gen_ai.response.id": response_id, "gen_ai.response.model": response_model,
                  "gen_ai.usage.input_tokens": input_tokens, "gen_ai.usage.output_tokens": output_tokens,
                  "gen_ai.usage.cache_read.input_tokens": cache_read_tokens}
        attributes: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        if finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = list(finish_reasons)
        self.span.set_attributes(attributes)

    def fail(self, error_type: str) -> None:
        """error_type: low-cardinality class, e.g. "timeout", "503", "EngineDeadError"."""
        if self.recording:
            _mark_error(self.span, error_type)

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.recording and (self._input is not None or self._output is not None):
            details = {}
            if self._input is not None:
                details["gen_ai.input.messages"] = self._input
            if self._output is not None:
                details["gen_ai.output.messages"] = self._output
            self.span.add_event(CONTENT_EVENT, details)
        self.span.end()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            # GeneratorExit / CancelledError: the client went away, the call did not fail on its own.
            self.fail("cancelled" if exc_type.__name__ in ("GeneratorExit", "CancelledError") else exc_type.__name__)
        self.end()


def _mark_error(span: Span, error_type: str) -> None:
    # No exception message or stack: either may quote the prompt.
    if span.is_recording():
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR))
