"""What an open operator console costs the gateway: its request throughput with no console, one
console tab and many tabs polling it, in one run (`tiergate bench gateway --console`).

Throughput is measured closed loop: `concurrency` clients send requests back to back for a
phase, and the phase's figure is requests completed per second. Each round runs one phase per
side in an order that rotates and reverses from round to round, so that drift on a shared
machine falls on every side. One tab's cost (a fraction of a percent) is under the noise of a
2-core machine; N tabs cost N times as much, so the verdict is the N-tab cost over the polls
per second they made, with a bootstrap interval over the rounds' paired ratios.

The console is what a browser tab does: it loads the page and its two files once, then asks
for /console/api/state once a second with the admin key, passing `since` (the newest sparkline
point it holds), as gateway/console/static/console.js does. Separately, the gateway's CPU time
per poll is measured with the gateway otherwise idle, and its CPU per completed request on
each side: both give the cost in CPU terms beside the throughput figures.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass

import numpy as np

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
                 key: str | None, tabs: int) -> tuple[ClosedLoopResult, PollerStats]:
    """One closed-loop phase with `tabs` console tabs open, their polls spread over the second."""
    stats = PollerStats()
    if not tabs:
        return await closed_loop(host, port, payloads, concurrency, seconds), stats
    stop = asyncio.Event()

    async def tab(i: int) -> None:
        await asyncio.sleep(i / tabs * min(1.0, seconds))
        await console_poller(host, port, key, stop, stats)

    pollers = [asyncio.create_task(tab(i)) for i in range(tabs)]
    try:
        return await closed_loop(host, port, payloads, concurrency, seconds), stats
    finally:
        stop.set()
        await asyncio.gather(*pollers)


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


def _orders(sides: tuple[int, ...], rounds: int) -> list[tuple[int, ...]]:
    """Each round runs every side once; the order rotates and reverses from round to round, so
    that no side always follows another (a neighbour's load, a warming cache, falls on all)."""
    out = []
    for r in range(rounds):
        k = r % len(sides)
        order = sides[k:] + sides[:k]
        out.append(order if (r // len(sides)) % 2 == 0 else tuple(reversed(order)))
    return out


def _bootstrap_mean(values: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 95 % interval of the mean of `values` (percentile bootstrap)."""
    rng = np.random.default_rng(seed)
    arr = np.asarray(values, dtype=float)
    means = rng.choice(arr, size=(draws, len(arr)), replace=True).mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


async def measure_console_cost(host: str, port: int, pid: int, payloads: list[bytes], *, concurrency: int,
                               seconds: float, rounds: int, key: str | None, tabs: int = 32, log=print) -> dict:
    """Throughput with no console, one console tab, and `tabs` tabs, in rotating order per round.

    One tab's cost is a fraction of a percent, under the few-percent swing of a phase's
    throughput on a shared 2-core machine; `tabs` tabs cost `tabs` times as much (each poll is
    the same independent work), which lifts the effect far above the noise. The cost of one
    console is then the many-tab cost over the tabs' polls per second, with a bootstrap interval
    over the rounds' paired ratios; the one-tab ratio is measured and reported beside it."""
    await closed_loop(host, port, payloads, concurrency, 2.0)          # warm-up
    sides = (0, 1, tabs) if tabs > 1 else (0, 1)
    results: dict[int, list[ClosedLoopResult]] = {s: [] for s in sides}
    cpu = dict.fromkeys(sides, 0.0)
    polls = dict.fromkeys(sides, 0)
    errors = 0
    for r, order in enumerate(_orders(sides, rounds)):
        for side in order:
            before = cpu_seconds(pid)
            result, stats = await _phase(host, port, payloads, concurrency, seconds, key, side)
            cpu[side] += cpu_seconds(pid) - before
            results[side].append(result)
            polls[side] += stats.polls
            errors += stats.errors
            log(f"round {r + 1} {side:3d} tab(s) {result.throughput:8.1f} req/s  errors {result.errors}  "
                f"polls {stats.polls}")
    per_poll_ms = await cpu_per_poll(host, port, pid, key)
    return summarise(PhaseLog(tabs, results, cpu, polls, errors), per_poll_ms, concurrency, seconds, rounds)


@dataclass
class PhaseLog:
    """What the phases of a run measured, by the number of tabs open (0: no console)."""
    tabs: int
    results: dict[int, list[ClosedLoopResult]]
    cpu_s: dict[int, float]            # the gateway's CPU seconds over each side's phases
    polls: dict[int, int]
    poll_errors: int = 0


def summarise(log: PhaseLog, per_poll_ms: float, concurrency: int, seconds: float, rounds: int) -> dict:
    results, cpu, polls, tabs = log.results, log.cpu_s, log.polls, log.tabs
    sides = tuple(results)

    def total(side: int) -> float:
        wall = sum(x.wall_s for x in results[side])
        return sum(x.completed for x in results[side]) / wall if wall else 0.0

    def paired(side: int) -> list[float]:
        return [w.throughput / o.throughput for w, o in zip(results[side], results[0]) if o.throughput]

    done = {s: sum(x.completed for x in results[s]) for s in sides}
    cpu_per_request = {s: cpu[s] * 1000 / done[s] if done[s] else None for s in sides}
    wall_without = sum(x.wall_s for x in results[0])
    busy_ms_per_s = cpu[0] * 1000 / wall_without if wall_without else None     # gateway CPU at full load
    cpu_share = per_poll_ms / busy_ms_per_s if busy_ms_per_s else None            # one poll a second
    one = paired(1)
    out = {
        "concurrency": concurrency, "seconds_per_phase": seconds, "rounds": rounds, "tabs": tabs,
        "throughput_rps": {str(s): round(total(s), 1) for s in sides},
        "throughput_without_console_rps": round(total(0), 1), "throughput_with_console_rps": round(total(1), 1),
        "ratio": _round(total(1) / total(0)) if total(0) else None,
        "round_ratios": [round(x, 4) for x in one],
        "median_round_ratio": _round(statistics.median(one)) if one else None,
        "errors": {str(s): sum(x.errors for x in results[s]) for s in sides} | {"console": log.poll_errors},
        "console_polls": {str(s): polls[s] for s in sides},
        "gateway_cpu_ms_per_poll": round(per_poll_ms, 3),
        "gateway_cpu_ms_per_s_at_full_load": _round(busy_ms_per_s, 1),
        "cpu_share_of_one_poll_per_s": _round(cpu_share, 5),
        "gateway_cpu_ms_per_request": {str(s): _round(cpu_per_request[s]) for s in sides},
        "bar": BAR,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if tabs > 1 and paired(tabs):
        many = paired(tabs)
        cost_many = 1 - float(np.mean(many))
        low, high = _bootstrap_mean(many)
        # Scaled by the polls the tabs really made per second (a tab opened late in a phase polls
        # less than once a second of it) to one console's one poll a second; the interval's
        # upper end is the cost the measurement cannot rule out.
        wall = sum(x.wall_s for x in results[tabs])
        rate = polls[tabs] / wall if wall else 0.0
        scale = 1.0 / rate if rate else math.inf
        out["many_tabs"] = {
            "round_ratios": [round(x, 4) for x in many],
            "mean_ratio": _round(1 - cost_many), "ratio_95": [_round(low), _round(high)],
            "cost": _round(cost_many), "polls_per_s": _round(rate, 2),
            "cost_per_tab": _round(cost_many * scale, 5),
            "cost_per_tab_95": [_round((1 - high) * scale, 5), _round((1 - low) * scale, 5)],
            "cpu_per_request_ratio": _round(cpu_per_request[0] / cpu_per_request[tabs])
            if cpu_per_request[0] and cpu_per_request[tabs] else None,
        }
        out["cost_of_one_console"] = out["many_tabs"]["cost_per_tab"]
        out["meets_bar"] = (1 - low) * scale < BAR
    else:
        out["cost_of_one_console"] = _round(1 - out["ratio"]) if out["ratio"] is not None else None
        out["meets_bar"] = out["cost_of_one_console"] is not None and out["cost_of_one_console"] < BAR
    return out


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
