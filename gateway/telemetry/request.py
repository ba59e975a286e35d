"""What the request pipeline records for one request: the server span, classification and
route, one tier span per tier attempt (and the fallbacks between them), and at the end the
request's metrics.

At run time it imports from the rest of the gateway only small value modules (skip reasons,
token_bounds' count of sequences); the request objects it reads (RequestContext, TierCall,
Tier) are named for type checkers only.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.context import Usage
from gateway.skips import SkipReason
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.setup import Telemetry
from gateway.telemetry.tracing import RequestTrace, TierSpan
from gateway.token_bounds import sequences
from policies.needs import CAPABILITIES

CLIENT_CLOSED = 499          # the status the gateway gives a request whose client left before its answer

if TYPE_CHECKING:
    from gateway.context import RequestContext
    from gateway.tiers.base import Tier, TierCall


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
    """One request's spans and metrics, from the first byte to the last."""

    __slots__ = ("_metrics", "_record_content", "_seen", "_sequences", "trace")

    def __init__(self, metrics: GatewayMetrics, trace: RequestTrace):
        self.trace = trace
        self._metrics = metrics
        self._record_content = False
        self._seen = 0                          # ctx.fallbacks entries already told to the trace
        self._sequences = 1                     # decoded side by side (token_bounds.sequences)

    def routed(self, ctx: RequestContext, record_content: bool) -> None:
        """After classification and routing; `record_content`: the tenant's opt-in."""
        self._record_content = record_content
        trace = self.trace
        if not trace.recording:
            return
        trace.classified(ctx.profile, ctx.reasons)
        trace.routed(ctx.chain[0], ctx.chain[1:])
        extra = {"tiergate.request_id": ctx.request_id, "tiergate.tenant_class": ctx.tenant_class,
                 "tiergate.profile.source": ctx.profile_source, "tiergate.route.rule": ctx.route_reason,
                 "tiergate.needs": sorted(ctx.needs) if ctx.needs else None}
        trace.span.set_attributes({k: v for k, v in extra.items() if v is not None})

    def tier_span(self, ctx: RequestContext, call: TierCall, tier: Tier) -> TierSpan:
        """The span of one call to `tier`, after a fallback event for each tier passed over
        since the last call (skipped without a call, or called and failed)."""
        for skip in ctx.fallbacks[self._seen:]:
            self.trace.fallback_taken(skip.tier, tier.name, skip.reason.value)
        self._seen = len(ctx.fallbacks)
        body = call.body
        self._sequences = sequences(body)
        upstream = tier.kind == "upstream"
        span = self.trace.tier_call(
            tier=tier.name, request_model=tier.config.model if upstream else call.alias, embedded=not upstream,
            operation="chat" if call.endpoint == "chat" else "text_completion",
            server_address=tier.address, server_port=tier.port,
            max_tokens=body.output_limit, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            stream=body.stream, choice_count=body.n, record_content=self._record_content)
        if span.content_allowed:
            span.record_input(_input_of(call))
        return span

    def finish(self, ctx: RequestContext, disconnected: bool = False) -> None:
        """Once, when the response is done (disconnects included), after every tier span ended."""
        trace, metrics = self.trace, self._metrics
        tenant_class = ctx.tenant_class or "none"
        if ctx.breaker_events:
            metrics.breaker_events(ctx.breaker_events)
        for skip in ctx.fallbacks:
            lacking = skip.detail.split(", ") if skip.reason == SkipReason.CAPABILITY else ()
            metrics.tier_skipped(tier=skip.tier, reason=skip.reason.value,
                                 capability=skip.detail if lacking and set(lacking) <= CAPABILITIES else "")
        admission = ctx.admission
        if admission is not None:
            if admission.allowed:
                trace.budget("allow", None, tenant_class=ctx.tenant_class)
            else:
                reason = admission.limit_kind or admission.reason
                trace.budget("reject", reason, tenant_class=ctx.tenant_class)
                metrics.budget_rejected(tenant_class=tenant_class, reason=reason or "unknown")
        cascade = ctx.cascade
        error_type = error_reason = None
        # A client that left is one outcome whether the answer was a stream cut short (its 200
        # already sent) or a whole answer never sent (the pipeline's 499): the console and the
        # log line read it off the context.
        ctx.client_disconnected = disconnected or ctx.status == CLIENT_CLOSED
        if ctx.client_disconnected:
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
            if cascade is not None:
                trace.span.set_attributes({
                    "tiergate.cascade.from": cascade.from_tier, "tiergate.cascade.to": cascade.to,
                    "tiergate.cascade.outcome": "escalated" if cascade.escalated else "kept",
                    "tiergate.cascade.signal": cascade.signal, "tiergate.cascade.score": cascade.score,
                    "tiergate.cascade.tokens": cascade.tokens})
        trace.end(ctx.status, error_type)
        if cascade is not None:
            metrics.cascade_decided(from_tier=cascade.from_tier, to_tier=cascade.to, escalated=cascade.escalated,
                                    signal=cascade.signal, score=cascade.score)
        if ctx.profile is None:   # refused before classification (auth, bad body): no tier figures
            if ctx.status >= 400:
                metrics.request_rejected(ctx.status)
            return
        end = ctx.finished_at or time.perf_counter()
        ttft = None if ctx.first_token_at is None else ctx.first_token_at - ctx.started
        # Each tier's tokens under its own name: the answering tier's with the request, the
        # others' (a cascade's first tier, a tier that failed midway) beside it.
        tier = ctx.tier or "none"
        # (No attempt's breakdown, e.g. a context built outside the pipeline: the request's usage.)
        usage = ctx.tier_usage.get(tier, ctx.usage if not ctx.tier_usage else Usage())
        metrics.observe_request(tier=tier, profile=ctx.profile, tenant_class=tenant_class,
                                duration_s=end - ctx.started, ttft_s=ttft, input_tokens=usage.prompt_tokens,
                                output_tokens=usage.completion_tokens, cache_read_tokens=usage.cached_tokens,
                                error_reason=error_reason, sequences=self._sequences)
        for other, work in ctx.tier_usage.items():
            if other != tier:
                metrics.count_tokens(tier=other, profile=ctx.profile, tenant_class=tenant_class,
                                     input_tokens=work.prompt_tokens, output_tokens=work.completion_tokens,
                                     cache_read_tokens=work.cached_tokens)


def _input_of(call: TierCall) -> list[dict] | str:
    body = call.body
    if call.endpoint == "chat":
        return [{"role": m.role, "content": m.text()} for m in body.messages]
    prompts = [p for p in body.prompts() if isinstance(p, str)]   # token-id prompts have no text
    return prompts[0] if len(prompts) == 1 else [{"role": "user", "content": p} for p in prompts]
