"""Latency the budget check adds to a request: reserve (on the request path) and reconcile.

    python -m bench.budgets [--redis-url redis://127.0.0.1:6379/0] --json out.json

Measures the memory store always and Redis when a URL is given, each with a request that has
limits in all four scopes (API key, tenant, tier, session), one at a time and with many in
flight. `bench_budgets()` is what a `tiergate bench budgets` command can call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid

from policies.budgets.budgets import Budgets
from policies.budgets.types import Scopes
from policies.limits_config import LimitsConfig

_HUGE = 10**12


def bench_limits(store: dict) -> LimitsConfig:
    """Limits in every scope, high enough that nothing is refused during the run."""
    return LimitsConfig.model_validate({
        "store": store,
        "api_keys": {"default": {"rpm": _HUGE, "tpm": _HUGE}},
        "tenants": {"default": {"tokens_per_day": _HUGE, "tokens_per_month": _HUGE, "cost_per_day": 1e6,
                                "max_concurrent": 100_000}},
        "tiers": {"default": {"tpm": _HUGE, "max_concurrent": 100_000}},
        "sessions": {"default": {"rpm": _HUGE, "tokens_per_day": _HUGE}},
        "prices": {"small": {"input_per_1m": 0.05, "output_per_1m": 0.1}},
    })


def _percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 4)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "mean": round(statistics.fmean(ordered) * 1000, 4)}


async def bench_budgets(budgets: Budgets, requests: int = 2000, concurrency: int = 1, warmup: int = 200) -> dict:
    """Time `requests` reserve+reconcile cycles, `concurrency` at a time. Milliseconds."""
    reserve_s: list[float] = []
    reconcile_s: list[float] = []
    refused = 0

    async def one(i: int, record: bool) -> None:
        nonlocal refused
        scopes = Scopes(api_key=f"key-{i % 7}", tenant=f"tenant-{i % 5}", tier="small", session=f"s-{i % 11}")
        t0 = time.perf_counter()
        admission = await budgets.reserve(scopes, 500, 200)
        t1 = time.perf_counter()
        if not admission.allowed:
            refused += 1
            return
        await budgets.reconcile(admission.reservation, 500, 120)
        t2 = time.perf_counter()
        if record:
            reserve_s.append(t1 - t0)
            reconcile_s.append(t2 - t1)

    async def run(n: int, record: bool) -> float:
        queue = iter(range(n))

        async def lane() -> None:
            for i in queue:
                await one(i, record)

        start = time.perf_counter()
        await asyncio.gather(*[lane() for _ in range(concurrency)])
        return time.perf_counter() - start

    await run(warmup, record=False)
    wall = await run(requests, record=True)
    both = [a + b for a, b in zip(reserve_s, reconcile_s, strict=True)]
    return {"requests": requests, "concurrency": concurrency, "refused": refused,
            "reserve_ms": _percentiles(reserve_s), "reconcile_ms": _percentiles(reconcile_s),
            "reserve_plus_reconcile_ms": _percentiles(both),
            "cycles_per_s": round(requests / wall, 1)}


async def _script_stats(redis) -> tuple[int, int]:
    """(calls, µs) of EVALSHA so far, as Redis itself counts them (no reset of the server's stats)."""
    stats = (await redis.info("commandstats")).get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


async def _main(args) -> dict:
    result = {"machine": _machine(), "workload": {
        "scopes": "api key (rpm, tpm), tenant (tokens/day, tokens/month, cost/day, concurrency), "
                  "tier (tpm, concurrency), session (rpm, tokens/day)",
        "request": "500 prompt + 200 max_tokens reserved, reconciled to 500 + 120"}}
    stores = {"memory": {"backend": "memory"}}
    if args.redis_url:
        stores["redis"] = {"backend": "redis", "url": args.redis_url, "key_prefix": "bench" + uuid.uuid4().hex[:6]}
    for name, store in stores.items():
        for concurrency in args.concurrency:
            budgets = Budgets.from_config(bench_limits(store))
            try:
                if name == "redis":
                    result["redis_version"] = (await budgets.redis.info("server")).get("redis_version")
                    before = await _script_stats(budgets.redis)
                figures = await bench_budgets(budgets, args.requests, concurrency)
                if name == "redis":
                    calls, usec = [a - b for a, b in zip(await _script_stats(budgets.redis), before, strict=True)]
                    figures["redis_script_us_per_call"] = round(usec / max(calls, 1), 2)  # inside Redis
                result[f"{name}_c{concurrency}"] = figures
            finally:
                await budgets.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.budgets", description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", help="also measure Redis (a server you started, not production)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    result = asyncio.run(_main(args))
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
