"""What the request pipeline records for one request: the server span, classification and
route, one tier span per tier attempt (and the fallbacks between them), and at the end the
request's metrics.

Duck-typed on the pipeline's objects, so this package still imports nothing from the rest of
the gateway:
    ctx   RequestContext: request_id, tenant_class, profile, profile_source, reasons, route_reason,
          chain, fallbacks, tier, escalated_from, status, error, usage, started / first_token_at /
          finished_at (perf_counter), and `admission` once budgets are wired (issue #8; optional)
    call  TierCall: endpoint, alias, body (the parsed OpenAI request); `span` is set here
    tier  Tier: name, kind ("embedded" | "upstream"), config, in_flight; upstreams: address, port
"""

from __future__ import annotations

import time
from typing import Any, Self

from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.setup import Telemetry
from gateway.telemetry.tracing import RequestTrace, TierSpan

# error.type of a failed tier span, and the reason of the fallback it caused.
_FALLBACK_REASONS = {"TierUnfit": "tier_unfit", "TierFailure": "tier_failure", "StopAsyncIteration": "empty_stream"}
_CANCELLED = ("GeneratorExit", "CancelledError")


def start_request(telemetry: Telemetry, scope: dict, traceparent: str | None,
                  tracestate: str | None) -> RequestTelemetry:
    """The server span of one HTTP request, child of the client's traceparent if it sent one."""
    carrier = {}
    if traceparent is not None:
        carrier["traceparent"] = traceparent
        if tracestate is not None:
            carrier["tracestate"] = tracestate
    server = scope.get("server") or (None, None)
    trace = telemetry.tracing.start_request(scope.get("method", "POST"), scope["path"], carrier,
                                            server_address=server[0], server_port=server[1])
    return RequestTelemetry(telemetry.metrics, trace)


class RequestTelemetry:
    """Held by the request's context (ctx.trace) from the first byte to the last."""

    __slots__ = ("_attempt", "_choices", "_failed", "_metrics", "_record_content", "_seen", "trace")

    def __init__(self, metrics: GatewayMetrics, trace: RequestTrace):
        self.trace = trace
        self._metrics = metrics
        self._record_content = False
        self._seen = 0                          # ctx.fallbacks entries already told to the trace
        self._failed: tuple[str, str] | None = None   # (tier, reason) of the last failed attempt
        self._choices = 1
        self._attempt: TierAttempt | None = None     # the latest tier attempt

    def routed(self, ctx: Any, record_content: bool) -> None:
        """After classification and routing; `record_content`: the tenant's opt-in."""
        self._record_content = record_content
        trace = self.trace
        if not trace.recording:
            return
        trace.classified(ctx.profile, ctx.reasons)
        trace.routed(ctx.chain[0], ctx.chain[1:])
        extra = {"tiergate.request_id": ctx.request_id, "tiergate.tenant_class": ctx.tenant_class,
                 "tiergate.profile.source": ctx.profile_source, "tiergate.route.rule": ctx.route_reason}
        trace.span.set_attributes({k: v for k, v in extra.items() if v is not None})

    def attempt(self, ctx: Any, call: Any, tier: Any) -> TierAttempt:
        """A tier span for one call to `tier`, set as `call.span` for the tier to fill in."""
        self._note_fallbacks(ctx, tier.name)
        body = call.body
        self._choices = body.n
        upstream = tier.kind == "upstream"
        span = self.trace.tier_call(
            tier=tier.name, request_model=tier.config.model if upstream else call.alias, embedded=not upstream,
            operation="chat" if call.endpoint == "chat" else "text_completion",
            server_address=getattr(tier, "address", None), server_port=getattr(tier, "port", None),
            max_tokens=body.output_limit, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            stream=body.stream, choice_count=body.n, record_content=self._record_content)
        if span.content_allowed:
            span.record_input(_input_of(call))
        call.span = span
        self._attempt = TierAttempt(self, tier, span)
        return self._attempt

    def _note_fallbacks(self, ctx: Any, to_tier: str) -> None:
        # ctx.fallbacks holds "tier: why" for each tier passed over since the last attempt:
        # the attempt that just failed, or tiers skipped without a call (not ready, breaker open,
        # the tier's budget spent).
        new = ctx.fallbacks[self._seen:]
        self._seen = len(ctx.fallbacks)
        failed, self._failed = self._failed, None
        for entry in new:
            name, _, why = entry.partition(": ")
            if failed is not None and name == failed[0]:
                reason, failed = failed[1], None
            else:
                reason = _skip_reason(why)
            self.trace.fallback_taken(name, to_tier, reason)

    def finish(self, ctx: Any, disconnected: bool = False) -> None:
        """Once, when the response is done (streams: in their close hook, disconnects included)."""
        trace, metrics = self.trace, self._metrics
        attempt = self._attempt
        if attempt is not None and attempt.open:
            # A stream closed before its relay ever ran (the client left at once): end it here.
            attempt.fail("cancelled")
            attempt.end()
        tenant_class = ctx.tenant_class or "none"
        breaker_events = getattr(ctx, "breaker_events", None)   # issue #8, when wired
        if breaker_events:
            metrics.breaker_events(breaker_events)
        decision, reason = _budget(getattr(ctx, "admission", None))
        if decision is not None:
            trace.budget(decision, reason, tenant_class=ctx.tenant_class)
            if decision == "reject":
                metrics.budget_rejected(tenant_class=tenant_class, reason=reason or "unknown")
        error_type = error_reason = None
        if disconnected:
            error_reason = "client_disconnected"
        elif ctx.status >= 400:
            error_reason = f"http_{ctx.status}"
        elif ctx.error:   # the tier failed after the first byte went out
            error_reason = error_type = "stream_error"
        if trace.recording:
            if disconnected:
                trace.span.set_attribute("tiergate.client_disconnected", True)
            if ctx.escalated_from is not None:
                trace.span.set_attribute("tiergate.escalated_from", ctx.escalated_from)
        trace.end(ctx.status, error_type)
        if ctx.profile is None:   # refused before classification (auth, bad body): no tier figures
            return
        end = ctx.finished_at or time.perf_counter()
        ttft = None if ctx.first_token_at is None else ctx.first_token_at - ctx.started
        usage = ctx.usage
        metrics.observe_request(tier=ctx.tier or "none", profile=ctx.profile, tenant_class=tenant_class,
                                duration_s=end - ctx.started, ttft_s=ttft, input_tokens=usage.prompt_tokens,
                                output_tokens=usage.completion_tokens, cache_read_tokens=usage.cached_tokens,
                                error_reason=error_reason, choices=self._choices)


class TierAttempt:
    """One call to one tier: its span and the tier's in-flight count. Ends exactly once."""

    __slots__ = ("_open", "_owner", "span", "tier")

    def __init__(self, owner: RequestTelemetry, tier: Any, span: TierSpan):
        self._owner = owner
        self.tier = tier
        self.span = span
        self._open = True
        tier.in_flight += 1

    @property
    def open(self) -> bool:
        return self._open

    def fail(self, error_type: str) -> None:
        self.span.fail(error_type)

    def end(self) -> None:
        if self._open:
            self._open = False
            self.tier.in_flight -= 1
            self.span.end()

    def _failed(self, exc_type: type[BaseException]) -> None:
        name = exc_type.__name__
        if name in _CANCELLED:   # the client left: not the tier's failure
            self.span.fail("cancelled")
            return
        reason = _FALLBACK_REASONS.get(name)
        self.span.fail(reason or name)
        if reason is not None:
            self._owner._failed = (self.tier.name, reason)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._failed(exc_type)
        self.end()

    def streaming(self) -> _UntilStreaming:
        """Around the wait for a stream's first chunk: a failure ends the attempt; success leaves
        it open for the relay, which ends it when the stream closes."""
        return _UntilStreaming(self)


class _UntilStreaming:
    __slots__ = ("attempt",)

    def __init__(self, attempt: TierAttempt):
        self.attempt = attempt

    def __enter__(self) -> TierAttempt:
        return self.attempt

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.attempt._failed(exc_type)
            self.attempt.end()


def _skip_reason(why: str) -> str:
    """A low-cardinality class of the text the router (or issue #8's admission) gave."""
    if why == "still loading" or why.startswith("failed"):
        return "not_ready"
    if "circuit breaker" in why:
        return "breaker_open"
    if "limit" in why:
        return "tier_budget"
    if why.startswith("busy"):
        return "tier_busy"
    return "skipped"


def _budget(admission: Any) -> tuple[str | None, str | None]:
    """("allow" | "reject", rejection reason) from issue #8's admission, if the request has one."""
    if admission is None or not hasattr(admission, "allowed"):
        return None, None
    if admission.allowed:
        return "allow", None
    return "reject", getattr(admission, "limit_kind", None) or getattr(admission, "reason", None)


def _input_of(call: Any) -> list[dict] | str:
    body = call.body
    if call.endpoint == "chat":
        return [{"role": m.role, "content": m.text()} for m in body.messages]
    prompts = [p for p in body.prompts() if isinstance(p, str)]   # token-id prompts have no text
    return prompts[0] if len(prompts) == 1 else [{"role": "user", "content": p} for p in prompts]
