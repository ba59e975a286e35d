"""A lean HTTP/1.1 keep-alive connection pool as an httpx transport.

Why: httpx's default transport (httpcore over anyio and h11) costs ~1 ms of CPU per request
on the dev machine, more than the gateway's whole overhead budget. This one writes each
request in one send (TCP_NODELAY) and parses answers incrementally (http_conn.py:
content-length, chunked and read-to-close bodies), under httpx's transport API: httpx
Requests in, httpx Responses out, httpx's timeouts and exception types.
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
from collections.abc import AsyncIterator

import httpx

from gateway.tiers.http_conn import ClosedBeforeAnswer, HTTPConnection, ProtocolError

_READ_ERRORS = (OSError, ProtocolError, ValueError)
# Below the 5 s idle timeout of uvicorn, which vLLM and SGLang serve with: a connection is not
# reused at the moment its server may be closing it, since a request sent then is not retried.
KEEPALIVE_EXPIRY_S = 4.0


class PooledTransport(httpx.AsyncBaseTransport):
    def __init__(self, max_connections: int = 256, verify: bool = True,
                 keepalive_expiry: float = KEEPALIVE_EXPIRY_S):
        self._idle: dict[tuple, list[HTTPConnection]] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self.in_use = 0          # slots held: requests sent whose answer has not been read or closed yet
        self._expiry = keepalive_expiry
        self._ssl = ssl.create_default_context() if verify else _unverified_context()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        url = request.url
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        body = await request.aread()
        payload = _request_head(request, body) + body
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no free upstream connection in time", request=request) from None
        self.in_use += 1
        try:
            # A request once written is never sent again: the server may have read it and be
            # generating (a second answer would be billed twice). Only connections that show no
            # sign of being closed or of holding stray bytes are reused.
            conn = self._pop_idle(key) or await self._connect(key, timeouts, request)
            try:
                return await self._exchange(conn, key, payload, request, timeouts)
            except ClosedBeforeAnswer as exc:
                raise httpx.RemoteProtocolError(f"the upstream closed without answering: {exc}",
                                                request=request) from None
        except BaseException:
            self._release_slot()
            raise

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    # ---- connections ----------------------------------------------------------------
    def _pop_idle(self, key: tuple) -> HTTPConnection | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            conn.cancel_expiry()
            if conn.reusable() and now - conn.last_used < self._expiry and not _readable(conn):
                return conn
            conn.close()
        return None

    def release(self, key: tuple, conn: HTTPConnection) -> None:
        """The body was read to its end or abandoned: keep the connection or drop it."""
        if conn.reusable():
            conn.last_used = time.monotonic()
            self._idle.setdefault(key, []).append(conn)
            conn.expire_after(self._expiry, lambda: self._expire(key, conn))
        else:
            conn.close()
        self._release_slot()

    def _expire(self, key: tuple, conn: HTTPConnection) -> None:
        """An idle connection past its expiry is closed, not left open until the next request."""
        conns = self._idle.get(key)
        if conns and conn in conns:
            conns.remove(conn)
        conn.close()

    def _release_slot(self) -> None:
        self.in_use -= 1
        self._slots.release()

    async def _connect(self, key: tuple, timeouts: dict, request: httpx.Request) -> HTTPConnection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, conn = await loop.create_connection(
                    HTTPConnection, host, port, ssl=self._ssl if scheme == "https" else None)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}", request=request) from None
        return conn

    async def _exchange(self, conn: HTTPConnection, key: tuple, payload: bytes, request: httpx.Request,
                        timeouts: dict) -> httpx.Response:
        try:
            conn.send(payload, head_request=request.method == "HEAD")
            await conn.wait_head(timeouts.get("read"))
        except ClosedBeforeAnswer:
            conn.close()
            raise
        except TimeoutError:
            conn.close()
            raise httpx.ReadTimeout("the upstream did not answer in time", request=request) from None
        except _READ_ERRORS as exc:
            conn.close()
            raise httpx.RemoteProtocolError(f"bad answer from the upstream: {exc}", request=request) from None
        except BaseException:
            # Cancelled while waiting (the client left, the deadline passed): hanging up is what
            # tells the upstream to stop generating; the connection is in an unknown state anyway.
            conn.close()
            raise
        stream = _BodyStream(self, key, conn, request, timeouts.get("read"))
        return httpx.Response(conn.status, headers=conn.headers, stream=stream, extensions={
            "http_version": b"HTTP/1.0" if conn.http10 else b"HTTP/1.1", "reason_phrase": conn.reason})


class _BodyStream(httpx.AsyncByteStream):
    def __init__(self, pool: PooledTransport, key: tuple, conn: HTTPConnection, request: httpx.Request,
                 read_timeout: float | None):
        self._pool, self._key, self._conn = pool, key, conn
        self._request, self._timeout = request, read_timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._conn.next_chunk(self._timeout)) is not None:
                yield chunk
        except TimeoutError:
            await self.aclose()
            raise httpx.ReadTimeout("the upstream stalled mid-answer", request=self._request) from None
        except _READ_ERRORS as exc:
            await self.aclose()
            raise httpx.RemoteProtocolError(f"the upstream broke off: {exc}", request=self._request) from None
        await self.aclose()

    async def aclose(self) -> None:
        if not self._released:   # closed before the end: the connection is in an unknown state
            self._released = True
            self._pool.release(self._key, self._conn)


def _request_head(request: httpx.Request, body: bytes) -> bytes:
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    has_length = False
    for name, value in request.headers.raw:
        lname = name.lower()
        if lname == b"content-length":
            has_length = True
        elif lname == b"transfer-encoding":
            continue   # the body is sent whole, with a length
        lines.append(name + b": " + value)
    if not has_length and (body or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _readable(conn: HTTPConnection) -> bool:
    """An idle connection's socket with something to read holds the server's close or stray bytes
    not yet seen by the event loop; either way it must not carry the next request."""
    sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
    if sock is None or sock.fileno() < 0:
        return True
    return bool(select.select([sock.fileno()], [], [], 0)[0])


def _unverified_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx
