"""The HTTP/1.1 response parser's bounds: body bytes the caller has not read yet stop the socket
being read (TCP pushes back on the server instead of the answer piling up in memory), and
framing the server cannot mean (a negative or non-hex length, an endless size line) is a
protocol error, not a crash or an unbounded buffer."""

from __future__ import annotations

import asyncio

import pytest

from gateway.tiers.http_conn import HIGH_WATER, MAX_LINE, HTTPConnection, ProtocolError


class _Transport:
    def __init__(self):
        self.paused = self.closed = False

    def write(self, _): pass
    def close(self): self.closed = True
    def pause_reading(self): self.paused = True
    def resume_reading(self): self.paused = False
    def get_extra_info(self, _): return None


def _connection() -> tuple[HTTPConnection, _Transport]:
    conn, transport = HTTPConnection(), _Transport()
    conn.connection_made(transport)
    conn.send(b"POST / HTTP/1.1\r\n\r\n")
    return conn, transport


async def test_unread_body_bytes_pause_the_socket_until_the_reader_catches_up():
    conn, transport = _connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    piece = b"x" * 65536
    frame = b"%x\r\n%s\r\n" % (len(piece), piece)
    sent = 0
    while not transport.paused:
        conn.data_received(frame)
        sent += len(piece)
        assert sent <= 2 * HIGH_WATER, "the socket was never paused"
    read = 0
    while transport.paused:
        read += len(await conn.next_chunk(1.0))
    assert 0 < read <= sent


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\nabcde",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0x5\r\nabcde\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + b"1" * (MAX_LINE + 1),
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n" + b"t" * (MAX_LINE + 1),
])
async def test_impossible_framing_is_a_protocol_error(answer):
    conn, transport = _connection()
    conn.data_received(answer)
    with pytest.raises(ProtocolError):
        while await asyncio.wait_for(conn.next_chunk(1.0), 2) is not None:
            pass
    assert transport.closed
