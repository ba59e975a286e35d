"""The one request reader of the tests' raw-socket HTTP servers (servers that must misbehave in
ways a framework would not let them)."""

from __future__ import annotations

import asyncio


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of the next HTTP/1.1 request: the body as long as its content-length (none: empty).
    Raises asyncio.IncompleteReadError when the client hangs up first."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length")), 0)
    return head, await reader.readexactly(length)
