"""Memory-store behaviour that needs a controlled clock: UTC period roll-over, bounded state."""

from __future__ import annotations

import datetime as dt

from policies.budgets import Budgets, FinishStatus, MemoryBudgetStore, Scopes
from policies.limits_config import LimitsConfig

ACME = Scopes(tenant="acme")


class Clock:
    def __init__(self, iso: str):
        self.us = int(dt.datetime.fromisoformat(iso).replace(tzinfo=dt.UTC).timestamp() * 1_000_000)

    def __call__(self) -> int:
        return self.us


def budgets_with(clock: Clock, **tenant) -> tuple[Budgets, MemoryBudgetStore]:
    store = MemoryBudgetStore(clock_us=clock)
    cfg = LimitsConfig.model_validate({"tenants": {"by_id": {"acme": tenant}}})
    return Budgets(cfg, store, shared=False), store


async def test_day_budget_renews_at_utc_midnight_and_late_usage_stays_in_its_day():
    clock = Clock("2026-03-31T23:59:59.500000")
    budgets, _ = budgets_with(clock, tokens_per_day=100, tokens_per_month=1000)
    held = await budgets.reserve(ACME, 30, 10)
    spent = await budgets.reserve(ACME, 40, 20)
    assert await budgets.reconcile(spent.reservation, 40, 20) is FinishStatus.APPLIED
    refused = await budgets.reserve(ACME, 41, 0)          # 60 used + 41: spent, whatever the 40 held give back
    assert refused.reason == "insufficient_quota" and refused.retry_after == 0.5
    clock.us += 500_000                                   # 2026-04-01T00:00:00: a new day and month
    assert (await budgets.reserve(ACME, 50, 50)).allowed
    assert await budgets.reconcile(held.reservation, 30, 10) is FinishStatus.APPLIED
    usage = await budgets.usage("t:acme")
    assert (usage.day, usage.used_tokens_day, usage.reserved_tokens_day) == ("20260401", 0, 100)
    assert usage.used_tokens_month == 0                   # the 100 tokens count in March


async def test_month_budget_refusal_waits_for_the_first_of_the_month():
    clock = Clock("2026-02-27T12:00:00")
    budgets, _ = budgets_with(clock, tokens_per_month=10)
    spent = await budgets.reserve(ACME, 10, 0)
    await budgets.reconcile(spent.reservation, 10, 0)
    refused = await budgets.reserve(ACME, 1, 0)
    assert refused.limit_kind == "tokens_per_month" and refused.retry_after == 36 * 3600


async def test_idle_state_is_forgotten():
    clock = Clock("2026-05-01T00:00:00")
    budgets, store = budgets_with(clock, rpm=10**6, max_concurrent=10**6, tokens_per_day=10**9,
                                  tokens_per_month=10**9)
    for i in range(5000):
        admission = await budgets.reserve(Scopes(tenant="acme", api_key=f"k{i}"), 1, 1)
        await budgets.reconcile(admission.reservation, 1, 1)
        clock.us += 1000
    clock.us += 10 * 86_400 * 1_000_000                    # long after every tombstone and period
    await store.reserve(_plan())                           # the next decision sweeps
    assert (len(store._records), len(store._tat), len(store._in_flight)) == (1, 1, 0)
    # acme's days are gone, its month is kept 40 days; t:other counts from its first request
    assert sorted(store._counters) == [("bd", "t:other", "20260511"), ("bm", "t:acme", "202605"),
                                       ("bm", "t:other", "202605")]


def _plan():
    import uuid

    from policies.budgets.types import ReservePlan, ScopeRule
    return ReservePlan(uuid.uuid4().hex, (ScopeRule("t:other", rpm=10**9),), 1, 0, 1.0, 1.0)
