"""Two gateway processes, one real Redis, 1,000 concurrent requests against one token budget.

Each worker is this file run as a script: an independent OS process with its own Budgets,
connection pool and event loop, driven phase by phase through stdin/stdout.

What must hold under any load, and nothing else is asserted: the budget is never overspent,
every refusal is a refusal by the tenant's tokens_per_day (spent: insufficient_quota; full only
with what requests in flight hold: rate_limit_exceeded, a short wait), every
reservation is finished exactly once, and nothing stays reserved. How the two processes'
requests interleave is up to the OS scheduler; the phases are arranged so that the checks
never depend on it (see the test).
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow          # two worker processes; one process, two replicas: test_budgets_stores.py

ROOT = Path(__file__).resolve().parents[2]
ESTIMATE = (70, 30)     # prompt tokens, max_tokens: 100 tokens reserved per request


def limits_config(url: str, prefix: str) -> dict:
    # A generous timeout: 300 tasks per event loop on a loaded 2-core machine must not look like an
    # outage (the store is fail-closed: a timeout would refuse with BudgetStoreUnavailable, reported
    # below as a refusal of its own kind, so that an outage can never pass for a budget refusal).
    return {"store": {"backend": "redis", "url": url, "key_prefix": prefix, "timeout_s": 60},
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
        if cmd == "reserve":            # k concurrent reservations, kept open (added to those held)
            k = int(args[1])
            out = await asyncio.gather(*[budgets.reserve(Scopes(tenant=args[0]), *ESTIMATE) for _ in range(k)],
                                       return_exceptions=True)
            failed = [f"{type(a).__name__}: {a}" for a in out if isinstance(a, BaseException)]
            answers = [a for a in out if not isinstance(a, BaseException)]
            admitted = [a.reservation for a in answers if a.allowed]
            held += admitted
            refused = Counter(failed + [f"{a.reason}/{a.limit_kind}/{a.scope}" for a in answers if not a.allowed])
            times = [a.store_time for a in answers]
            reply = {"admitted": len(admitted), "refused": dict(refused),
                     "first": min(times, default=None), "last": max(times, default=None)}
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
            refusals = Counter()

            async def cycles(i: int, tenant: str):
                admitted = used = 0
                for k in range(4):
                    a = await budgets.reserve(Scopes(tenant=tenant), *ESTIMATE)
                    if not a.allowed:
                        refusals[f"{a.reason}/{a.limit_kind}/{a.scope}"] += 1
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
            reply = {"admitted": sum(r[0] for r in results), "used": sum(r[1] for r in results),
                     "refused": dict(refusals)}
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

        # 1,000 reservations of 100 tokens against 50,000 in two rounds, each process's requests
        # concurrent with the other's. Round one (2 x 200) fits whatever the interleaving; round two
        # (2 x 300, for the last 100 places) starts only once both processes finished round one, so
        # each process's requests straddle the other's (the overlap holds by construction, not by
        # timing), and each process asks for more than is left, so each must meet refusals.
        # The only refusal that may occur is the tenant's day budget: no rate limit is configured,
        # max_concurrent (5000) cannot be reached, and a store failure is reported by its type.
        # (Spent, or full with what requests in flight hold: a short wait.)
        quota = {"insufficient_quota/tokens_per_day/t:acme", "rate_limit_exceeded/tokens_per_day:held/t:acme"}
        first = _ask(procs, "reserve acme 200")
        assert [(r["admitted"], r["refused"]) for r in first] == [(200, {})] * 2
        second = _ask(procs, "reserve acme 300")
        assert all(set(r["refused"]) <= quota and sum(r["refused"].values()) >= 200 for r in second), second
        # Never overspent, and every refusal a budget refusal: so the budget was full, exactly.
        assert sum(r["admitted"] for r in first + second) == 500
        assert max(r["first"] for r in first) < min(r["last"] for r in second)
        usage, held = asyncio.run(inspect("acme"))
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (50_000, 500, 500)

        # Reconcile (twice, concurrently) or release everything: exactly once each, nothing left reserved.
        replies = _ask(procs, "finish")
        assert sum(r["applied"] for r in replies) == 500
        usage, held = asyncio.run(inspect("acme"))
        assert usage.used_tokens_day == sum(r["used"] for r in replies) <= 50_000
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (0, 0, 0)

        # Interleaved cycles: released capacity is reused, the budget still holds. A loop stops at its
        # first refusal; one that released at cycle k < 3 reserves again at once, so some capacity is
        # admitted twice whatever the interleaving (300 places: more than 300 admissions).
        replies = _ask(procs, "cycles loop")
        usage, held = asyncio.run(inspect("loop"))
        assert usage.used_tokens_day == sum(r["used"] for r in replies) <= 30_000
        assert sum(r["admitted"] for r in replies) > 300     # released capacity was admitted again
        assert set().union(*(r["refused"] for r in replies)) <= {"insufficient_quota/tokens_per_day/t:loop",
                                                                  "rate_limit_exceeded/tokens_per_day:held/t:loop"}
        assert any(r["refused"] for r in replies)
        assert (usage.reserved_tokens_day, usage.in_flight, held) == (0, 0, 0)
    finally:
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    asyncio.run(_worker(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
