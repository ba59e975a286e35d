"""The gateway's HTTP/1.1 pool (an httpx transport) against raw servers that answer in each
framing: content-length, chunked, read-to-close; keep-alive reuse, a stale idle connection,
stray bytes after an answer, a request never sent twice, idle expiry, timeouts, and a body
closed early. httpx's own transport runs the same checks."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gateway.tiers.http_pool import PooledTransport
from tests.fakes.raw_http import read_request

TIMEOUTS = {"connect": 2.0, "read": 0.5, "write": 2.0, "pool": 2.0}


class RawServer:
    """Answers each request with the next canned response (bytes, or a coroutine function)."""

    def __init__(self, responses, close_after_each: bool = False):
        self.responses = list(responses)
        self.close_after_each = close_after_each
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed_by_client = asyncio.Event()
        self.closed_by_server = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while True:
                self.requests.append(b"".join(await read_request(reader)))
                answer = self.responses.pop(0)
                if callable(answer):
                    if await answer(reader, writer) == "closed":
                        break
                else:
                    writer.write(answer)
                    await writer.drain()
                if self.close_after_each:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()
            if self.close_after_each:
                await writer.wait_closed()
                self.closed_by_server.set()

    async def stop(self) -> None:
        self.server.close()


def _ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def _then_close(data: bytes):
    async def answer(reader, writer):
        writer.write(data)
        await writer.drain()
        return "closed"
    return answer


def _chunked(*parts: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n")


async def _post(transport, url: str, body: bytes = b'{"x": 1}') -> httpx.Response:
    request = httpx.Request("POST", url + "/v1/chat/completions", content=body,
                            headers={"content-type": "application/json"}, extensions={"timeout": TIMEOUTS})
    response = await transport.handle_async_request(request)
    await response.aread()
    await response.aclose()
    return response


@pytest.fixture(params=["pooled", "httpcore"])
def transport(request):
    return PooledTransport(16) if request.param == "pooled" else httpx.AsyncHTTPTransport()


async def test_framings_and_keep_alive(transport):
    server = RawServer([_ok(b'{"a": 1}'), _chunked(b'{"b"', b": 2}"),
                        _then_close(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")])
    url = await server.start()
    first = await _post(transport, url)
    second = await _post(transport, url, b"second body")
    third = await _post(transport, url)
    assert (first.status_code, first.content) == (200, b'{"a": 1}')
    assert second.content == b'{"b": 2}' and third.content == b"until the end"
    assert server.connections == 1                               # one kept-alive connection served all three
    assert server.requests[1].endswith(b"\r\n\r\nsecond body")
    assert b"content-length: 11" in server.requests[1].lower()
    await transport.aclose()
    await server.stop()


async def test_stale_idle_connection_is_replaced(transport):
    server = RawServer([_ok(b"one"), _ok(b"two")], close_after_each=True)
    url = await server.start()
    assert (await _post(transport, url)).content == b"one"
    await asyncio.wait_for(server.closed_by_server.wait(), 60)   # the idle connection is closed
    assert (await _post(transport, url)).content == b"two"
    assert server.connections == 2
    await transport.aclose()
    await server.stop()


async def test_errors_are_httpx_exceptions(transport):
    async def stall(reader, writer):
        await asyncio.sleep(2)

    server = RawServer([stall, b"garbage that is not http\r\n\r\n"])
    url = await server.start()
    with pytest.raises(httpx.ReadTimeout):
        await _post(transport, url)
    with pytest.raises(httpx.RemoteProtocolError):
        await _post(transport, url)
    with pytest.raises(httpx.ConnectError):
        await _post(transport, "http://127.0.0.1:9")
    await transport.aclose()
    await server.stop()


async def test_stream_closed_early_drops_the_connection():
    async def endless(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(500):
            writer.write(b"5\r\nchunk\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    transport = PooledTransport(4)
    server = RawServer([endless, _ok(b"fresh")])
    url = await server.start()
    request = httpx.Request("POST", url + "/x", content=b"{}", extensions={"timeout": TIMEOUTS})
    response = await transport.handle_async_request(request)
    got = b""
    async for part in response.aiter_bytes():
        got += part
        if len(got) >= 15:
            break
    await response.aclose()
    await asyncio.wait_for(server.closed_by_client.wait(), 2)    # the server saw the hang-up
    assert (await _post(transport, url)).content == b"fresh" and server.connections == 2
    await transport.aclose()
    await server.stop()


async def test_answers_arriving_in_small_pieces_are_reassembled(transport):
    def trickle(data: bytes, step: int):
        async def answer(reader, writer):
            for i in range(0, len(data), step):
                writer.write(data[i:i + step])
                await writer.drain()
                await asyncio.sleep(0.001)
        return answer

    body = b'{"text": "' + b"abcdefghij" * 30 + b'"}'
    server = RawServer([trickle(_chunked(body[:7], body[7:150], body[150:]), 3), trickle(_ok(body), 5),
                        trickle(_chunked(b"x" * 1000), 997)])
    url = await server.start()
    assert (await _post(transport, url)).content == body
    assert (await _post(transport, url)).content == body
    assert (await _post(transport, url)).content == b"x" * 1000
    assert server.connections == 1
    await transport.aclose()
    await server.stop()


async def test_bytes_after_an_answer_never_answer_the_next_request(transport):
    """A server that writes a second, unrequested answer on a kept-alive connection: the next
    request (another tenant's, in the gateway) must get its own answer, never the stray one."""
    strayed = asyncio.Event()

    async def answer_then_stray(reader, writer):
        writer.write(_ok(b"first"))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(_ok(b"stray answer to the first request"))
        await writer.drain()
        strayed.set()

    server = RawServer([answer_then_stray, _ok(b"second")])
    url = await server.start()
    assert (await _post(transport, url)).content == b"first"
    await asyncio.wait_for(strayed.wait(), 60)                   # sent on loopback: in the client's socket
    assert (await _post(transport, url, b"second body")).content == b"second"
    assert server.connections == 2
    await transport.aclose()
    await server.stop()


async def test_a_written_request_is_not_sent_again(transport):
    """The server reads the second request on a reused connection and dies without answering:
    it may have been generating, so the request fails instead of being replayed (billed twice)."""
    async def read_then_die(reader, writer):
        await asyncio.sleep(0.2)
        return "closed"

    server = RawServer([_ok(b"first"), read_then_die, _ok(b"unexpected")])
    url = await server.start()
    assert (await _post(transport, url)).content == b"first"
    with pytest.raises(httpx.RemoteProtocolError):
        await _post(transport, url, b"second body")
    assert len(server.requests) == 2
    await transport.aclose()
    await server.stop()


async def test_idle_connections_close_at_their_expiry():
    transport = PooledTransport(4, keepalive_expiry=0.3)
    server = RawServer([_ok(b"one")])
    url = await server.start()
    assert (await _post(transport, url)).content == b"one"
    await asyncio.wait_for(server.closed_by_client.wait(), 60)   # closed with no further request
    assert transport._idle[next(iter(transport._idle))] == []
    await transport.aclose()
    await server.stop()
