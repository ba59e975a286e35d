"""One suite, two stores: every budget and rate-limit behaviour on the memory store and on a
real redis-server started by the test (never the system Redis).

The memory store runs on a fake clock that moves only when the test sleeps, so timed behaviour
(expiry, Retry-After) is checked exactly there. Redis keeps its own clock: there every decision
is judged by the store time it carries (Admission.store_time), never by how long the test took,
and a check that something has not expired yet is made only when the store's clock says so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import pytest

from policies.budgets import Budgets, FinishStatus, MemoryBudgetStore, Scopes
from policies.budgets.rules import NANO_PER_USD
from policies.limits_config import LimitsConfig
from tests.clocks import FakeClock, RealClock
from tests.redis_server import running_redis

ACME = Scopes(api_key="ci", tenant="acme", tier="small", session=None)


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as server:
        yield server.url


@pytest.fixture(params=["memory", "redis"])
async def make_budgets(request):
    """make(**limits) -> Budgets. Budgets made in one test share one store (two 'replicas').
    make.clock sleeps and tells the time as the store sees it."""
    kind = request.param
    url = request.getfixturevalue("redis_url") if kind == "redis" else None
    prefix = "t" + uuid.uuid4().hex[:10]
    clock = FakeClock() if kind == "memory" else RealClock()
    memory = MemoryBudgetStore(clock_us=clock)
    made = []

    def make(**limits) -> Budgets:
        store = {"backend": "memory"} if kind == "memory" else {"backend": "redis", "url": url, "key_prefix": prefix}
        store.update(limits.pop("store", {}))
        cfg = LimitsConfig.model_validate({"store": store, **limits})
        budgets = Budgets(cfg, memory, shared=False) if kind == "memory" else Budgets.from_config(cfg)
        made.append(budgets)
        return budgets

    make.kind = kind
    make.clock = clock
    yield make
    for budgets in made:
        await budgets.close()


def tenant_limits(**limits) -> dict:
    return {"tenants": {"by_id": {"acme": limits}}}


async def test_token_budget_admits_up_to_the_budget_and_no_further(make_budgets):
    budgets = make_budgets(**tenant_limits(tokens_per_day=1000))
    admitted = [await budgets.reserve(ACME, 60, 40) for _ in range(10)]
    assert all(a.allowed for a in admitted)
    # Full, but only with what requests in flight hold: they may give most of it back, so this is
    # a short wait (rate_limit_exceeded), not a spent budget.
    held = await budgets.reserve(ACME, 1, 0)
    assert not held.allowed and held.reason == "rate_limit_exceeded"
    assert held.scope == "t:acme" and held.limit_kind == "tokens_per_day:held"
    assert held.retry_after == pytest.approx(1.0) and "held by requests in flight" in held.message
    # Reconciling to less than the estimate gives the rest back, to the token.
    assert await budgets.reconcile(admitted[0].reservation, 30, 10) is FinishStatus.APPLIED
    assert not (await budgets.reserve(ACME, 61, 0)).allowed
    last = await budgets.reserve(ACME, 60, 0)
    assert last.allowed
    usage = await budgets.usage("t:acme")
    assert usage.used_tokens_day == 40 and usage.reserved_tokens_day == 960
    # Every reservation used in full: the budget is spent and renews at the next UTC midnight of
    # the store's clock.
    for a in admitted[1:]:
        await budgets.reconcile(a.reservation, 60, 40)
    await budgets.reconcile(last.reservation, 60, 0)
    refused = await budgets.reserve(ACME, 1, 0)
    assert not refused.allowed and refused.reason == "insufficient_quota"
    assert refused.scope == "t:acme" and refused.limit_kind == "tokens_per_day"
    assert "tenant 'acme'" in refused.message
    now = dt.datetime.fromtimestamp(refused.store_time, dt.UTC)
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    assert refused.retry_after == pytest.approx((midnight - now).total_seconds(), abs=0.01)
    usage = await budgets.usage("t:acme")
    assert (usage.used_tokens_day, usage.reserved_tokens_day) == (1000, 0)
    assert usage.day == now.strftime("%Y%m%d") and usage.month == now.strftime("%Y%m")


async def test_a_request_larger_than_the_whole_budget_is_told_so(make_budgets):
    budgets = make_budgets(**tenant_limits(tokens_per_month=100))
    refused = await budgets.reserve(ACME, 80, 21)
    assert refused.reason == "insufficient_quota" and refused.retry_after is None
    assert "exceeds the whole budget" in refused.message


async def test_reconcile_and_release_happen_exactly_once(make_budgets):
    budgets = make_budgets(**tenant_limits(tokens_per_day=10_000, max_concurrent=5))
    a = (await budgets.reserve(ACME, 100, 100)).reservation
    b = (await budgets.reserve(ACME, 100, 100)).reservation
    assert await budgets.reconcile(a, 100, 50) is FinishStatus.APPLIED
    assert await budgets.reconcile(a, 100, 50) is FinishStatus.DUPLICATE
    assert await budgets.release(a) is FinishStatus.DUPLICATE
    assert await budgets.release(b) is FinishStatus.APPLIED
    assert await budgets.reconcile(b, 100, 100) is FinishStatus.DUPLICATE
    usage = await budgets.usage("t:acme")
    assert (usage.used_tokens_day, usage.reserved_tokens_day, usage.in_flight) == (150, 0, 0)
    assert await budgets.held() == 0


async def test_two_replicas_finishing_the_same_reservation_apply_it_once(make_budgets):
    limits = tenant_limits(tokens_per_day=10_000)
    one, two = make_budgets(**limits), make_budgets(**limits)
    res = (await one.reserve(ACME, 10, 90)).reservation
    results = await asyncio.gather(*[(one if i % 2 else two).reconcile(res, 10, 20) for i in range(20)])
    assert results.count(FinishStatus.APPLIED) == 1
    assert results.count(FinishStatus.DUPLICATE) == 19
    assert (await one.usage("t:acme")).used_tokens_day == 30


async def test_an_abandoned_reservation_expires_and_frees_capacity(make_budgets):
    budgets = make_budgets(store={"reservation_ttl_s": 0.4}, retry={"deadline_s": 0.2},
                           **tenant_limits(max_concurrent=1, tokens_per_day=1000))
    abandoned = await budgets.reserve(ACME, 500, 300)
    assert abandoned.allowed
    blocked = await budgets.reserve(ACME, 10, 10)
    if blocked.store_time < abandoned.reservation.expires_at:      # on the store's clock: not expired yet
        assert blocked.reason == "rate_limit_exceeded" and blocked.limit_kind == "max_concurrent"
    elif blocked.allowed:       # the machine was so slow that it had expired: hand this one back
        await budgets.release(blocked.reservation)
    await make_budgets.clock.sleep(0.5)
    after = await budgets.reserve(ACME, 100, 100)  # both the slot and the 800 reserved tokens came back
    assert after.allowed
    usage = await budgets.usage("t:acme")
    checked_at = make_budgets.clock.now()          # the usage was read before this
    assert usage.reserved_tokens_day == 200
    if checked_at < after.reservation.expires_at:
        assert usage.in_flight == 1
    # The gateway that held it was only slow: its late reconcile still counts the usage.
    assert await budgets.reconcile(abandoned.reservation, 500, 120) is FinishStatus.LATE
    usage = await budgets.usage("t:acme")
    assert (usage.used_tokens_day, usage.reserved_tokens_day) == (620, 200)


async def probe_until_admitted(budgets, clock, scopes, tokens, limit_s=60.0):
    """Reserve every 5 ms (of the store's clock) until admitted; return (refusals, the admission).
    A refusal changes nothing in the store."""
    refusals = []
    deadline = clock.now() + limit_s
    while clock.now() < deadline:
        a = await budgets.reserve(scopes, tokens, 0)
        if a.allowed:
            return refusals, a
        refusals.append(a)
        await clock.sleep(0.005)
    raise AssertionError("never admitted")


async def assert_retry_after_is_exact(budgets, clock, tokens, kind, rounds=40):
    """Refused -> poll -> admitted, repeatedly: every refusal comes before the Retry-After the first
    one gave (on the store's clock) and the first admission after it. A round whose polling only
    began after that time observed nothing; at least two rounds must have seen the boundary (on
    a loaded machine more rounds are needed, never a faster machine)."""
    observed = 0
    for _ in range(rounds):
        first = await budgets.reserve(ACME, tokens, 0)
        if first.allowed:
            continue
        assert first.limit_kind == kind and first.retry_after > 0
        due = first.store_time + first.retry_after
        refusals, admitted = await probe_until_admitted(budgets, clock, ACME, tokens)
        assert all(r.store_time < due for r in refusals)     # every refusal came before Retry-After
        assert admitted.store_time >= due - 1e-6             # and the first admission after it
        observed += bool(refusals)
        if observed == 2:
            return
    raise AssertionError("no round polled before its Retry-After: the test proved nothing")


async def test_rpm_retry_after_is_exact_on_the_store_clock(make_budgets):
    budgets = make_budgets(**tenant_limits(rpm=240))   # one request per 0.25 s, burst of 240
    burst = 0
    while (first := await budgets.reserve(ACME, 1, 0)).allowed:
        burst += 1
    assert burst >= 240          # the burst, plus one per 0.25 s the burst took
    assert first.reason == "rate_limit_exceeded" and first.limit_kind == "rpm"
    assert 0 < first.retry_after <= 0.25
    assert first.limits.limit_requests == 240 and first.limits.remaining_requests == 0
    await assert_retry_after_is_exact(budgets, make_budgets.clock, 1, "rpm")


async def test_tpm_retry_after_is_exact_and_counts_reconciled_tokens(make_budgets):
    budgets = make_budgets(**tenant_limits(tpm=12_000))  # 5 ms per token
    big = await budgets.reserve(ACME, 2000, 10_000)
    assert big.allowed and big.limits.remaining_tokens == 0
    # Only 6,000 tokens were used: the other 6,000 are available at once (without the refund
    # they would come back only after 30 s).
    await budgets.reconcile(big.reservation, 2000, 4000)
    assert (await budgets.reserve(ACME, 6000, 0)).allowed
    first = await budgets.reserve(ACME, 60, 0)
    if not first.allowed:       # the full minute is taken: 60 x 5 ms after big, on the store's clock
        assert first.limit_kind == "tpm"
        assert first.retry_after == pytest.approx(0.3 - (first.store_time - big.store_time), abs=1e-3)
    await assert_retry_after_is_exact(budgets, make_budgets.clock, 60, "tpm")


async def test_a_request_above_the_tpm_limit_is_never_admitted(make_budgets):
    budgets = make_budgets(**tenant_limits(tpm=1000))
    refused = await budgets.reserve(ACME, 900, 101)
    assert refused.reason == "rate_limit_exceeded" and refused.retry_after is None
    assert "Request too large" in refused.message


async def test_all_scopes_or_none(make_budgets):
    """A refusal in one scope reserves nothing in the others."""
    budgets = make_budgets(api_keys={"by_id": {"ci": {"rpm": 1}}},
                           **tenant_limits(tokens_per_day=1000, max_concurrent=10),
                           tiers={"default": {"tpm": 600}})   # 0.1 s per token
    assert (await budgets.reserve(ACME, 10, 10)).allowed
    refused = await budgets.reserve(ACME, 10, 10)
    assert refused.scope == "k:ci" and refused.limit_kind == "rpm"
    usage = await budgets.usage("t:acme")
    assert (usage.reserved_tokens_day, usage.in_flight) == (20, 1)
    # The tier scope was not charged for the refused request either (560 if it had been).
    assert (await budgets.reserve(Scopes(tier=ACME.tier), 580, 0)).allowed   # headers no longer show tier scopes


async def test_budgets_win_over_rate_limits_and_quota_names_the_scope(make_budgets):
    budgets = make_budgets(api_keys={"default": {"rpm": 1}}, **tenant_limits(tokens_per_day=10))
    first = await budgets.reserve(ACME, 5, 5)
    assert first.allowed
    await budgets.reconcile(first.reservation, 5, 5)
    refused = await budgets.reserve(ACME, 5, 5)   # over both the key's rpm and the tenant's spent budget
    assert refused.reason == "insufficient_quota" and refused.scope == "t:acme"


async def test_cost_budget_from_tier_prices(make_budgets):
    budgets = make_budgets(prices={"small": {"input_per_1m": 1.0, "output_per_1m": 4.0}},
                           **tenant_limits(cost_per_day=0.01))       # $0.01 = 1,000 in + 2,250 out
    a = await budgets.reserve(ACME, 1000, 2000)                     # $0.001 + $0.008
    assert a.allowed
    refused = await budgets.reserve(ACME, 1000, 1)                 # fits beside what was spent: held
    assert refused.reason == "rate_limit_exceeded" and refused.limit_kind == "cost_per_day:held"
    assert "$0.01 per day" in refused.message
    await budgets.reconcile(a.reservation, 1000, 500)               # $0.001 + $0.002 actually spent
    usage = await budgets.usage("t:acme")
    assert usage.used_cost_day == int(0.003 * NANO_PER_USD) and usage.reserved_cost_day == 0
    assert (await budgets.reserve(ACME, 1000, 1500)).allowed        # $0.007 more fits exactly


async def test_sessions_are_limited_per_tenant(make_budgets):
    budgets = make_budgets(sessions={"default": {"rpm": 2}})
    loop_a = Scopes(tenant="acme", session="agent-1")
    other_tenant = Scopes(tenant="globex", session="agent-1")
    assert (await budgets.reserve(loop_a, 1, 1)).allowed
    assert (await budgets.reserve(loop_a, 1, 1)).allowed
    stopped = await budgets.reserve(loop_a, 1, 1)
    assert stopped.scope == "s:acme/agent-1" and "session 'agent-1'" in stopped.message
    assert (await budgets.reserve(other_tenant, 1, 1)).allowed  # same session id, other tenant
    assert (await budgets.reserve(Scopes(tenant="acme", session="agent-2"), 1, 1)).allowed


async def test_headers_report_the_most_constrained_scope(make_budgets):
    budgets = make_budgets(api_keys={"default": {"rpm": 100, "tpm": 50_000}},
                           **tenant_limits(rpm=10, tpm=100_000))
    a = await budgets.reserve(ACME, 300, 200)
    assert (a.limits.limit_requests, a.limits.remaining_requests) == (10, 9)
    assert (a.limits.limit_tokens, a.limits.remaining_tokens) == (50_000, 49_500)
    assert a.limits.reset_requests_s == pytest.approx(6.0, abs=0.01)   # 60 s / 10 per request
    assert a.limits.reset_tokens_s == pytest.approx(0.6, abs=0.01)     # 500 tokens of 50,000/min


async def test_unlimited_requests_skip_the_store(make_budgets):
    budgets = make_budgets()
    a = await budgets.reserve(ACME, 10, 10)
    assert a.allowed and a.reservation.scopes == ()
    assert await budgets.reconcile(a.reservation, 1, 1) is FinishStatus.NOOP


async def test_concurrent_reserves_never_exceed_the_budget(make_budgets):
    """1,000 concurrent requests from two Budgets (two connection pools on Redis) against one
    token budget: exactly as many as fit are admitted; after reconciling nothing is reserved."""
    # A generous timeout: 1,000 tasks on one event loop on a busy CI machine must not look like an outage.
    limits = tenant_limits(tokens_per_day=50_000, max_concurrent=2000) | {"store": {"timeout_s": 60}}
    replicas = [make_budgets(**limits), make_budgets(**limits)]
    admissions = await asyncio.gather(*[replicas[i % 2].reserve(ACME, 70, 30) for i in range(1000)])
    admitted = [a for a in admissions if a.allowed]
    assert len(admitted) == 500                     # 500 x 100 tokens: the budget exactly
    # Nothing is spent yet: every refusal is the budget held by the admitted ones, a short wait.
    assert all(a.limit_kind == "tokens_per_day:held" for a in admissions if not a.allowed)
    usage = await replicas[0].usage("t:acme")
    assert usage.reserved_tokens_day == 50_000 and usage.in_flight == 500
    # Finish concurrently, some twice and from both replicas; a third are released (errors).
    actual = {}
    jobs = []
    for i, a in enumerate(admitted):
        if i % 3 == 0:
            jobs.append(replicas[i % 2].release(a.reservation))
            actual[a.reservation.id] = 0
        else:
            out = i % 31
            jobs.append(replicas[i % 2].reconcile(a.reservation, 70, out))
            jobs.append(replicas[(i + 1) % 2].reconcile(a.reservation, 70, out))
            actual[a.reservation.id] = 70 + out
    results = await asyncio.gather(*jobs)
    assert results.count(FinishStatus.APPLIED) == 500
    usage = await replicas[1].usage("t:acme")
    assert usage.used_tokens_day == sum(actual.values()) <= 50_000
    assert (usage.reserved_tokens_day, usage.in_flight) == (0, 0)
    assert await replicas[0].held() == 0


async def test_the_redis_calendar_matches_python(redis_url):
    """The script names days and months from Redis' clock with its own calendar code."""
    import redis.asyncio as aioredis

    from policies.budgets.lua_scripts import CALENDAR
    from policies.budgets.rules import periods

    script = CALENDAR + r"""
    local out = {}
    for i = 1, #ARGV do
      local days = tonumber(ARGV[i])
      local y, m, d = civil(days)
      local ny, nm = y, m + 1
      if nm > 12 then ny, nm = y + 1, 1 end
      out[i] = string.format('%04d%02d%02d %d', y, m, d, days_from_civil(ny, nm, 1))
    end
    return out
    """
    days = list(range(-800, 800, 7)) + list(range(19_000, 21_000)) + [47_541, 47_542, 2_932_896]
    client = aioredis.Redis.from_url(redis_url)
    try:
        got = await client.eval(script, 0, *days)
    finally:
        await client.aclose()
    for d, line in zip(days, got, strict=True):
        day, _month, _, next_month = periods(d * 86_400 * 1_000_000)
        assert line.decode() == f"{day} {next_month // (86_400 * 1_000_000)}"


async def test_a_budget_added_later_starts_from_what_its_period_already_used(make_budgets):
    """Every limited scope counts its day and month use, whichever budgets it has: a month budget
    added by a reload (a new Budgets on the same store) sees what the month used before it, and a
    key with only an rpm limit still shows its tokens."""
    before = make_budgets(api_keys={"by_id": {"ci": {"rpm": 1000}}}, **tenant_limits(tokens_per_day=10_000))
    spent = await before.reserve(ACME, 200, 100)
    await before.reconcile(spent.reservation, 200, 100)
    assert (await before.usage("k:ci")).used_tokens_month == 300
    after = make_budgets(api_keys={"by_id": {"ci": {"rpm": 1000}}},
                         **tenant_limits(tokens_per_day=10_000, tokens_per_month=400))
    refused = await after.reserve(ACME, 150, 0)
    assert not refused.allowed and (refused.reason, refused.limit_kind) == ("insufficient_quota", "tokens_per_month")
    assert (await after.reserve(ACME, 100, 0)).allowed
