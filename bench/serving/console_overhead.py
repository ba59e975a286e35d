"""What an open operator console costs the gateway: its request throughput with and without a
console polling it, in one run (`tiergate bench gateway --console`).

Throughput is measured closed loop: `concurrency` clients send requests back to back for a
phase, and the phase's figure is requests completed per second. Phases alternate (without,
with, then with, without, ...) so that drift on a shared machine falls on both sides; the
verdict is the ratio of the summed throughputs, and each round's own ratio is kept too.

The console is what a browser tab does: it loads the page and its two files once, then asks
for /console/api/state once a second with the admin key, passing `since` (the newest sparkline
point it holds), as gateway/console/static/console.js does. Separately, the gateway's CPU time
per poll is measured with the gateway otherwise idle, which gives the cost as a share of the
CPU the gateway spends per second at full load: a figure that does not drown in the noise of
a 2-core machine the way a throughput difference of a fraction of a percent can.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass

from bench.processes import cpu_seconds
from bench.serving.loadgen import _exchange, _Pool

BAR = 0.01          # the console may cost the gateway under 1 % of its throughput
PAGE_FILES = ("/console", "/console/static/console.js", "/console/static/console.css")


@dataclass
class ClosedLoopResult:
    completed: int = 0
    errors: int = 0
    wall_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.completed / self.wall_s if self.wall_s else 0.0


def _get(path: str, key: str | None) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return f"GET {path} HTTP/1.1\r\nhost: bench\r\n{auth}\r\n".encode()


async def closed_loop(host: str, port: int, payloads: list[bytes], concurrency: int,
                      seconds: float) -> ClosedLoopResult:
    result = ClosedLoopResult()
    pool = _Pool(host, port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop_at = started + seconds

    async def client(i: int) -> None:
        conn = await pool.get()
        n = i
        while loop.time() < stop_at:
            try:
                status, _, _ = await _exchange(conn, payloads[n % len(payloads)])
            except (OSError, asyncio.IncompleteReadError, ValueError):
                result.errors += 1
                conn[1].close()
                conn = await pool.get(fresh=True)
                continue
            n += concurrency
            if status == 200:
                result.completed += 1
            else:
                result.errors += 1
        pool.put(conn)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    result.wall_s = loop.time() - started
    pool.close()
    return result


@dataclass
class PollerStats:
    polls: int = 0
    errors: int = 0
    bytes: int = 0


async def console_poller(host: str, port: int, key: str | None, stop: asyncio.Event, stats: PollerStats,
                         interval_s: float = 1.0) -> None:
    """One console tab: the page once, then the state every `interval_s` until `stop` is set."""
    pool = _Pool(host, port)
    conn = await pool.get()
    try:
        for path in PAGE_FILES:
            status, _, body = await _exchange(conn, _get(path, key))
            stats.errors += status != 200
            stats.bytes += len(body)
        since = None
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            asked = loop.time()
            path = "/console/api/state" + ("" if since is None else f"?since={since}")
            status, _, body = await _exchange(conn, _get(path, key))
            stats.polls += 1
            stats.bytes += len(body)
            if status != 200:
                stats.errors += 1
            else:
                points = [p[0] for t in json.loads(body)["tiers"] for p in t["series"]["points"]]
                since = max(points, default=since)
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, interval_s - (loop.time() - asked)))
            except TimeoutError:
                pass
    finally:
        conn[1].close()


async def _phase(host: str, port: int, payloads: list[bytes], concurrency: int, seconds: float,
                 key: str | None, with_console: bool) -> tuple[ClosedLoopResult, PollerStats]:
    stats = PollerStats()
    if not with_console:
        return await closed_loop(host, port, payloads, concurrency, seconds), stats
    stop = asyncio.Event()
    poller = asyncio.create_task(console_poller(host, port, key, stop, stats))
    try:
        return await closed_loop(host, port, payloads, concurrency, seconds), stats
    finally:
        stop.set()
        await poller


async def cpu_per_poll(host: str, port: int, pid: int, key: str | None, polls: int = 20) -> float:
    """Gateway CPU milliseconds per state poll, with no other traffic (polled back to back)."""
    pool = _Pool(host, port)
    conn = await pool.get()
    try:
        await _exchange(conn, _get("/console/api/state", key))
        before = cpu_seconds(pid)
        for _ in range(polls):
            await _exchange(conn, _get("/console/api/state", key))
        return (cpu_seconds(pid) - before) * 1000 / polls
    finally:
        conn[1].close()


async def measure_console_cost(host: str, port: int, pid: int, payloads: list[bytes], *, concurrency: int,
                               seconds: float, rounds: int, key: str | None, log=print) -> dict:
    await closed_loop(host, port, payloads, concurrency, 2.0)          # warm-up
    sides = {False: [], True: []}
    polls = errors = 0
    cpu = {False: 0.0, True: 0.0}
    for r in range(rounds):
        for with_console in ((False, True) if r % 2 == 0 else (True, False)):
            before = cpu_seconds(pid)
            result, stats = await _phase(host, port, payloads, concurrency, seconds, key, with_console)
            cpu[with_console] += cpu_seconds(pid) - before
            sides[with_console].append(result)
            polls += stats.polls
            errors += stats.errors
            log(f"round {r + 1} {'with console   ' if with_console else 'without console'} "
                f"{result.throughput:8.1f} req/s  errors {result.errors}  polls {stats.polls}")
    per_poll_ms = await cpu_per_poll(host, port, pid, key)

    def total(results: list[ClosedLoopResult]) -> float:
        wall = sum(x.wall_s for x in results)
        return sum(x.completed for x in results) / wall if wall else 0.0

    without, with_ = total(sides[False]), total(sides[True])
    round_ratios = [round(w.throughput / o.throughput, 4) for w, o in zip(sides[True], sides[False]) if o.throughput]
    ratio = with_ / without if without else None
    wall_without = sum(x.wall_s for x in sides[False])
    # The gateway's own CPU per completed request on each side: at saturation its throughput is
    # the inverse of that, and unlike requests per second it does not move with what else the
    # machine runs (a shared 2-core machine swings phase throughput by 20 % and more).
    done = {side: sum(x.completed for x in sides[side]) for side in (False, True)}
    cpu_per_request = {side: cpu[side] * 1000 / done[side] if done[side] else None for side in (False, True)}
    cpu_ratio = (cpu_per_request[False] / cpu_per_request[True]
                 if cpu_per_request[False] and cpu_per_request[True] else None)
    busy_ms_per_s = cpu[False] * 1000 / wall_without if wall_without else None     # gateway CPU at full load
    cpu_share = per_poll_ms / busy_ms_per_s if busy_ms_per_s else None            # one poll a second
    return {
        "concurrency": concurrency, "seconds_per_phase": seconds, "rounds": rounds,
        "throughput_without_console_rps": round(without, 1), "throughput_with_console_rps": round(with_, 1),
        "ratio": None if ratio is None else round(ratio, 4),
        "cost": None if ratio is None else round(1 - ratio, 4),
        "round_ratios": round_ratios,
        # Each round's two phases run back to back: the median of their ratios resists a
        # neighbour's load that comes and goes better than the ratio of the sums does.
        "median_round_ratio": round(statistics.median(round_ratios), 4) if round_ratios else None,
        "errors": {"without": sum(x.errors for x in sides[False]), "with": sum(x.errors for x in sides[True]),
                   "console": errors},
        "console_polls": polls,
        "gateway_cpu_ms_per_poll": round(per_poll_ms, 3),
        "gateway_cpu_ms_per_s_at_full_load": None if busy_ms_per_s is None else round(busy_ms_per_s, 1),
        "cpu_share_of_one_poll_per_s": None if cpu_share is None else round(cpu_share, 5),
        "gateway_cpu_ms_per_request": {"without": _round(cpu_per_request[False]), "with": _round(cpu_per_request[True])},
        # requests per gateway CPU-second with the console over without: the throughput ratio at saturation
        "cpu_throughput_ratio": _round(cpu_ratio),
        "bar": BAR,
        "meets_bar": ratio is not None and 1 - ratio < BAR,
        "meets_bar_cpu": cpu_share is not None and cpu_share < BAR,
        "meets_bar_cpu_per_request": cpu_ratio is not None and 1 - cpu_ratio < BAR,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
