"""Two gateway processes, one real Redis, 1,000 concurrent requests against one token budget.

Each worker is this file run as a script: an independent OS process with its own Budgets,
connection pool and event loop, driven phase by phase through stdin/stdout.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ESTIMATE = (70, 30)     # prompt tokens, max_tokens: 100 tokens reserved per request


def limits_config(url: str, prefix: str) -> dict:
    # A generous timeout: 500 tasks per event loop on a shared CI machine must not look like an outage.
    return {"store": {"backend": "redis", "url": url, "key_prefix": prefix, "timeout_s": 10},
            "tenants": {"by_id": {"acme": {"tokens_per_day": 50_000, "max_concurrent": 5000},
                                  "loop": {"tokens_per_day": 30_000, "max_concurrent": 5000}}}}


# --- the worker process ---

async def _worker(url: str, prefix: str, n: int, seed: int) -> None:
    from policies.budgets import Budgets, Scopes
    from policies.limits_config import LimitsConfig

    budgets = Budgets.from_config(LimitsConfig.model_validate(limits_config(url, prefix)))
    rng = random.Random(seed)
    held = []
    await budgets.store.ping()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "reserve":            # n concurrent reservations, kept open
            out = await asyncio.gather(*[budgets.reserve(Scopes(tenant=args[0]), *ESTIMATE) for _ in range(n)])
            held = [a.reservation for a in out if a.allowed]
            reply = {"admitted": len(held), "refused": sorted({a.reason for a in out if not a.allowed}),
                     "first": min(a.store_time for a in out), "last": max(a.store_time for a in out)}
        elif cmd == "finish":           # reconcile (some twice) or release everything held
            jobs, used = [], 0
            for i, res in enumerate(held):
                if i % 3 == 0:
                    jobs.append(budgets.release(res))
                else:
                    out_tokens = rng.randint(0, 30)
                    used += 70 + out_tokens
                    jobs += [budgets.reconcile(res, 70, out_tokens), budgets.reconcile(res, 70, out_tokens)]
            statuses = await asyncio.gather(*jobs)
            reply = {"used": used, "applied": sum(s.value == "applied" for s in statuses)}
        elif cmd == "cycles":           # n concurrent loops of reserve -> work -> reconcile/release
            async def cycles(i: int, tenant: str):
                admitted = used = 0
                for k in range(4):
                    a = await budgets.reserve(Scopes(tenant=tenant), *ESTIMATE)
                    if not a.allowed:
                        break
                    admitted += 1
                    await asyncio.sleep(rng.random() * 0.01)
                    if (i + k) % 4 == 0:
                        await budgets.release(a.reservation)
                    else:
                        await budgets.reconcile(a.reservation, 70, 30)
                        used += 100
                return admitted, used
            results = await asyncio.gather(*[cycles(i, args[0]) for i in range(n)])
            reply = {"admitted": sum(r[0] for r in results), "used": sum(r[1] for r in results)}
        else:
            break
        print(json.dumps(reply), flush=True)
    await budgets.close()


# --- the test ---

def _ask(procs, command: str) -> list[dict]:
    for p in procs:                     # write to all before reading: the phases run concurrently
        p.stdin.write(command + "\n")
        p.stdin.flush()
    return [json.loads(p.stdout.readline()) for p in procs]


@pytest.fixture
def redis_url():
    from tests.redis_server import running_redis
    with running_redis() as server:
        yield server.url


def test_two_processes_never_overspend_one_budget(redis_url):
    from policies.budgets import Budgets
    from policies.limits_config import LimitsConfig

    prefix = "p" + uuid.uuid4().hex[:8]
    procs = [subprocess.Popen([sys.executable, __file__, redis_url, prefix, "500", str(seed)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for seed in (1, 2)]
    try:
        assert all(r == {"ready": True} for r in [json.loads(p.stdout.readline()) for p in procs])

        async def inspect(tenant: str):
            budgets = Budgets.from_config(LimitsConfig.model_validate(limits_config(redis_url, prefix)))
            try:
                return await budgets.usage("t:" + tenant), await budgets.held()
            finally:
                await budgets.close()

        # 1,000 concurrent reservations of 100 tokens against 50,000: exactly 500 fit.
        replies = _ask(procs, "reserve acme")
        assert sum(r["admitted"] for r in replies) == 500
        assert all(r["refused"] == ["insufficient_quota"] for r in replies)
        assert max(r["first"] for r in replies) < min(r["last"] for r in replies), "the processes did not overlap"
        usage, held = asyncio.run(inspect("acme"))
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (50_000, 500, 500)

        # Reconcile (twice) or release everything: exactly once each, nothing left reserved.
        replies = _ask(procs, "finish")
        assert sum(r["applied"] for r in replies) == 500
        usage, held = asyncio.run(inspect("acme"))
        assert usage.used_tokens_day == sum(r["used"] for r in replies) <= 50_000
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (0, 0, 0)

        # Interleaved cycles: released capacity is reused, the budget still holds.
        replies = _ask(procs, "cycles loop")
        usage, held = asyncio.run(inspect("loop"))
        assert usage.used_tokens_day == sum(r["used"] for r in replies) <= 30_000
        assert sum(r["admitted"] for r in replies) > 300     # released capacity was admitted again
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (0, 0, 0)
    finally:
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    asyncio.run(_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
