"""The fail-open limiter's arithmetic, and the budget counters both stores report with each
decision (what the limiter starts from)."""

from __future__ import annotations

import uuid

from policies.budgets import Scopes
from policies.budgets.fail_open import FailOpenLimiter
from policies.budgets.rules import periods, scope_rules
from policies.budgets.types import NO_LIMIT, Decision, RateLimitInfo, Reservation, ReservePlan, ScopeRule
from policies.limits_config import LimitsConfig
from tests.unit.test_budgets_stores import make_budgets, redis_url  # noqa: F401 - fixtures (both stores)

ACME = Scopes(api_key="ci", tenant="acme")
NOW_US = 1_780_000_000_000_000
DAY, MONTH = periods(NOW_US)[:2]


def _plan(config: LimitsConfig, tokens: int, cost: int = 0) -> ReservePlan:
    return ReservePlan(uuid.uuid4().hex, scope_rules(config, ACME), tokens, cost, 900.0, 3600.0)


async def test_both_stores_report_budget_counters_after_the_decision(make_budgets):
    limits = {"api_keys": {"by_id": {"ci": {"rpm": 1000}}},
              "tenants": {"by_id": {"acme": {"tokens_per_day": 100, "tokens_per_month": 1000, "cost_per_day": 1.0}}}}
    budgets = make_budgets(**limits)
    config = LimitsConfig.model_validate(limits)
    first = await budgets.store.reserve(_plan(config, 30, 7))
    assert first.code == "ok"
    assert first.counters == ((30, 7, 30, 7), (30, 7, 30, 7))        # the key counts too, without a budget
    second = await budgets.store.reserve(_plan(config, 50, 5))
    assert second.counters[1] == (80, 12, 80, 12)                    # after this reservation
    refused = await budgets.store.reserve(_plan(config, 50, 5))
    assert refused.code == "tokens_per_day:held" and refused.counters[1] == (80, 12, 80, 12)   # nothing added


def _decision(tokens_day: int, tokens_month: int = -1) -> Decision:
    return Decision("ok", None, None, NOW_US / 1e6, DAY, MONTH, RateLimitInfo(),
                    counters=((tokens_day, 0, tokens_month, 0 if tokens_month >= 0 else -1),))


def _local(reserved_tokens: int) -> Reservation:
    return Reservation(uuid.uuid4().hex, None, reserved_tokens, 0, DAY, MONTH, ("t:acme",), (1,), 0, local=True)


RULE = ScopeRule("t:acme", tokens_per_day=1000)


def test_known_usage_is_the_last_seen_net_of_local_usage_replayed_into_it():
    limiter = FailOpenLimiter(clock_us=lambda: NOW_US)
    assert limiter.known("t:acme", "d", DAY) == (0, 0)               # never seen: a fresh budget
    limiter.observe((RULE,), _decision(600))
    assert limiter.known("t:acme", "d", DAY) == (600, 0)
    limiter.replayed(_local(100), 200, 0)    # local usage that the local store also counts...
    assert limiter.known("t:acme", "d", DAY) == (600, 0)             # ...not in what was seen before
    limiter.observe((RULE,), _decision(900))                          # seen after the replay: in it
    assert limiter.known("t:acme", "d", DAY) == (700, 0)
    assert limiter.known("t:acme", "d", "19700101") == (0, 0)        # another day starts afresh


def test_local_limits_are_lowered_by_the_known_usage():
    limiter = FailOpenLimiter(clock_us=lambda: NOW_US)
    rules = (ScopeRule("k:ci", rpm=5), ScopeRule("t:acme", tokens_per_day=1000, tokens_per_month=5000))
    limiter.observe(rules, Decision("ok", None, None, 0, DAY, MONTH, RateLimitInfo(),
                                    counters=((-1, -1, -1, -1), (1200, 0, 3000, 0))))
    key, tenant = limiter.local_rules(rules, DAY, MONTH)
    assert key == rules[0]                                            # no budget: unchanged
    assert (tenant.tokens_per_day, tenant.tokens_per_month) == (0, 2000)   # never below zero
    assert tenant.cost_per_day == NO_LIMIT and tenant.budget_flags == rules[1].budget_flags


async def test_a_local_refusal_within_the_whole_budget_renews_with_the_period():
    limiter = FailOpenLimiter(clock_us=lambda: NOW_US)
    limiter.observe((RULE,), _decision(950))
    refused = await limiter.reserve(ReservePlan("r1", (RULE,), 100, 0, 900.0, 3600.0))
    assert refused.code == "tokens_per_day" and refused.retry_after_s == (periods(NOW_US)[2] - NOW_US) / 1e6
    too_big = await limiter.reserve(ReservePlan("r2", (RULE,), 2000, 0, 900.0, 3600.0))
    assert too_big.code == "tokens_per_day" and too_big.retry_after_s is None     # beyond the whole budget
    admitted = await limiter.reserve(ReservePlan("r3", (RULE,), 50, 0, 900.0, 3600.0))
    assert admitted.code == "ok"


def test_a_shared_reservation_settled_for_less_lowers_the_figures_it_was_seen_in():
    limiter = FailOpenLimiter(clock_us=lambda: NOW_US)
    limiter.observe((RULE,), _decision(850, 900))                    # 850 of it this request's hold
    shared = Reservation(uuid.uuid4().hex, None, 850, 0, DAY, MONTH, ("t:acme",), (3,), 0)
    limiter.settled(shared, 60, 0)
    assert limiter.known("t:acme", "d", DAY) == (60, 0)
    assert limiter.known("t:acme", "m", MONTH) == (110, 0)
    limiter.settled(Reservation("x", None, 100, 0, "19700101", MONTH, ("t:acme",), (1,), 0), 0, 0)
    assert limiter.known("t:acme", "d", DAY) == (60, 0)              # another day's reservation
