"""The request path of /v1/chat/completions and /v1/completions, in one place:

    auth (from the headers) -> read body -> parse -> cap choices -> classify -> route -> walk the
    chain, one Attempt per tier call (breaker permit + budget reservation + tier span), a
    cascade's gate judging the first tier's first tokens before any is sent (escalated: walk
    the target tier instead) -> response
    -> the request's end (Pipeline._end): limits, spans, metrics, log line

Every step writes into the request's RequestContext.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gateway.attempt import CANCELLED, Attempt
from gateway.cache_salt import PrefixScopes
from gateway.cascade_gate import CascadeGate, Escalate
from gateway.chain_walk import ChainWalk
from gateway.context import RequestContext
from gateway.errors import GatewayError, unknown_model
from gateway.request_body import CLOSE, OFF_LOOP_BYTES, check_choices, parse_request, read_body
from gateway.request_limits import RequestLimits, api_key_label
from gateway.runtime import Runtime, RuntimeHolder
from gateway.schema import ChatCompletionRequest, CompletionRequest, RequestBody
from gateway.skips import SkipReason
from gateway.sse import SSEResponse, is_done_event, sse_error_event
from gateway.telemetry.request import RequestTelemetry, start_request
from gateway.telemetry.setup import Telemetry, build_telemetry
from gateway.tiers.base import TierAnswer, TierCall, TierFailure
from gateway.token_bounds import prompt_count
from policies.breakers import Outcome
from policies.classify import RequestFeatures
from policies.policy_config import PROFILES
from policies.language_signal import language_signal
from policies.request_signals import code_signal, prompt_window
from policies.route import RouteDecision

log = logging.getLogger("tiergate.requests")    # one JSON line per request

_BODY_MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
HINT_HEADER = "x-tiergate-profile"


class _Head:
    """The request headers the pipeline reads, taken in one pass."""

    __slots__ = ("authorization", "hint", "length", "session", "traceparent", "tracestate")

    def __init__(self, headers) -> None:
        self.authorization = self.hint = self.length = self.session = self.traceparent = self.tracestate = None
        for name, value in headers:
            if name == b"authorization":
                self.authorization = value.decode("latin-1")
            elif name == b"x-tiergate-profile":
                self.hint = value.decode("latin-1")
            elif name == b"content-length":
                self.length = value
            elif name == b"traceparent":
                self.traceparent = value.decode("latin-1")
            elif name == b"tracestate":
                self.tracestate = value.decode("latin-1")
            elif name == b"x-session-id":
                self.session = value.decode("latin-1")


@dataclass(slots=True)
class _Request:
    """What the end of one request needs: its context, its telemetry and, once it is routed,
    its limits (which hold the attempt still open, if any)."""

    ctx: RequestContext
    trace: RequestTelemetry
    limits: RequestLimits | None = None


class Pipeline:
    def __init__(self, holder: RuntimeHolder, telemetry: Telemetry | None = None):
        self.holder = holder
        self.telemetry = telemetry or build_telemetry(holder.current.config.telemetry)
        # Lives as long as the app, so a reload keeps every tenant's cached prefixes reachable.
        self.prefix_scopes = PrefixScopes()
        # Called with (runtime, context, limits or None) once a request has ended (the console's
        # recorder): in-memory work only, it runs before the connection takes its next request.
        self.on_end: list[Callable[[Runtime, RequestContext, RequestLimits | None], None]] = []

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry (no Starlette Request/Response objects: this path is hot)."""
        rt = self.holder.current            # one config snapshot for the whole request
        endpoint = "chat" if scope["path"].endswith("/chat/completions") else "completions"
        head = _Head(scope["headers"])
        request = _Request(RequestContext(uuid.uuid4().hex, endpoint),
                           start_request(self.telemetry, scope, head.traceparent, head.tracestate))
        disconnected = False
        try:
            response = await self._respond(rt, request, head, receive)
            await response(scope, receive, send)
            disconnected = response.disconnected
        finally:
            await self._end(rt, request, disconnected)

    async def _respond(self, rt: Runtime, request: _Request, head: _Head, receive) -> BytesResponse | SSEResponse:
        ctx = request.ctx
        unread = True
        try:
            # The key first: a stranger's body is never read, let alone parsed.
            ctx.tenant, ctx.key_name = rt.keys.authenticate(head.authorization)
            raw = await read_body(receive, head.length, rt.max_body_bytes, rt.config.server.body_timeout_s)
            unread = False
            body = await parse_request(_BODY_MODELS[ctx.endpoint], raw)
            check_choices(body, rt.config.server.max_choices_per_request)
            call = await self._prepare(rt, ctx, body, head.hint, len(raw) > OFF_LOOP_BYTES)
            decision = rt.router.route(ctx.tenant, ctx.tenant_class, ctx.model, ctx.profile, ctx.needs)
            ctx.chain, ctx.route_reason = decision.chain, decision.reason
            request.limits = limits = self._limits(rt, ctx, call, request.trace, head)
            if decision.cascade is not None:
                call.gate = _cascade_gate(rt, limits, body, decision)
            request.trace.routed(ctx, rt.tenant(ctx.tenant).record_content)
            # A client that leaves frees its generation at once: an engine's sequence is aborted,
            # an upstream's connection closed (which stops its generation), and the request's
            # connection share, concurrency slot and breaker probe are given back. A stream is
            # watched so until its first chunk (queued, prefilling, a whole beam search); then
            # its response watches the connection itself.
            if body.stream:
                return await _unless_client_leaves(self._stream(rt, limits, call, decision), receive)
            answer = await _unless_client_leaves(self._complete(rt, limits, call, decision), receive)
            return BytesResponse(200, answer.body, _headers(ctx))
        except GatewayError as exc:
            ctx.status, ctx.error = exc.status, exc.message
            extra = {**(exc.headers or {}), **CLOSE} if unread else exc.headers
            return BytesResponse(exc.status, exc.body_bytes(), _headers(ctx, extra))

    # ---- parse, classify ---------------------------------------------------------------
    async def _prepare(self, rt: Runtime, ctx: RequestContext, body: RequestBody, hint: str | None,
                       big: bool = False) -> TierCall:
        """`big`: the body is big enough that counting its prompt tokens (chat template + BPE) runs
        in a worker thread, off the event loop; the count is then always taken here."""
        ctx.model, ctx.stream, ctx.user = body.model, body.stream, body.user
        tenant = rt.tenant(ctx.tenant)
        if not rt.router.knows(body.model) or tenant.models is not None and body.model not in tenant.models:
            raise unknown_model(body.model)
        ctx.tenant_class, ctx.priority = tenant.tenant_class, tenant.priority
        ctx.prefix_scope = self.prefix_scopes.scope(rt.config.server.prefix_cache_secret(), ctx.tenant,
                                                    tenant.prefix_cache, body.cache_salt)
        # Even a `shared` tenant would learn an isolated one's prompts from an unsalted upstream.
        ctx.prefix_private = rt.config.auth.enabled or body.cache_salt is not None
        if hint is not None:
            hint = hint.strip().lower()
            if hint not in PROFILES:
                raise GatewayError(400, f"{HINT_HEADER} must be one of {', '.join(PROFILES)}", param=HINT_HEADER)
        call = TierCall(ctx, body, body.model)
        if big:
            ctx.prompt_tokens_estimate = await asyncio.to_thread(self._count_prompt, rt, call)
        elif rt.classifier.needs_prompt_tokens or rt.estimates[body.model]:
            ctx.prompt_tokens_estimate = self._count_prompt(rt, call)
        chat = isinstance(body, ChatCompletionRequest)
        wants_gain = rt.classifier.gain_model is not None
        text = _prompt_text(body) if rt.wants_code_signal or rt.wants_language_signal or wants_gain else ""
        # one run of the code detector serves the rules and the gain model (one of its features)
        code = code_signal(text) if rt.wants_code_signal or wants_gain else None
        language = language_signal(text) if rt.wants_language_signal else None
        features = RequestFeatures(ctx.endpoint, body.model, ctx.tenant, ctx.tenant_class, body.stream, body.n,
                                   body.output_limit, ctx.prompt_tokens_estimate, code, language,
                                   tools=chat and bool(body.tools), json_schema=_wants_json(body),
                                   logprobs=body.logprobs is not None and body.logprobs is not False,
                                   predicted_gain=rt.classifier.predict_gain(text, code) if wants_gain else None)
        ctx.text_gain = features.predicted_gain
        verdict = rt.classifier.classify(features, hint, tenant.allow_profile_hint)
        ctx.profile, ctx.profile_source, ctx.reasons = verdict.profile, verdict.source, verdict.reasons
        ctx.needs = verdict.needs
        return call

    def _limits(self, rt: Runtime, ctx: RequestContext, call: TierCall, trace: RequestTelemetry,
                head: _Head) -> RequestLimits:
        limits = rt.limits if rt.limits is not None else self.holder.open_limits()
        if limits.active and ctx.prompt_tokens_estimate is None:
            ctx.prompt_tokens_estimate = self._count_prompt(rt, call)    # the reservation's estimate
        key = api_key_label(ctx.key_name, head.authorization) if limits.keys_limited and rt.keys.enabled else None
        return RequestLimits(limits, ctx, call, trace, key, head.session)

    @staticmethod
    def _count_prompt(rt: Runtime, call: TierCall) -> int:
        """Tokens by the first loaded embedded tier that may serve the model (its ids are kept
        for the tier call); else an estimate of 4 characters per token."""
        for name in rt.counters[call.alias]:
            tier = rt.tiers[name]
            if tier.ready:
                return tier.count_prompt_tokens(call)
        body = call.body
        if isinstance(body, ChatCompletionRequest):
            chars = sum(len(m.text()) for m in body.messages)
        else:
            chars = sum(len(p) if isinstance(p, str) else 4 * len(p) for p in body.prompts())
        return chars // 4 + 1

    # ---- tier calls ----------------------------------------------------------------------
    async def _complete(self, rt: Runtime, limits: RequestLimits, call: TierCall,
                        decision: RouteDecision) -> TierAnswer:
        try:
            _, answer = await ChainWalk(rt, limits, decision.chain, overflow=_overflow(decision)).complete(call)
        except Escalate as escalated:
            _, answer = await ChainWalk(rt, limits, _escalated_chain(escalated), escalation=True).complete(call)
            _note_escalation(limits.ctx, escalated)
        return answer

    async def _stream(self, rt: Runtime, limits: RequestLimits, call: TierCall,
                      decision: RouteDecision) -> SSEResponse:
        ctx = limits.ctx
        try:
            attempt, chunks, held = await ChainWalk(rt, limits, decision.chain, overflow=_overflow(decision)).stream(call)
        except Escalate as escalated:
            ctx.first_token_at = None      # the client's first token is the target tier's
            attempt, chunks, held = await ChainWalk(rt, limits, _escalated_chain(escalated), escalation=True).stream(call)
            _note_escalation(ctx, escalated)
        else:
            if len(held) > 1:              # held back while the gate judged: the client sees them now
                attempt.tier_first_token_at, ctx.first_token_at = ctx.first_token_at, time.perf_counter()
        return SSEResponse(_relay(ctx, attempt, held, chunks), _headers(ctx), attempt.tier.client_write_timeout_s)

    # ---- end of request -------------------------------------------------------------------
    async def _end(self, rt: Runtime, request: _Request, disconnected: bool) -> None:
        """The one place a request ends, once its response went out (or could not): an attempt
        still open is given back and the request leaves its limits, then its spans end, its
        metrics are counted and its log line is written (off the response's latency path)."""
        ctx = request.ctx
        try:
            if request.limits is not None:
                await request.limits.finish()
        finally:
            if disconnected:
                ctx.error = ctx.error or "client disconnected"
            ctx.finished_at = time.perf_counter()
            request.trace.finish(ctx, disconnected)
            for observer in self.on_end:
                try:
                    observer(rt, ctx, request.limits)
                except Exception:  # noqa: BLE001 - an observer's bug must not fail the request's end
                    log.warning("request observer failed", exc_info=True)
            if rt.config.server.log_requests and log.isEnabledFor(logging.INFO):
                log.info("%s", json.dumps(ctx.log_fields(), separators=(",", ":")))


def _cascade_gate(rt: Runtime, limits: RequestLimits, body, decision: RouteDecision) -> CascadeGate | None:
    """The request's cascade gate; None (with the reason why) where it cannot judge the request:
    the first tokens of several choices are not one answer's start, and a beam search has none."""
    ctx = limits.ctx
    choices = body.n * prompt_count(body)
    if choices > 1:
        ctx.reasons.append(f"cascade off: {choices} choices")
        return None
    if body.beam_search:
        ctx.reasons.append("cascade off: beam search")     # it samples no first token to judge
        return None
    breakers = limits.limits.breakers

    def unusable(name: str) -> str | None:
        """Why the cascade must not hand the request to `name` now: an escalation aborts the
        first tier's call, so a target that would turn it away (loading, at its in-flight
        limit, its breaker refusing calls) leaves the request where it is."""
        why = rt.unusable_reason(name)
        if why is not None:
            return why
        tier = rt.tiers[name]
        if tier.busy:
            return f"busy ({tier.in_flight} calls in flight)"
        refusing = breakers.known_refusing(name)
        return None if refusing is None else f"circuit breaker open (retry in {refusing:.1f}s)"
    if decision.cascade.reads_prefill:
        return CascadeGate(decision.cascade, ctx, unusable, rt.classifier.gain_model, ctx.text_gain)
    return CascadeGate(decision.cascade, ctx, unusable)


def _overflow(decision: RouteDecision) -> str | None:
    """Where a request too long for the route's chain may go: its cascade's target."""
    return decision.cascade.to if decision.cascade is not None else None


def _escalated_chain(escalated: Escalate) -> tuple[str, ...]:
    """The target tier, as if the request had been routed there; the first tier after it (answering
    without a gate) in case the target cannot take the call after all."""
    verdict = escalated.verdict
    return (verdict.to, verdict.from_tier)


def _note_escalation(ctx: RequestContext, escalated: Escalate) -> None:
    verdict = escalated.verdict
    if ctx.tier == verdict.to:
        ctx.escalated_from = verdict.from_tier
    else:
        ctx.reasons.append(f"cascade target {verdict.to} could not answer: answered by {ctx.tier}")


def _prompt_text(body) -> str:
    """What the code detector reads: the messages' (or prompts') text, its first and last
    kilobytes only (policies/request_signals.py)."""
    if isinstance(body, ChatCompletionRequest):
        return prompt_window([m.text() for m in body.messages])
    return prompt_window([p for p in body.prompts() if isinstance(p, str)])


def _wants_json(body) -> bool:
    """Structured output asked for (response_format json_object / json_schema): a capability."""
    fmt = (body.model_extra or {}).get("response_format")
    return isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")


async def _relay(ctx: RequestContext, attempt: Attempt, held: list[bytes], chunks):
    """The stream to the client: the chunks read before it started (the first, or all that a
    cascade held back), then the rest; ends the attempt when it closes."""
    relayed, outcome, error_type = len(held), Outcome.SUCCESS, None
    last = b""           # the last chunk yielded: [DONE] there makes a close the end of a whole answer
    started = time.perf_counter()
    deadline = attempt.request.deadline
    ends_at, clock = deadline.at, deadline.clock     # read per chunk: one clock call, no property
    try:
        for chunk in held:
            yield chunk
            last = chunk
        while True:
            # The deadline bounds a stream's whole time too (the budgets' reservation TTL is set
            # past it), a tier gone quiet included: each wait for a chunk is timed by what is
            # left (a timer cannot span the generator's yields, which run in the client's time).
            left = ends_at - clock()
            if left <= 0:
                raise _StreamDeadline(attempt.request.deadline_error())
            try:
                async with asyncio.timeout(left) as scope:
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            except TimeoutError:
                if not scope.expired():
                    raise
                raise _StreamDeadline(attempt.request.deadline_error()) from None
            relayed += 1
            yield chunk
            last = chunk
    except _StreamDeadline as cut:
        error = cut.error
        ctx.error, outcome, error_type = error.message, Outcome.CANCELLED, type(error).__name__
        yield sse_error_event(error.message, error.type, error.param, error.code)
    except (TierFailure, GatewayError) as exc:
        # Bytes already went out: no fallback now; tell the client in the stream itself.
        failed = isinstance(exc, TierFailure)
        ctx.error = str(exc)
        if failed:
            outcome, error_type = Outcome.FAILURE, SkipReason.TIER_FAILURE.value
        else:
            error_type = type(exc).__name__
        told = exc.error if failed else exc       # a tier's failure may carry the client's error
        if told is None:
            yield sse_error_event(str(exc), "server_error")
        else:
            yield sse_error_event(told.message, told.type, told.param, told.code)
    except (GeneratorExit, asyncio.CancelledError):
        if not is_done_event(last):
            error_type = CANCELLED   # the client left: not the tier's failure
        raise
    finally:
        # Relaying waits on the tier's tokens and the client's reads: not the gateway's overhead.
        ctx.tier_seconds += time.perf_counter() - started
        await chunks.aclose()   # the tier's own finally puts usage on the span first
        # Reconciled once with the usage so far (also when the client left).
        await attempt.end(outcome, ctx.usage, relayed, error_type=error_type)


class _StreamDeadline(Exception):
    """The request's deadline passed while its stream was relayed (not the tier's failure)."""

    def __init__(self, error: GatewayError):
        super().__init__(error.message)
        self.error = error


async def _unless_client_leaves(work, receive):
    """Run `work`; if the client disconnects first, cancel it (engine requests are aborted)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise GatewayError(499, "client disconnected before the answer was ready", code="client_closed_request")
    return task.result()


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _headers(ctx: RequestContext, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The context's headers plus x-ratelimit-* of the admitted attempt and an error's own."""
    headers = ctx.response_headers()
    if ctx.ratelimit_headers:
        headers.update(ctx.ratelimit_headers)
    if extra:
        headers.update(extra)
    return headers


class BytesResponse:
    """A complete JSON answer as one ASGI start + body (what Starlette's Response does, minus
    its header bookkeeping)."""

    __slots__ = ("body", "headers", "status_code")
    disconnected = False     # a whole answer is sent or not; a client that left is a 499 before it

    def __init__(self, status: int, body: bytes, headers: dict[str, str]):
        self.status_code = status
        self.body = body
        self.headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

