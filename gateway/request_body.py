"""Reading and parsing a request body so that no single client can hold the gateway.

- The body has a deadline (`server.body_timeout_s`, 408 past it): a client that trickles its
  body would otherwise keep a request, its buffers and a connection for as long as it likes.
- The size cap (`server.max_body_bytes`, 413) is checked on the announced length before any
  byte is read, and again while reading.
- Bodies past OFF_LOOP_BYTES are parsed in a worker thread: validating megabytes of JSON takes
  tens of milliseconds, during which the event loop would answer nobody else.
- Prompts x choices is capped (`server.max_choices_per_request`, 400) right after parsing,
  before any per-choice work (token counts, engine requests, reservations) is built.

An answer sent before the body was read to its end closes the connection: the rest of the body
is then never read, and could not be told apart from a next request anyway.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError
from gateway.schema import CompletionRequest, RequestBody, parse_body

# Below this, a thread hop (~0.1 ms) costs more than the parse it would move off the loop.
OFF_LOOP_BYTES = 64 * 1024
CLOSE = {"connection": "close"}


async def read_body(receive, length: bytes | None, limit: int, timeout_s: float) -> bytes:
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(receive, limit)
    except TimeoutError:
        raise GatewayError(408, f"the request body was not received within {timeout_s:g}s",
                           code="request_timeout", headers=CLOSE) from None


async def _read(receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise GatewayError(400, "client disconnected while sending the body")
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise _too_large(limit)
        parts.append(part)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"request body is larger than {limit} bytes", code="request_too_large", headers=CLOSE)


async def parse_request(model: type[RequestBody], raw: bytes) -> RequestBody:
    """The validated body (parse_body), off the event loop when it is big."""
    if len(raw) > OFF_LOOP_BYTES:
        return await asyncio.to_thread(parse_body, model, raw)
    return parse_body(model, raw)


def check_choices(body: RequestBody, limit: int) -> None:
    """400 naming `prompt` (or `n` / `best_of`) when prompts x choices per prompt exceeds `limit`."""
    prompts = 1
    if isinstance(body, CompletionRequest):
        p = body.prompt
        prompts = 1 if isinstance(p, str) or isinstance(p[0], int) else len(p)   # one token-id list is one prompt
    field, per_prompt = "n", body.n
    if isinstance(body, CompletionRequest) and (body.best_of or 0) > body.n:
        field, per_prompt = "best_of", body.best_of
    total = prompts * per_prompt
    if total <= limit:
        return
    if prompts > limit:
        raise GatewayError(400, f"prompt has {prompts} entries; at most {limit} per request", param="prompt",
                           code="too_many_choices")
    raise GatewayError(400, f"{prompts} prompt(s) x {field}={per_prompt} is {total} choices; at most {limit} "
                            "per request", param=field, code="too_many_choices")
