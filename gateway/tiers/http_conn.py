"""One HTTP/1.1 client connection as an asyncio Protocol with an incremental response parser.

A Protocol (not StreamReader/Writer) because the gateway's overhead budget is ~1 ms per
request: bytes are parsed as they arrive in data_received, and a waiting coroutine is woken
once per arrival, with no stream-reader futures per read call.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections import deque

MAX_HEAD = 64 * 1024
MAX_LINE = 4096                 # a chunk-size or trailer line; past it the server is not speaking HTTP
# Body bytes parsed but not yet read by the caller: past HIGH the socket stops being read, so a
# reader that has stalled (a streaming client that stopped reading) pushes back on the server
# through TCP instead of piling the answer up in memory; reading resumes below LOW.
HIGH_WATER = 1 << 20
LOW_WATER = 1 << 18
_NO_BODY_STATUS = (204, 304)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.1 response."""


class ClosedBeforeAnswer(ConnectionError):
    """The connection closed before any byte of the response arrived."""


class HTTPConnection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.last_used = 0.0
        self._buf = bytearray()
        self._waiter: asyncio.Future | None = None
        self._error: BaseException | None = None
        self._buffered = 0             # bytes in self.chunks
        self._paused = False
        self._expiry: asyncio.TimerHandle | None = None
        self._reset(head_request=False)

    # ---- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.done and self.status is not None:
            # Bytes after a complete answer belong to no request: parsed as the next request's
            # answer they would hand one caller (one tenant) the reply to another's request.
            self.closed = True
            self._fail(ProtocolError("bytes after the end of the answer"))
            return
        self._buf += data
        self._got_bytes = True
        try:
            self._parse()
        except (ProtocolError, ValueError) as exc:
            self._fail(ProtocolError(str(exc)))
        if self._buffered + len(self._buf) > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        if self._framing == "close" and self.status is not None:
            self._take_body(eof=True)
        self._wake()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.cancel_expiry()
        if not self.done:
            self._fail(exc or (ClosedBeforeAnswer("closed before answering") if not self._got_bytes
                               else ConnectionResetError("the server closed the connection mid-answer")))
        self._wake()

    # ---- one exchange -------------------------------------------------------------------
    def _reset(self, head_request: bool) -> None:
        self.status: int | None = None
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.http10 = False
        self.keep_alive = True
        self.done = False
        self.chunks: deque[bytes] = deque()
        self._buffered = 0
        self._resume()
        self._head_request = head_request
        self._framing: str | None = None     # "length" | "chunked" | "close"
        self._remaining = 0                  # bytes left of a length body or of the current chunk
        self._chunk_state = "size"           # "size" | "data" | "trailers"
        self._got_bytes = False

    def send(self, payload: bytes, head_request: bool = False) -> None:
        self._reset(head_request)
        self.transport.write(payload)

    async def wait_head(self, timeout: float | None) -> None:
        while self.status is None:
            await self._wait(timeout)

    async def next_chunk(self, timeout: float | None) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while not self.chunks:
            if self.done:
                return None
            await self._wait(timeout)
        chunk = self.chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered < LOW_WATER:
            self._resume()
        return chunk

    def _resume(self) -> None:
        if self._paused:
            self._paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def _emit(self, data: bytes) -> None:
        self.chunks.append(data)
        self._buffered += len(data)

    def close(self) -> None:
        self.closed = True
        self.cancel_expiry()
        if self.transport is not None:
            self.transport.close()

    def expire_after(self, seconds: float, callback) -> None:
        self.cancel_expiry()
        self._expiry = asyncio.get_running_loop().call_later(seconds, callback)

    def cancel_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def reusable(self) -> bool:
        return self.done and self.keep_alive and not self.closed and not self._buf

    async def _wait(self, timeout: float | None) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        finally:
            self._waiter = None
        if self._error is not None and not self.chunks and not self.done:
            raise self._error

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if self.transport is not None:
            self.transport.close()

    # ---- parsing --------------------------------------------------------------------------
    def _parse(self) -> None:
        while self.status is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise ProtocolError("response head too large")
                return
            head = bytes(self._buf[:end])
            del self._buf[:end + 4]
            self._parse_head(head)
        self._take_body(eof=False)

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200:
            return            # 100 Continue and friends precede the real answer
        headers = []
        length = chunked = None
        close = version == b"HTTP/1.0"
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            lname = name.lower()
            if lname == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise ProtocolError(f"bad content-length {value[:40]!r}")
                length = int(value)
            elif lname == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif lname == b"connection":
                close = close or value.lower() == b"close"
        self.status, self.reason, self.headers = status, reason, headers
        self.http10 = version == b"HTTP/1.0"
        self.keep_alive = not close
        if self._head_request or status in _NO_BODY_STATUS:
            self._framing, self.done = "length", True
        elif chunked:
            self._framing = "chunked"
        elif length is not None:
            self._framing, self._remaining = "length", length
            self.done = length == 0
        else:
            self._framing, self.keep_alive = "close", False

    def _take_body(self, eof: bool) -> None:
        buf = self._buf
        if self.done or not buf and not eof:
            return
        if self._framing == "length":
            take = min(self._remaining, len(buf))
            if take:
                self._emit(bytes(buf[:take]))
                del buf[:take]
                self._remaining -= take
            self.done = self._remaining == 0
        elif self._framing == "close":
            if buf:
                self._emit(bytes(buf))
                buf.clear()
            self.done = eof
        else:
            self._take_chunked()

    def _take_chunked(self) -> None:
        buf = self._buf
        while buf and not self.done:
            if self._chunk_state == "size":
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_LINE:
                        raise ProtocolError("chunk size line too long")
                    return
                digits = bytes(buf[:end]).split(b";", 1)[0].strip()
                if not _CHUNK_SIZE.fullmatch(digits):
                    raise ProtocolError(f"bad chunk size {digits[:40]!r}")
                size = int(digits, 16)
                del buf[:end + 2]
                self._remaining = size
                self._chunk_state = "data" if size else "trailers"
            elif self._chunk_state == "data":
                if len(buf) < self._remaining + 2:
                    if self._remaining and len(buf) > 0:   # hand on what is there, keep the rest
                        take = min(len(buf), self._remaining)
                        self._emit(bytes(buf[:take]))
                        del buf[:take]
                        self._remaining -= take
                    return
                if self._remaining:
                    self._emit(bytes(buf[:self._remaining]))
                if buf[self._remaining:self._remaining + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                del buf[:self._remaining + 2]
                self._chunk_state = "size"
            else:   # trailers end with an empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_LINE:
                        raise ProtocolError("trailer line too long")
                    return
                del buf[:end + 2]
                if end == 0:
                    self.done = True
