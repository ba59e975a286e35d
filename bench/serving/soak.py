"""`tiergate bench soak`: a long run at a fixed share of measured capacity, watching for drift.

A leak or a slow accumulation (a cache that never evicts, a list of finished requests, a task
per aborted stream) shows only over time: the server's memory climbs and its tail latency
creeps up while the load stays the same. This benchmark starts `tiergate serve` on a config,
measures the capacity of that server on a fixed workload (closed loop: requests completed per
second with `--concurrency` in flight), then offers `--load` of that capacity as Poisson
arrivals for `--minutes`, and reports per window the server's RSS, open file descriptors and
threads, and the latency percentiles.

Every request does the same work: one of a fixed pool of ShareGPT prompts, `max_tokens`
tokens with EOS ignored, half streamed and half not (so both answer paths are soaked). The
pool is sent once in full before the measured period, so that prefix-cache state is already
in its steady state when measuring starts.

Verdicts (the bars): RSS growth = last RSS sample of the measured period / first - 1, < 5 %;
p99 drift = p99 latency over the last third of the measured period / p99 over the first
third - 1, < 10 %; and no failed request.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console

from bench.common import machine_info, percentiles, write_json
from bench.processes import free_port, loadavg, start_process, stop_processes
from bench.serving.serve import ServeRequest, load_serve_requests

BARS = {"rss_growth": 0.05, "p99_drift": 0.10}


@dataclass
class Window:
    """One window of the measured period."""
    start_s: float
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    rss_mib: list[float] = field(default_factory=list)
    fds: int = 0
    threads: int = 0

    def summary(self) -> dict:
        return {"start_s": round(self.start_s, 1), "completed": len(self.latencies_ms), "failed": self.failures,
                "latency_ms": percentiles(self.latencies_ms), "rss_mib": self.rss_mib[-1] if self.rss_mib else None,
                "open_fds": self.fds, "threads": self.threads}


def process_vitals(pid: int) -> tuple[float, int, int]:
    """(RSS in MiB, open file descriptors, threads) of a live process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_kib = int(fields["VmRSS"].split()[0])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])


async def _one(client: httpx.AsyncClient, model: str, req: ServeRequest, stream: bool, max_tokens: int) -> bool:
    body = {"model": model, "messages": [{"role": "user", "content": req.question}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    try:
        if not stream:
            resp = await client.post("/chat/completions", json=body)
            return resp.status_code == 200 and bool(resp.json()["choices"][0]["message"]["content"])
        async with client.stream("POST", "/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return False
            done = False
            async for line in resp.aiter_lines():
                done = done or line == "data: [DONE]"
            return done
    except (httpx.HTTPError, ValueError, KeyError):
        return False


class SoakClient:
    """The load side: a closed loop to measure capacity, then open-loop arrivals at a rate."""

    def __init__(self, base_url: str, model: str, pool: list[ServeRequest], max_tokens: int):
        self.base_url, self.model, self.pool, self.max_tokens = base_url, model, pool, max_tokens
        self._next = 0

    def _request(self) -> tuple[ServeRequest, bool]:
        i = self._next
        self._next += 1
        return self.pool[i % len(self.pool)], i % 2 == 0

    def client(self, connections: int) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=httpx.Timeout(300.0))

    async def prime(self, concurrency: int) -> int:
        """Send every prompt of the pool once; returns the number of failures."""
        async with self.client(concurrency) as client:
            gate = asyncio.Semaphore(concurrency)

            async def one() -> bool:
                async with gate:
                    return await _one(client, self.model, *self._request(), self.max_tokens)
            results = await asyncio.gather(*(one() for _ in self.pool))
        return results.count(False)

    async def capacity(self, concurrency: int, seconds: float) -> tuple[float, int]:
        """Closed loop: (completed requests per second, failures) over `seconds`."""
        completed = failed = 0
        deadline = time.perf_counter() + seconds
        async with self.client(concurrency) as client:
            async def worker() -> None:
                nonlocal completed, failed
                while time.perf_counter() < deadline:
                    ok = await _one(client, self.model, *self._request(), self.max_tokens)
                    completed, failed = completed + ok, failed + (not ok)
            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        return completed / elapsed, failed

    async def soak(self, rate: float, seconds: float, window_s: float, server_pid: int, seed: int,
                   progress) -> list[Window]:
        """Poisson arrivals at `rate` for `seconds`; each latency lands in the window its request started in."""
        rng = random.Random(seed)
        windows = [Window(i * window_s) for i in range(max(1, round(seconds / window_s)))]
        started = time.perf_counter()

        async def one(window: Window, client: httpx.AsyncClient) -> None:
            sent = time.perf_counter()
            ok = await _one(client, self.model, *self._request(), self.max_tokens)
            if ok:
                window.latencies_ms.append((time.perf_counter() - sent) * 1e3)
            else:
                window.failures += 1

        async def sample_vitals() -> None:
            while (now := time.perf_counter() - started) < seconds:
                window = windows[min(int(now // window_s), len(windows) - 1)]
                rss, window.fds, window.threads = process_vitals(server_pid)
                window.rss_mib.append(round(rss, 1))
                progress(now, window)
                await asyncio.sleep(5.0)

        async with self.client(1000) as client:
            sampler = asyncio.create_task(sample_vitals())
            tasks = []
            while (now := time.perf_counter() - started) < seconds:
                window = windows[min(int(now // window_s), len(windows) - 1)]
                tasks.append(asyncio.create_task(one(window, client)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
            await sampler
        return windows


def verdict(windows: list[Window]) -> dict:
    """RSS growth over the measured period, p99 drift between its first and last thirds."""
    rss = [r for w in windows for r in w.rss_mib]
    third = max(1, len(windows) // 3)
    first = [x for w in windows[:third] for x in w.latencies_ms]
    last = [x for w in windows[-third:] for x in w.latencies_ms]
    p99_first, p99_last = percentiles(first)["p99"], percentiles(last)["p99"]
    growth = rss[-1] / rss[0] - 1 if rss else float("nan")
    drift = p99_last / p99_first - 1 if first and last else float("nan")
    failed = sum(w.failures for w in windows)
    return {"rss_first_mib": rss[0] if rss else None, "rss_last_mib": rss[-1] if rss else None,
            "rss_max_mib": max(rss) if rss else None, "rss_growth": growth,
            "p99_first_third_ms": p99_first, "p99_last_third_ms": p99_last, "p99_drift": drift,
            "failed": failed, "bars": BARS,
            "passed": bool(growth < BARS["rss_growth"] and drift < BARS["p99_drift"] and failed == 0)}


async def _wait_ready(base: str, proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"tiergate serve exited with {proc.returncode} before it was ready")
            try:
                if (await client.get(f"{base}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(2.0)
    raise RuntimeError(f"tiergate serve was not ready within {timeout_s:.0f} s")


def run_soak_bench(json_out: str, config: str, minutes: float, load: float, concurrency: int,
                   capacity_s: float, window_s: float, pool_size: int, max_prompt_tokens: int, max_tokens: int,
                   seed: int, ready_timeout_s: float = 1800.0) -> int:
    console = Console(stderr=True)
    pool = load_serve_requests(pool_size, max_prompt_tokens, max_tokens, seed)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = Path(json_out).with_suffix(".server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # A frozen copy: the soak measures one config, whatever happens to the file meanwhile.
    frozen = log_path.with_suffix(".config.yaml")
    shutil.copyfile(config, frozen)
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(frozen), "--port", str(port)]
    proc = start_process(cmd, log_path)
    try:
        asyncio.run(_wait_ready(base, proc, ready_timeout_s))
        models = httpx.get(f"{base}/v1/models", timeout=10).json()["data"]
        load_side = SoakClient(f"{base}/v1", models[0]["id"], pool, max_tokens)
        console.print(f"server ready (pid {proc.pid}); priming {len(pool)} prompts")
        prime_failed = asyncio.run(load_side.prime(concurrency))
        capacity, capacity_failed = asyncio.run(load_side.capacity(concurrency, capacity_s))
        rate = load * capacity
        console.print(f"capacity {capacity:.2f} req/s at concurrency {concurrency}; soaking at {rate:.2f} req/s "
                      f"for {minutes:g} min")

        def progress(now: float, window: Window) -> None:
            if int(now) % 60 < 5:
                console.print(f"  {now / 60:5.1f} min: RSS {window.rss_mib[-1]:.0f} MiB, fds {window.fds}, "
                              f"{len(window.latencies_ms)} done in this window, load {loadavg()[0]:.2f}")
        windows = asyncio.run(load_side.soak(rate, minutes * 60, window_s, proc.pid, seed, progress))
    finally:
        stop_processes([proc])
    result = verdict(windows)
    report = {
        "machine": machine_info(),
        "workload": {"config": config, "config_sha256": hashlib.sha256(frozen.read_bytes()).hexdigest(), "source": "ShareGPT V3 first human turns", "pool_size": len(pool),
                     "max_prompt_tokens": max_prompt_tokens, "max_tokens": max_tokens, "ignore_eos": True,
                     "streamed_share": 0.5, "temperature": 0, "concurrency_for_capacity": concurrency,
                     "capacity_seconds": capacity_s, "load": load, "minutes": minutes, "window_s": window_s,
                     "seed": seed},
        "capacity_requests_per_s": capacity,
        "offered_requests_per_s": rate,
        "prime_failed": prime_failed,
        "capacity_failed": capacity_failed,
        **result,
        "windows": [w.summary() for w in windows],
        "server_log": str(log_path),
    }
    write_json(json_out, report)
    console.print(f"RSS {result['rss_first_mib']} -> {result['rss_last_mib']} MiB ({result['rss_growth']:+.1%}), "
                  f"p99 {result['p99_first_third_ms']:.0f} -> {result['p99_last_third_ms']:.0f} ms "
                  f"({result['p99_drift']:+.1%}), {result['failed']} failed: "
                  f"{'PASS' if result['passed'] else 'FAIL'} -> {json_out}")
    return 0 if result["passed"] else 1
