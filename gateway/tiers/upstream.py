"""A remote OpenAI-compatible tier (vLLM, SGLang, another tiergate) over a pooled httpx transport.

Requests are httpx.Request objects handed straight to the transport (tiergate's lean
HTTP/1.1 pool, or httpx's own httpcore transport): httpx.AsyncClient's per-request layer
(auth flows, cookies, redirects, URL merging) costs ~0.3 ms of CPU and does nothing here.
Bodies pass through: the request goes out with the upstream's model name; the answer comes
back byte for byte, parsed only to count usage (and logprobs when escalation needs them).
Upstream 4xx answers are the client's problem and go back unchanged; connection errors,
timeouts, 429 and 5xx are tier failures.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator

import httpx
from pydantic_core import to_json

from gateway.context import Usage
from gateway.errors import GatewayError
from gateway.schema import ChatCompletionRequest
from gateway.tiers.base import Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from gateway.tiers.http_pool import PooledTransport
from policies.tier_config import UpstreamTierConfig

_PATHS = {"chat": "/chat/completions", "completions": "/completions"}
_CLIENT_ERRORS = (400, 413, 422)


class UpstreamTier(Tier):
    kind = "upstream"

    def __init__(self, name: str, config: UpstreamTierConfig):
        super().__init__(name, config)
        self.transport: httpx.AsyncBaseTransport | None = None
        self._urls = {endpoint: httpx.URL(config.base_url + path) for endpoint, path in _PATHS.items()}
        base = httpx.URL(config.base_url)
        self.address, self.port = base.host, base.port or (443 if base.scheme == "https" else 80)  # for spans
        self._headers = [(b"content-type", b"application/json"), (b"accept", b"*/*"),
                         (b"user-agent", b"tiergate")]
        key = config.api_key()
        if key:
            self._headers.append((b"authorization", f"Bearer {key}".encode()))
        self._timeouts = {"connect": config.connect_timeout_s, "read": config.read_timeout_s,
                          "write": config.read_timeout_s, "pool": config.connect_timeout_s}

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

    async def _send(self, call: TierCall, stream: bool) -> httpx.Response:
        headers = self._headers
        trace = call.span.inject({})   # W3C traceparent: the upstream's spans join the client's trace
        if trace:
            headers = headers + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in trace.items()]
        request = httpx.Request("POST", self._urls[call.endpoint], headers=headers,
                                content=self._payload(call, stream), extensions={"timeout": self._timeouts})
        try:
            return await self.transport.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise self._failure(exc) from None

    @property
    def context_length(self) -> int | None:
        return self.config.max_model_len

    def describe(self) -> dict:
        return {**super().describe(), "base_url": self.config.base_url, "model": self.config.model}

    # ---- requests ---------------------------------------------------------------------
    def _payload(self, call: TierCall, stream: bool) -> bytes:
        body = call.body.model_dump(exclude_unset=True)
        body["model"] = self.config.model
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}   # so usage can be counted
        if call.want_logprobs and not body.get("logprobs"):
            body["logprobs"] = True if isinstance(call.body, ChatCompletionRequest) else 1
        return to_json(body)

    def _check_fits(self, call: TierCall) -> None:
        limit = self.config.max_model_len
        estimate = call.ctx.prompt_tokens_estimate
        if limit is not None and estimate is not None and estimate + (call.body.output_limit or 0) > limit:
            raise TierUnfit(GatewayError(
                400, f"prompt (~{estimate} tokens) plus max_tokens exceeds this tier's context length {limit}",
                param="messages" if call.endpoint == "chat" else "prompt", code="context_length_exceeded"))

    def _failure(self, exc: Exception) -> TierFailure:
        kind = type(exc).__name__
        return TierFailure(f"upstream {self.config.base_url}: {kind}: {exc}")

    async def _check_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        raw = await response.aread()
        if response.status_code not in _CLIENT_ERRORS:
            # 401/403/404 mean this tier is misconfigured (key, model name), 429/5xx that it is
            # overloaded or down: none of them is the client's fault.
            raise TierFailure(f"upstream answered {response.status_code}: {raw[:200]!r}")
        raise GatewayError(response.status_code, _error_message(raw), raw=raw if _is_openai_error(raw) else None)

    async def complete(self, call: TierCall) -> TierAnswer:
        self._check_fits(call)
        response = await self._send(call, False)
        try:
            await self._check_status(response)
            raw = await response.aread()
        except httpx.HTTPError as exc:
            raise self._failure(exc) from None
        finally:
            await response.aclose()
        try:
            data = json.loads(raw)
        except ValueError:
            raise TierFailure(f"upstream {self.config.base_url} answered with invalid JSON") from None
        usage = _usage(data.get("usage"))
        if call.span.recording:
            facts = _AnswerFacts(call.span.content_allowed)
            facts.read(data)
            facts.usage = usage
            facts.finish(call.span)
        mean = None
        if call.want_logprobs:
            mean = _mean_logprob(data)
            if not _client_wants_logprobs(call):
                for choice in data.get("choices") or []:
                    choice["logprobs"] = None
                raw = json.dumps(data, separators=(",", ":")).encode()
        return TierAnswer(raw, usage, mean)

    async def stream(self, call: TierCall) -> AsyncIterator[bytes]:
        self._check_fits(call)
        facts = _AnswerFacts(call.span.content_allowed)
        response = await self._send(call, True)
        try:
            await self._check_status(response)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                raise TierFailure(f"upstream {self.config.base_url} did not answer with an event stream")
            include_usage = call.body.include_usage
            buffer = b""
            first = True
            async for data in response.aiter_bytes():
                buffer += data
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    if not event.strip():
                        continue
                    if first:
                        first = False
                        if call.ctx.first_token_at is None:
                            call.ctx.first_token_at = time.perf_counter()
                        call.span.first_token()
                    if _read_event(event, call, facts) and not include_usage:
                        continue
                    yield event + b"\n\n"
            if buffer.strip():   # a last event without its blank line
                yield buffer.rstrip(b"\n") + b"\n\n"
        except httpx.HTTPError as exc:
            raise self._failure(exc) from None
        finally:
            await response.aclose()
            if call.span.recording:
                facts.finish(call.span)


# Events worth parsing besides the usage chunk: the one that ends a choice.
_FINISHED = re.compile(rb'"finish_reason":\s*"')


def _read_event(event: bytes, call: TierCall, facts: _AnswerFacts) -> bool:
    """Count usage from the final usage chunk and note what the span reports; True for the
    usage-only chunk (choices == []). Only events that may matter are parsed."""
    if not event.startswith(b"data: {"):
        return False
    has_usage = b'"usage"' in event
    if not (has_usage or facts.keep_text or (call.span.recording and _FINISHED.search(event))):
        return False
    try:
        data = json.loads(event[6:])
    except ValueError:
        return False
    if call.span.recording:
        facts.read(data)
    usage = data.get("usage") if has_usage else None
    if not usage:
        return False
    counted = _usage(usage)
    call.ctx.usage.add(counted)
    facts.usage = counted
    return not data.get("choices")


class _AnswerFacts:
    """What the tier span reports of an upstream's answer: id, model, finish reasons, usage,
    and the text, kept only for spans whose tenant opted in to content recording."""

    __slots__ = ("finish_reasons", "keep_text", "model", "response_id", "texts", "usage")

    def __init__(self, keep_text: bool):
        self.keep_text = keep_text
        self.response_id = self.model = None
        self.finish_reasons: dict[int, str] = {}
        self.texts: dict[int, list[str]] = {}
        self.usage: Usage | None = None

    def read(self, data: dict) -> None:
        """One JSON answer, or one stream chunk."""
        self.response_id = data.get("id") or self.response_id
        self.model = data.get("model") or self.model
        for choice in data.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if choice.get("finish_reason"):
                self.finish_reasons[index] = str(choice["finish_reason"])
            if self.keep_text:
                part = choice.get("delta") or choice.get("message") or {}
                text = part.get("content") if isinstance(part, dict) else None
                text = choice.get("text") if text is None else text
                if isinstance(text, str):
                    self.texts.setdefault(index, []).append(text)

    def finish(self, span) -> None:
        indexes = sorted(set(self.finish_reasons) | set(self.texts))
        reasons = [self.finish_reasons.get(i, "error") for i in indexes]
        usage = self.usage
        span.finish(response_id=self.response_id, response_model=self.model, finish_reasons=reasons,
                    input_tokens=usage.prompt_tokens if usage else None,
                    output_tokens=usage.completion_tokens if usage else None,
                    cache_read_tokens=usage.cached_tokens if usage else None)
        if self.keep_text:
            span.record_output(["".join(self.texts.get(i, [])) for i in indexes], reasons)


def _usage(usage) -> Usage:
    if not isinstance(usage, dict):
        return Usage()
    details = usage.get("prompt_tokens_details") or {}
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                 int(details.get("cached_tokens") or 0))


def _mean_logprob(data: dict) -> float | None:
    values = []
    for choice in data.get("choices") or []:
        lp = choice.get("logprobs") or {}
        if isinstance(lp.get("content"), list):
            values.extend(t["logprob"] for t in lp["content"] if isinstance(t, dict) and "logprob" in t)
        elif isinstance(lp.get("token_logprobs"), list):
            values.extend(v for v in lp["token_logprobs"] if isinstance(v, (int, float)))
    return sum(values) / len(values) if values else None


def _client_wants_logprobs(call: TierCall) -> bool:
    body = call.body
    return bool(body.logprobs) if isinstance(body, ChatCompletionRequest) else body.logprobs is not None


def _is_openai_error(raw: bytes) -> bool:
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("error"), dict)


def _error_message(raw: bytes) -> str:
    try:
        data = json.loads(raw)
        return str(data["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:500].decode("utf-8", errors="replace") or "upstream rejected the request"
