"""Open-loop HTTP/1.1 load at a fixed rate, with per-request latency.

Request i is sent at t0 + i / rate whether or not earlier ones have finished (a slow server
gets more concurrent requests, not fewer); latency runs from the request's send to the last
byte of its answer. Raw asyncio with keep-alive connections keeps the
generator's own cost small (it shares the CPU with what it measures).
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field


@dataclass
class PhaseResult:
    latencies_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)   # x-tiergate-overhead-ms, when present
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    error_kinds: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    sent: int = 0


class _Pool:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, fresh: bool = False):
        while self.idle and not fresh:
            reader, writer = conn = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return conn
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    def put(self, conn) -> None:
        self.idle.append(conn)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _exchange(conn, payload: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    reader, writer = conn
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    elif b"chunked" in headers.get(b"transfer-encoding", b""):
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(parts)
    else:
        raise ValueError("response without a length")
    return status, headers, body


def build_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: bench", "content-type: application/json", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def run_phase(host: str, port: int, payloads: list[bytes], rate: float, seconds: float) -> PhaseResult:
    """Send `rate * seconds` requests (cycling through `payloads`) on an open-loop schedule."""
    pool = _Pool(host, port)
    result = PhaseResult()
    count = int(rate * seconds)
    loop = asyncio.get_running_loop()
    tasks = []

    async def one(payload: bytes) -> None:
        conn = None
        try:
            conn = await pool.get()
            sent = time.perf_counter()   # from the send: a late timer is the generator's delay, not the server's
            try:
                status, headers, _ = await _exchange(conn, payload)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
                # The server closed this idle keep-alive connection (as any client meets it): retry fresh.
                conn[1].close()
                conn = await pool.get(fresh=True)
                sent = time.perf_counter()
                status, headers, _ = await _exchange(conn, payload)
            done = time.perf_counter()
            pool.put(conn)
            conn = None
            result.statuses[status] = result.statuses.get(status, 0) + 1
            if status != 200:
                result.errors += 1
                return
            result.latencies_ms.append((done - sent) * 1000)
            overhead = headers.get(b"x-tiergate-overhead-ms")
            if overhead is not None:
                result.overhead_ms.append(float(overhead))
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            result.errors += 1
            kind = type(exc).__name__
            result.error_kinds[kind] = result.error_kinds.get(kind, 0) + 1
        finally:
            if conn is not None:
                conn[1].close()

    started = loop.time()
    for i in range(count):
        due = started + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(payloads[i % len(payloads)])))
        result.sent += 1
    await asyncio.gather(*tasks)
    result.wall_s = loop.time() - started
    pool.close()
    return result


async def wait_http(host: str, port: int, path: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.1\r\nhost: bench\r\n\r\n".encode())
            status = int((await reader.readuntil(b"\r\n")).split(b" ", 2)[1])
            writer.close()
            if status == 200:
                return True
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass
        await asyncio.sleep(0.2)
    return False
