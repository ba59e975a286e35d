"""Small readers of an upstream's HTTP reply: a body read up to a cap, the OpenAI error a client
may see for an upstream's 4xx, and the reason code of a transport error."""

from __future__ import annotations

import json

import httpx

from gateway.errors import GatewayError

MAX_MESSAGE_CHARS = 2000

# Most specific first: ConnectTimeout is also a TimeoutException.
_CODES = ((httpx.ConnectTimeout, "connect_timeout"), (httpx.ReadTimeout, "read_timeout"),
          (httpx.WriteTimeout, "write_timeout"), (httpx.TimeoutException, "timeout"),
          (httpx.ConnectError, "connect_error"), (httpx.ProtocolError, "protocol_error"),
          (httpx.ReadError, "read_error"), (httpx.WriteError, "write_error"),
          (httpx.NetworkError, "network_error"))


def failure_code(exc: Exception) -> str:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return "upstream_error"


async def read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body up to `limit` bytes, and whether that was all of it. An answer announcing more is
    not read at all; one that turns out longer is cut off (the connection is then dropped)."""
    length = response.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        return b"", False
    parts, size = [], 0
    async for part in response.aiter_bytes():
        size += len(part)
        if size > limit:
            return b"".join(parts), False
        parts.append(part)
    return b"".join(parts), True


def client_error(status: int, raw: bytes) -> GatewayError:
    """An upstream's 4xx as the client's OpenAI error: its message, type, param and code when it
    answered in OpenAI's form (or vLLM's older flat one), else a generic message; anything else
    it sent (other fields, an HTML page from a proxy) stays here."""
    generic = GatewayError(status, f"the upstream tier rejected the request (HTTP {status})",
                           code="upstream_rejected")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return generic
    if not isinstance(data, dict):
        return generic
    error = data.get("error")
    if not isinstance(error, dict):
        error = data if data.get("object") == "error" else None
    if error is None or not isinstance(error.get("message"), str) or not error["message"]:
        return generic
    return GatewayError(status, error["message"][:MAX_MESSAGE_CHARS], type_=_text(error.get("type")),
                        param=_text(error.get("param")), code=_text(error.get("code")))


def _text(value) -> str | None:
    return value[:200] if isinstance(value, str) else None
