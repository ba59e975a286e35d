"""The request path of /v1/chat/completions and /v1/completions, in one place:

    read body -> auth -> parse -> classify -> route -> [budgets + breakers] -> tier call with
    fallback (and escalation) -> response -> [reconcile + record] -> log

Every step writes into the request's RequestContext.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from gateway.chain_walk import ChainWalk
from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.request_limits import RequestLimits, api_key_label
from gateway.runtime import Runtime, RuntimeHolder
from gateway.schema import ChatCompletionRequest, CompletionRequest, RequestBody, parse_body
from gateway.sse import SSEResponse, sse_error_event
from gateway.telemetry.request import TierAttempt, start_request
from gateway.telemetry.setup import Telemetry, build_telemetry
from gateway.tiers.base import Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from policies.classify import RequestFeatures
from policies.policy_config import PROFILES
from policies.route import RouteDecision, should_escalate

log = logging.getLogger("tiergate.requests")    # one JSON line per request
events = logging.getLogger(__name__)            # tier failures and other happenings

_BODY_MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
HINT_HEADER = "x-tiergate-profile"


class Pipeline:
    def __init__(self, holder: RuntimeHolder, telemetry: Telemetry | None = None):
        self.holder = holder
        self.telemetry = telemetry or build_telemetry(holder.current.config.telemetry)

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry (no Starlette Request/Response objects: this path is hot)."""
        response = await self.handle(scope, receive, scope["path"].endswith("/chat/completions") and "chat"
                                     or "completions")
        await response(scope, receive, send)

    async def handle(self, scope, receive, endpoint: str):
        rt = self.holder.current            # one config snapshot for the whole request
        ctx = RequestContext(uuid.uuid4().hex, endpoint)
        authorization = hint = length = traceparent = tracestate = session = guard = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-tiergate-profile":
                hint = value.decode("latin-1")
            elif name == b"content-length":
                length = value
            elif name == b"traceparent":
                traceparent = value.decode("latin-1")
            elif name == b"tracestate":
                tracestate = value.decode("latin-1")
            elif name == b"x-session-id":
                session = value.decode("latin-1")
        ctx.trace = start_request(self.telemetry, scope, traceparent, tracestate)
        try:
            raw = await _read_body(receive, length, rt.max_body_bytes)
            ctx.tenant, ctx.key_name = rt.keys.authenticate(authorization)
            body = parse_body(_BODY_MODELS[endpoint], raw)
            call = self._prepare(rt, ctx, body, hint)
            decision = rt.router.route(ctx.tenant, ctx.tenant_class, ctx.model, ctx.profile)
            ctx.chain, ctx.route_reason = decision.chain, decision.reason
            ctx.trace.routed(ctx, rt.tenant(ctx.tenant).record_content)
            # Budgets and breakers (issue #8): a permit + reservation per tier attempt, in the walk.
            guard = self._guard(rt, ctx, call, authorization, session)
            if body.stream:
                return await self._stream(rt, ctx, call, decision)
            work = self._complete(rt, ctx, call, decision)
            if any(rt.tiers[t].kind == "embedded" for t in decision.chain):
                work = _unless_client_leaves(work, receive)   # a long generation is freed at once
            _, answer = await work
            ctx.usage.add(answer.usage)       # reconciled per attempt, in the walk (issue #8)
            return BytesResponse(200, answer.body, _headers(ctx))
        except GatewayError as exc:
            ctx.status, ctx.error = exc.status, exc.message
            return BytesResponse(exc.status, exc.body_bytes(), _headers(ctx, exc.headers))
        finally:
            if guard is not None and not guard.handed_off:   # a stream's relay finishes it
                await guard.finish()
            if not ctx.stream or ctx.status != 200 or ctx.headers_at is None:
                self._finish_later(rt, ctx)

    # ---- parse, classify ---------------------------------------------------------------
    def _prepare(self, rt: Runtime, ctx: RequestContext, body: RequestBody, hint: str | None) -> TierCall:
        ctx.model, ctx.stream, ctx.user = body.model, body.stream, body.user
        if not rt.router.knows(body.model):
            raise GatewayError(404, f"The model '{body.model}' does not exist", param="model", code="model_not_found")
        tenant = rt.tenant(ctx.tenant)
        if tenant.models is not None and body.model not in tenant.models:
            raise GatewayError(404, f"The model '{body.model}' does not exist or you do not have access to it",
                               param="model", code="model_not_found")
        ctx.tenant_class, ctx.priority = tenant.tenant_class, tenant.priority
        ctx.prefix_scope = ctx.tenant if tenant.prefix_cache == "isolated" else None
        if hint is not None:
            hint = hint.strip().lower()
            if hint not in PROFILES:
                raise GatewayError(400, f"{HINT_HEADER} must be one of {', '.join(PROFILES)}", param=HINT_HEADER)
        call = TierCall(ctx, body, body.model)
        if rt.classifier.needs_prompt_tokens or rt.estimates[body.model]:
            ctx.prompt_tokens_estimate = self._count_prompt(rt, call)
        features = RequestFeatures(ctx.endpoint, body.model, ctx.tenant, ctx.tenant_class, body.stream, body.n,
                                   body.output_limit, ctx.prompt_tokens_estimate)
        verdict = rt.classifier.classify(features, hint, tenant.allow_profile_hint)
        ctx.profile, ctx.profile_source, ctx.reasons = verdict.profile, verdict.source, verdict.reasons
        return call

    def _guard(self, rt: Runtime, ctx: RequestContext, call: TierCall, authorization: str | None,
               session: str | None) -> RequestLimits:
        limits = rt.limits if rt.limits is not None else self.holder.open_limits()
        if limits.active and ctx.prompt_tokens_estimate is None:
            ctx.prompt_tokens_estimate = self._count_prompt(rt, call)    # the reservation's estimate
        key = api_key_label(ctx.key_name, authorization) if limits.keys_limited and rt.keys.enabled else None
        ctx.session_id = session
        ctx.limits_guard = RequestLimits(limits, ctx, call, key, session)
        return ctx.limits_guard

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
    async def _complete(self, rt: Runtime, ctx: RequestContext, call: TierCall,
                        decision: RouteDecision) -> tuple[Tier, TierAnswer]:
        call.want_logprobs = decision.escalate is not None
        tier, answer = await self._first_answer(rt, ctx, call, decision.chain)
        esc = decision.escalate
        if should_escalate(esc, tier.name, answer.mean_logprob):
            why = rt.usable(esc.to)
            note = f"mean logprob {answer.mean_logprob:.3f} < {esc.below_mean_logprob}"
            if why is not None:
                ctx.reasons.append(f"not escalated to {esc.to} ({note}): {why}")
                return tier, answer
            guard = ctx.limits_guard
            try:    # a second answer: its own permit and reservation (issue #8)
                skip = await guard.admit(rt.tiers[esc.to])
            except GatewayError as exc:
                skip = exc.message
            if skip is not None:
                ctx.reasons.append(f"not escalated to {esc.to} ({note}): {skip}")
                return tier, answer
            ctx.usage.add(answer.usage)   # the first answer was computed: it counts
            call.want_logprobs = False
            try:
                with ctx.trace.attempt(ctx, call, rt.tiers[esc.to]):
                    better = await self._timed(ctx, guard.bounded(rt.tiers[esc.to].complete(call)))
            except (TierFailure, TierUnfit, GatewayError) as exc:
                await guard.attempt_failed(exc)
                ctx.reasons.append(f"escalation to {esc.to} failed ({exc}); kept {tier.name}")
                answer.usage = type(answer.usage)()
                return tier, answer
            await guard.answered(better.usage)
            ctx.escalated_from, ctx.tier = tier.name, esc.to
            ctx.reasons.append(f"escalated {tier.name} -> {esc.to}: {note}")
            return rt.tiers[esc.to], better
        return tier, answer

    async def _first_answer(self, rt: Runtime, ctx: RequestContext, call: TierCall,
                            chain: tuple[str, ...]) -> tuple[Tier, TierAnswer]:
        walk = ChainWalk(rt, ctx, chain)
        while True:
            tier = await walk.next_tier()
            try:
                with ctx.trace.attempt(ctx, call, tier):
                    answer = await self._timed(ctx, ctx.limits_guard.bounded(tier.complete(call)))
            except (TierUnfit, TierFailure, GatewayError) as exc:
                await walk.failed(tier, exc)
            else:
                await ctx.limits_guard.answered(answer.usage)
                return tier, answer

    @staticmethod
    async def _timed(ctx: RequestContext, awaitable):
        started = time.perf_counter()
        try:
            return await awaitable
        finally:
            ctx.tier_seconds += time.perf_counter() - started

    async def _stream(self, rt: Runtime, ctx: RequestContext, call: TierCall,
                      decision: RouteDecision) -> SSEResponse:
        walk = ChainWalk(rt, ctx, decision.chain)
        while True:
            tier = await walk.next_tier()
            attempt = ctx.trace.attempt(ctx, call, tier)
            chunks = tier.stream(call)
            try:
                with attempt.streaming():   # a failure ends the attempt; else the relay ends it
                    # nothing sent yet: may fall back
                    first = await self._timed(ctx, ctx.limits_guard.bounded(chunks.__anext__()))
                break
            except StopAsyncIteration:
                await walk.failed(tier, TierFailure("empty stream"))
            except (TierUnfit, TierFailure, GatewayError) as exc:
                await walk.failed(tier, exc)
            await chunks.aclose()
        guard = ctx.limits_guard
        guard.handed_off = True           # the relay reconciles and records when the stream ends
        return SSEResponse(self._relay(ctx, first, chunks, attempt), _headers(ctx),
                           on_close=lambda disconnected: self._stream_closed(rt, ctx, disconnected))

    async def _relay(self, ctx: RequestContext, first: bytes, chunks, attempt: TierAttempt):
        relayed, failed = 1, False
        try:
            yield first
            async for chunk in chunks:
                relayed += 1
                yield chunk
        except (TierFailure, GatewayError) as exc:
            # Bytes already went out: no fallback now; tell the client in the stream itself.
            failed = isinstance(exc, TierFailure)
            ctx.error = str(exc)
            attempt.fail("tier_failure" if isinstance(exc, TierFailure) else "GatewayError")
            yield sse_error_event(str(exc), "server_error" if isinstance(exc, TierFailure) else None)
        except (GeneratorExit, asyncio.CancelledError):
            attempt.fail("cancelled")   # the client left
            raise
        finally:
            await chunks.aclose()   # the tier's own finally puts usage on the span first
            attempt.end()
            # Reconcile once with the usage so far (also when the client left); breaker outcome.
            await ctx.limits_guard.stream_finished(failed, ctx.usage, relayed)

    def _stream_closed(self, rt: Runtime, ctx: RequestContext, disconnected: bool) -> None:
        if disconnected:
            ctx.error = ctx.error or "client disconnected"
        ctx.limits_guard.finish_later()   # no-op unless the relay never ran (issue #8)
        ctx.finished_at = time.perf_counter()
        ctx.trace.finish(ctx, disconnected)
        self._log(rt, ctx)

    # ---- end of request -------------------------------------------------------------------
    def _finish_later(self, rt: Runtime, ctx: RequestContext) -> None:
        # The log line is written after the response went out, not on its latency path.
        ctx.finished_at = time.perf_counter()
        loop = asyncio.get_running_loop()
        loop.call_soon(ctx.trace.finish, ctx)
        loop.call_soon(self._log, rt, ctx)

    @staticmethod
    def _log(rt: Runtime, ctx: RequestContext) -> None:
        if rt.config.server.log_requests and log.isEnabledFor(logging.INFO):
            log.info("%s", json.dumps(ctx.log_fields(), separators=(",", ":")))


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


async def _read_body(receive, length: bytes | None, limit: int) -> bytes:
    too_large = GatewayError(413, f"request body is larger than {limit} bytes", code="request_too_large")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(400, "client disconnected while sending the body")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


class BytesResponse:
    """A complete JSON answer as one ASGI start + body (what Starlette's Response does, minus
    its header bookkeeping)."""

    __slots__ = ("body", "headers", "status_code")

    def __init__(self, status: int, body: bytes, headers: dict[str, str]):
        self.status_code = status
        self.body = body
        self.headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

