"""A remote OpenAI-compatible tier (vLLM, SGLang, another tiergate) over a pooled httpx transport.

Requests are httpx.Request objects handed straight to the transport (tiergate's lean
HTTP/1.1 pool, or httpx's own httpcore transport): httpx.AsyncClient's per-request layer
(auth flows, cookies, redirects, URL merging) costs ~0.3 ms of CPU and does nothing here.
Bodies pass through: the request goes out with the upstream's model name and the body fields
the tier accepts (the rest rejected or dropped, per its config); the answer comes back byte for
byte, read defensively (upstream_answers.py; a stream event by event, each checked before it is
relayed, upstream_stream.py) to count usage (and, for a cascade judging a whole
answer, its first tokens' logprobs; an upstream stream is not judged: its logprobs would have
to be asked for the whole stream and stripped from every event). Upstream 4xx answers are the client's problem and go back in OpenAI form; connection
errors, timeouts, 429, 5xx, any other status that is not 2xx (3xx included: redirects are not
followed), malformed or oversized answers and streams cut before their end are tier failures,
whose details (the upstream's address without credentials, what it sent) reach logs and spans,
never the client.

Connections: each tenant holds at most its share of the tier's pool; a call that finds no free
connection in time is the gateway's own overload (upstream_errors.TierOverloaded), not the
tier's failure.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator

import httpx
from pydantic_core import to_json

from gateway.cache_salt import set_upstream_cache_salt
from gateway.errors import GatewayError
from gateway.schema import ChatCompletionRequest
from gateway.cascade_gate import Escalate
from gateway.tiers.base import NO_TOKEN_SIGNALS, Tier, TierAnswer, TierCall, TierUnfit
from gateway.tiers.http_pool import PooledTransport
from gateway.tiers.tenant_shares import TenantShares
from gateway.tiers.upstream_answers import (
    AnswerFacts,
    answer_logprobs,
    ascii_json,
    hide_cached_tokens,
    read_answer,
    read_usage,
    strip_logprobs,
)
from gateway.tiers.upstream_errors import UpstreamFailure, client_error_for, pool_exhausted, tenant_share_exceeded
from gateway.tiers.upstream_replies import client_error, failure_code, read_capped
from gateway.tiers.upstream_stream import StreamReader
from gateway.token_bounds import prompt_count
from policies.tier_config import UpstreamTierConfig
from policies.url_check import shown_url

log = logging.getLogger("gateway.upstream")

_PATHS = {"chat": "/chat/completions", "completions": "/completions"}
_CLIENT_ERRORS = (400, 413, 422)
_ANSWER_SIGNALS = frozenset({"mean_logprob"})    # what a whole answer's logprobs give a cascade
ERROR_BODY_LIMIT = 64 * 1024      # an error answer longer than this is not one to pass on


class UpstreamTier(Tier):
    kind = "upstream"

    def __init__(self, name: str, config: UpstreamTierConfig):
        super().__init__(name, config)
        self.transport: httpx.AsyncBaseTransport | None = None
        self.shown_url = shown_url(config.base_url)      # what logs and /readyz show of it
        self._urls = {endpoint: httpx.URL(config.base_url + path) for endpoint, path in _PATHS.items()}
        base = httpx.URL(config.base_url)
        self.address, self.port = base.host, base.port or (443 if base.scheme == "https" else 80)  # for spans
        self.client_write_timeout_s = config.client_write_timeout_s
        self._headers = [(b"content-type", b"application/json"), (b"accept", b"*/*"),
                         (b"user-agent", b"tiergate")]
        key = config.api_key()
        if key:
            self._headers.append((b"authorization", f"Bearer {key}".encode()))
        self._timeouts = {"connect": config.connect_timeout_s, "read": config.read_timeout_s,
                          "write": config.read_timeout_s, "pool": config.pool_timeout_s}
        share = max(1, math.ceil(config.tenant_share * config.max_connections))
        self.shares = TenantShares(share, config.pool_timeout_s) if share < config.max_connections else None
        self._extra_fields = frozenset(config.extra_body_fields)

    async def start(self) -> None:
        cfg = self.config
        if cfg.transport == "pooled":
            self.transport = PooledTransport(cfg.max_connections, cfg.verify_tls)
        else:
            limits = httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=cfg.max_connections)
            self.transport = httpx.AsyncHTTPTransport(limits=limits, verify=cfg.verify_tls)
        self.state = "ready"

    async def close(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()

    @property
    def context_length(self) -> int | None:
        return self.config.max_model_len

    def describe(self) -> dict:
        return {**super().describe(), "base_url": self.shown_url, "model": self.config.model}

    def token_signals(self, stream: bool) -> frozenset[str]:
        return NO_TOKEN_SIGNALS if stream else _ANSWER_SIGNALS

    # ---- requests ---------------------------------------------------------------------
    def _check_request(self, call: TierCall) -> frozenset[str]:
        """Raises TierUnfit when the request cannot go to this tier; returns the body fields to drop."""
        limit = self.config.max_model_len
        estimate = call.ctx.prompt_tokens_estimate
        if limit is not None and estimate is not None and estimate + (call.body.output_limit or 0) > limit:
            raise TierUnfit(GatewayError(
                400, f"prompt (~{estimate} tokens) plus max_tokens exceeds this tier's context length {limit}",
                param="messages" if call.endpoint == "chat" else "prompt", code="context_length_exceeded"), limit)
        unknown = [name for name in call.body.unknown_fields() if name not in self._extra_fields]
        if not unknown:
            return frozenset()
        if self.config.unknown_fields == "drop":
            return frozenset(unknown)
        raise TierUnfit(GatewayError(400, f"Unrecognized request argument supplied: {unknown[0]}",
                                     param=unknown[0], code="unknown_parameter"))

    def _payload(self, call: TierCall, stream: bool, drop: frozenset[str]) -> bytes:
        body = call.body.model_dump(exclude_unset=True, exclude=drop or None)
        body["model"] = self.config.model
        set_upstream_cache_salt(body, call.ctx.prefix_scope, self.config.supports_cache_salt)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}   # so usage can be counted
            if call.body.continuous_usage and self.config.supports_continuous_usage:
                body["stream_options"]["continuous_usage_stats"] = True
        if call.scoring is not None and not body.get("logprobs"):
            body["logprobs"] = True if isinstance(call.body, ChatCompletionRequest) else 1
        return to_json(body)

    async def _take_share(self, call: TierCall) -> bool:
        if self.shares is None:
            return False
        if not await self.shares.acquire(call.ctx.tenant):
            raise tenant_share_exceeded(self.name)
        return True

    def _give_share(self, call: TierCall, taken: bool) -> None:
        if taken:
            self.shares.release(call.ctx.tenant)

    async def _send(self, call: TierCall, stream: bool, drop: frozenset[str]) -> httpx.Response:
        headers = self._headers
        trace = call.span.inject({})   # W3C traceparent: the upstream's spans join the client's trace
        if trace:
            headers = headers + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in trace.items()]
        request = httpx.Request("POST", self._urls[call.endpoint], headers=headers,
                                content=self._payload(call, stream, drop), extensions={"timeout": self._timeouts})
        try:
            return await self.transport.handle_async_request(request)
        except httpx.PoolTimeout:
            raise pool_exhausted(self.name) from None
        except httpx.HTTPError as exc:
            raise self._failure(exc) from None

    def _failure(self, exc: Exception) -> UpstreamFailure:
        code = failure_code(exc)
        return UpstreamFailure(code, f"{self.shown_url}: {type(exc).__name__}: {exc}",
                               error=client_error_for(code))

    def _report(self, call: TierCall, failure: UpstreamFailure, mid_stream: bool = False) -> None:
        """The detail for operators: the span always gets the code, and the detail when its
        tenant allows content (an upstream's bytes may quote the prompt); a failure after the
        first event is logged here, one before it by the chain walk."""
        span = call.span
        if span.recording:
            attributes = {"tiergate.upstream.failure": failure.code}
            if span.content_allowed:
                attributes["tiergate.upstream.failure_detail"] = failure.detail[:2000]
            span.span.add_event("tiergate.upstream.failed", attributes)
        if mid_stream:
            detail = f": {failure.detail}" if span.content_permitted else ""
            log.warning("tier %s failed mid-stream for %s: %s%s", self.name, call.ctx.request_id,
                        failure.code, detail)

    async def _check_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if 200 <= status < 300:
            return
        raw, whole = await read_capped(response, ERROR_BODY_LIMIT)
        if status not in _CLIENT_ERRORS:
            # 401/403/404 mean this tier is misconfigured (key, model name), 429/5xx that it is
            # overloaded or down: none of them is the client's fault. Nor is a 3xx, whatever its
            # body: redirects are not followed (the request would go where the upstream says,
            # with its key), and its body is not the answer.
            code = f"http_{status}" if 300 <= status < 600 else "http_status"
            raise UpstreamFailure(code, f"{self.shown_url} answered {status}: {raw[:200]!r}",
                                  error=client_error_for(code, response.headers.get("retry-after")))
        raise client_error(status, raw if whole else b"")

    # ---- a whole answer -----------------------------------------------------------------
    async def complete(self, call: TierCall) -> TierAnswer:
        drop = self._check_request(call)
        taken = await self._take_share(call)
        answered = False      # a 2xx whole answer comes once generation is done: its tokens were spent
        try:
            response = await self._send(call, False, drop)
            try:
                await self._check_status(response)
                answered = True
                raw, whole = await read_capped(response, self.config.max_response_bytes)
            except httpx.HTTPError as exc:
                raise self._failure(exc) from None
            finally:
                await response.aclose()
            if not whole:
                raise UpstreamFailure("answer_too_large", f"more than {self.config.max_response_bytes} bytes")
            data = read_answer(raw)
            usage = read_usage(data.get("usage"))
        except UpstreamFailure as exc:
            exc.answered = answered   # the attempt charges an answered failure its reservation
            self._report(call, exc)
            raise
        finally:
            self._give_share(call, taken)
        if call.span.recording:
            facts = AnswerFacts(call.span.content_allowed)
            facts.read(data)
            facts.usage = usage
            facts.finish(call.span)
        gate = call.scoring
        rewritten = False            # the answer as sent differs from the upstream's bytes
        if gate is not None:
            try:
                gate.observe(answer_logprobs(data), (), True)
            except Escalate:
                call.ctx.usage.add(usage)     # the answer was generated: its tokens are charged
                raise
            if not _client_wants_logprobs(call):
                strip_logprobs(data)
                rewritten = True
        if self._hides_cached(call):
            rewritten = hide_cached_tokens(data) or rewritten
        return TierAnswer(ascii_json(data) if rewritten else raw, usage)

    def _hides_cached(self, call: TierCall) -> bool:
        """An upstream without `cache_salt` shares one prefix cache among all the gateway's
        tenants: its cached-token counts would tell a tenant that another sent the same prompt."""
        return call.ctx.prefix_private and not self.config.supports_cache_salt

    # ---- a stream ---------------------------------------------------------------------------
    async def stream(self, call: TierCall) -> AsyncIterator[bytes]:
        drop = self._check_request(call)
        facts = AnswerFacts(call.span.content_allowed)
        ctx = call.ctx
        relayed = False
        reader: StreamReader | None = None
        taken = await self._take_share(call)
        try:
            response = await self._send(call, True, drop)
            try:
                await self._check_status(response)
                if not response.headers.get("content-type", "").startswith("text/event-stream"):
                    raise UpstreamFailure("not_event_stream", f"content-type {response.headers.get('content-type')!r}")
                body = call.body
                chat = call.endpoint == "chat"
                reader = StreamReader(self.config.max_response_bytes, facts, chat=chat, n=body.n,
                                      choices=body.n * prompt_count(body),
                                      hide_cached=self._hides_cached(call))
                include_usage = body.include_usage
                pieces = response.aiter_bytes()
                while True:
                    data = await anext(pieces, None)
                    events = reader.end() if data is None else reader.feed(data)
                    # Usage reports are cumulative: the request's usage follows the stream's latest.
                    reader.usage.settle_into(ctx.usage)
                    for event, usage_only in events:
                        if not relayed:
                            relayed = True
                            if ctx.first_token_at is None:
                                ctx.first_token_at = time.perf_counter()
                            call.span.first_token()
                        if usage_only and not include_usage:
                            continue
                        yield event
                    if data is None:
                        break
            except httpx.HTTPError as exc:
                raise self._failure(exc) from None
            finally:
                await response.aclose()
        except UpstreamFailure as exc:
            self._report(call, exc, mid_stream=relayed)
            raise
        finally:
            self._give_share(call, taken)
            if reader is not None:
                reader.usage.settle_into(ctx.usage)     # what a failed stream reported still counts
                if reader.ignored_usage is not None:
                    log.warning("tier %s reported usage that is not a count, ignored, for %s: %s", self.name,
                                ctx.request_id, reader.ignored_usage)
            if call.span.recording:
                facts.finish(call.span)


def _client_wants_logprobs(call: TierCall) -> bool:
    body = call.body
    return bool(body.logprobs) if isinstance(body, ChatCompletionRequest) else body.logprobs is not None
