"""Server-sent events out of an async iterator of ready-made `data: ...\\n\\n` chunks.

Unlike Starlette's StreamingResponse, a client that goes away is noticed at once (a task
waits for http.disconnect) and the chunk iterator is closed right then, so the tier request
behind it is aborted (engine KV freed, upstream connection closed) without waiting for the
next token.

A client that stays connected but stops reading is bounded too: once the server's socket
buffers are full a send waits for the client, and a send that waits longer than the write
timeout ends the response as if the client had left. Without that bound such a client would
hold its tier call (an upstream connection, an engine sequence) for as long as it likes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

DEFAULT_WRITE_TIMEOUT_S = 30.0


def is_done_event(chunk: bytes) -> bool:
    """The stream's closing `data: [DONE]` event (ours, or an upstream's as relayed). A client may
    close the connection as soon as it has read it: that is the end, not a client leaving."""
    return chunk.endswith(b"[DONE]\n\n")


def sse_error_event(message: str, type_: str | None = None, param: str | None = None,
                    code: str | None = None) -> bytes:
    body = {"error": {"message": message, "type": type_ or "invalid_request_error", "param": param, "code": code}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class _WriteWatch:
    """Cancels the pump when one send has waited `limit` seconds. One timer per `limit`, not one
    per send: a send only stamps when it started."""

    __slots__ = ("_handle", "_limit", "_loop", "_task", "since", "stalled")

    def __init__(self, limit: float):
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._task: asyncio.Task | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.since: float | None = None     # when the send in progress began; None between sends
        self.stalled = False

    def start(self, task: asyncio.Task) -> None:
        self._task = task
        self._handle = self._loop.call_later(self._limit, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        since = self.since
        if since is not None and now - since >= self._limit:
            self.stalled = True
            self._task.cancel()
            return
        self._handle = self._loop.call_at((since if since is not None else now) + self._limit, self._check)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


class SSEResponse:
    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str], write_timeout_s: float | None = None):
        self.chunks = chunks
        self.headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.headers += [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                         (b"x-accel-buffering", b"no")]
        self.status_code = 200
        self.write_timeout_s = write_timeout_s or DEFAULT_WRITE_TIMEOUT_S
        self.disconnected = False     # set once sent: whether the client left (or stalled) before the end
        self.stalled = False          # set once sent: whether it was cut off for not reading

    async def __call__(self, scope, receive, send) -> None:
        disconnected = False
        last = b""                    # the last chunk sent
        watch = _WriteWatch(self.write_timeout_s)
        loop = asyncio.get_running_loop()

        async def pump() -> None:
            nonlocal last
            watch.since = loop.time()
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            watch.since = None
            async for chunk in self.chunks:
                watch.since = loop.time()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                watch.since = None
                last = chunk
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def wait_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        pumping = asyncio.create_task(pump())
        watching = asyncio.create_task(wait_disconnect())
        watch.start(pumping)
        try:
            done, _ = await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
            if pumping in done:
                exc = None if pumping.cancelled() else pumping.exception()
                if exc is not None and not isinstance(exc, OSError):
                    raise exc
                # the send failed (the client is gone), or it waited past the write timeout
                disconnected = isinstance(exc, OSError) or watch.stalled
            else:
                disconnected = True
                pumping.cancel()
                await asyncio.gather(pumping, return_exceptions=True)
        finally:
            watch.stop()
            watching.cancel()
            if not pumping.done():
                pumping.cancel()
                await asyncio.gather(pumping, return_exceptions=True)
            await self.chunks.aclose()   # aborts the tier request if it is still running
            # A client that read [DONE] and closed before the tier's stream had quite ended (an
            # upstream's last bytes) got the whole answer.
            self.disconnected = disconnected and not is_done_event(last)
            self.stalled = watch.stalled
