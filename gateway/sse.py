"""Server-sent events out of an async iterator of ready-made `data: ...\\n\\n` chunks.

Unlike Starlette's StreamingResponse, a client that goes away is noticed at once (a task
waits for http.disconnect) and the chunk iterator is closed right then, so the tier request
behind it is aborted (engine KV freed, upstream connection closed) without waiting for the
next token.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator


def sse_error_event(message: str, type_: str | None = None) -> bytes:
    body = {"error": {"message": message, "type": type_ or "invalid_request_error", "param": None, "code": None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class SSEResponse:
    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str]):
        self.chunks = chunks
        self.headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.headers += [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                         (b"x-accel-buffering", b"no")]
        self.status_code = 200
        self.disconnected = False     # set once sent: whether the client left before the end

    async def __call__(self, scope, receive, send) -> None:
        disconnected = False

        async def pump() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def wait_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        pumping = asyncio.create_task(pump())
        watching = asyncio.create_task(wait_disconnect())
        try:
            done, _ = await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
            if pumping in done:
                exc = pumping.exception()
                if exc is not None and not isinstance(exc, OSError):
                    raise exc
                disconnected = isinstance(exc, OSError)   # the send failed: the client is gone
            else:
                disconnected = True
                pumping.cancel()
                await asyncio.gather(pumping, return_exceptions=True)
        finally:
            watching.cancel()
            if not pumping.done():
                pumping.cancel()
                await asyncio.gather(pumping, return_exceptions=True)
            await self.chunks.aclose()   # aborts the tier request if it is still running
            self.disconnected = disconnected
