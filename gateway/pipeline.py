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

from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.runtime import Runtime, RuntimeHolder
from gateway.schema import ChatCompletionRequest, CompletionRequest, RequestBody, parse_body
from gateway.sse import SSEResponse, sse_error_event
from gateway.tiers.base import Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from policies.classify import RequestFeatures
from policies.policy_config import PROFILES
from policies.route import RouteDecision, next_candidate, should_escalate

log = logging.getLogger("tiergate.requests")    # one JSON line per request
events = logging.getLogger(__name__)            # tier failures and other happenings

_BODY_MODELS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}
HINT_HEADER = "x-tiergate-profile"


class Pipeline:
    def __init__(self, holder: RuntimeHolder):
        self.holder = holder

    async def __call__(self, scope, receive, send) -> None:
        """ASGI entry (no Starlette Request/Response objects: this path is hot)."""
        response = await self.handle(scope, receive, scope["path"].endswith("/chat/completions") and "chat"
                                     or "completions")
        await response(scope, receive, send)

    async def handle(self, scope, receive, endpoint: str):
        rt = self.holder.current            # one config snapshot for the whole request
        ctx = RequestContext(uuid.uuid4().hex, endpoint)
        authorization = hint = length = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-tiergate-profile":
                hint = value.decode("latin-1")
            elif name == b"content-length":
                length = value
        try:
            raw = await _read_body(receive, length, rt.max_body_bytes)
            ctx.tenant, ctx.key_name = rt.keys.authenticate(authorization)
            body = parse_body(_BODY_MODELS[endpoint], raw)
            call = self._prepare(rt, ctx, body, hint)
            decision = rt.router.route(ctx.tenant, ctx.tenant_class, ctx.model, ctx.profile)
            ctx.chain, ctx.route_reason = decision.chain, decision.reason
            # ---- budgets.reserve(ctx) and breaker.allow(tier) go here (issue #8) ----------
            if body.stream:
                return await self._stream(rt, ctx, call, decision)
            work = self._complete(rt, ctx, call, decision)
            if any(rt.tiers[t].kind == "embedded" for t in decision.chain):
                work = _unless_client_leaves(work, receive)   # a long generation is freed at once
            _, answer = await work
            ctx.usage.add(answer.usage)
            # ---- budgets.reconcile(ctx.usage) and breaker.record(...) go here (issue #8) --
            return BytesResponse(200, answer.body, ctx.response_headers())
        except GatewayError as exc:
            ctx.status, ctx.error = exc.status, exc.message
            return BytesResponse(exc.status, exc.body_bytes(), ctx.response_headers())
        finally:
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
            ctx.usage.add(answer.usage)   # the first answer was computed: it counts
            call.want_logprobs = False
            try:
                better = await self._timed(ctx, rt.tiers[esc.to].complete(call))
            except (TierFailure, TierUnfit) as exc:
                ctx.reasons.append(f"escalation to {esc.to} failed ({exc}); kept {tier.name}")
                answer.usage = type(answer.usage)()
                return tier, answer
            ctx.escalated_from, ctx.tier = tier.name, esc.to
            ctx.reasons.append(f"escalated {tier.name} -> {esc.to}: {note}")
            return rt.tiers[esc.to], better
        return tier, answer

    async def _first_answer(self, rt: Runtime, ctx: RequestContext, call: TierCall,
                            chain: tuple[str, ...]) -> tuple[Tier, TierAnswer]:
        index, unfit = 0, None
        while True:
            index, skipped = next_candidate(chain, index, rt.usable)
            ctx.fallbacks.extend(skipped)
            if index == len(chain):
                raise _nothing_left(chain, unfit)
            tier = rt.tiers[chain[index]]
            ctx.tier = tier.name
            try:
                return tier, await self._timed(ctx, tier.complete(call))
            except TierUnfit as exc:
                unfit = exc
                ctx.fallbacks.append(f"{tier.name}: {exc}")
            except TierFailure as exc:     # breaker.record(tier, failure) belongs here (issue #8)
                ctx.fallbacks.append(f"{tier.name}: failed: {exc}")
                events.warning("tier %s failed for %s: %s", tier.name, ctx.request_id, exc)
            index += 1

    @staticmethod
    async def _timed(ctx: RequestContext, awaitable):
        started = time.perf_counter()
        try:
            return await awaitable
        finally:
            ctx.tier_seconds += time.perf_counter() - started

    async def _stream(self, rt: Runtime, ctx: RequestContext, call: TierCall,
                      decision: RouteDecision) -> SSEResponse:
        chain, index, unfit = decision.chain, 0, None
        while True:
            index, skipped = next_candidate(chain, index, rt.usable)
            ctx.fallbacks.extend(skipped)
            if index == len(chain):
                raise _nothing_left(chain, unfit)
            tier = rt.tiers[chain[index]]
            ctx.tier = tier.name
            chunks = tier.stream(call)
            try:
                first = await self._timed(ctx, chunks.__anext__())   # nothing sent yet: may fall back
                break
            except TierUnfit as exc:
                unfit = exc
                ctx.fallbacks.append(f"{tier.name}: {exc}")
            except (TierFailure, StopAsyncIteration) as exc:   # breaker.record(tier, failure) here too
                ctx.fallbacks.append(f"{tier.name}: failed: {exc or 'empty stream'}")
                events.warning("tier %s failed for %s: %s", tier.name, ctx.request_id, exc)
            await chunks.aclose()
            index += 1
        return SSEResponse(self._relay(ctx, first, chunks), ctx.response_headers(),
                           on_close=lambda disconnected: self._stream_closed(rt, ctx, disconnected))

    async def _relay(self, ctx: RequestContext, first: bytes, chunks):
        yield first
        try:
            async for chunk in chunks:
                yield chunk
        except (TierFailure, GatewayError) as exc:
            # Bytes already went out: no fallback now; tell the client in the stream itself.
            ctx.error = str(exc)
            yield sse_error_event(str(exc), "server_error" if isinstance(exc, TierFailure) else None)
        finally:
            await chunks.aclose()

    def _stream_closed(self, rt: Runtime, ctx: RequestContext, disconnected: bool) -> None:
        if disconnected:
            ctx.error = ctx.error or "client disconnected"
        # ---- budgets.reconcile(ctx.usage) and breaker.record(...) go here (issue #8) ------
        ctx.finished_at = time.perf_counter()
        self._log(rt, ctx)

    # ---- end of request -------------------------------------------------------------------
    def _finish_later(self, rt: Runtime, ctx: RequestContext) -> None:
        # The log line is written after the response went out, not on its latency path.
        ctx.finished_at = time.perf_counter()
        asyncio.get_running_loop().call_soon(self._log, rt, ctx)

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


def _nothing_left(chain: tuple[str, ...], unfit: TierUnfit | None) -> GatewayError:
    if unfit is not None:
        return unfit.error
    return GatewayError(503, f"no tier could serve the request (tried {', '.join(chain)})",
                        type_="server_error", code="no_tier_available")


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
