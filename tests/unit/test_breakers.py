"""Circuit-breaker transitions, one suite on the memory store and on a real redis-server.

Time is part of a breaker's state (open_s, probe_timeout_s, the sliding window). On the memory
store the suite drives a fake clock, so every transition is checked exactly. Redis has its own
clock, which the test cannot stop: there, waits are lower bounds (sleeping at least open_s
always ends the open state), and a check that something has NOT happened yet ("still open")
is asserted only when the test measured that less than the duration had passed since the
event; were the machine so loaded that it had passed, the breaker may have moved on, and the
test says nothing about that call instead of failing on it.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from policies.breakers import Breakers, MemoryBreakerStore, Outcome
from policies.breakers.redis_store import RedisBreakerStore
from policies.budgets.redis_store import make_redis_client
from policies.limits_config import BreakerSettings, BreakerTable, StoreConfig
from tests.clocks import FakeClock, RealClock
from tests.redis_server import running_redis


@pytest.fixture(scope="module")
def redis_url():
    with running_redis() as server:
        yield server.url


class Since:
    """Elapsed time since an event, measured from before the call that caused it."""

    def __init__(self, clock):
        self.clock, self.start = clock, clock.now()

    def elapsed(self) -> float:
        return self.clock.now() - self.start


async def refused_while_open(b, name, since: Since, open_s: float):
    """allow(name) just after the breaker opened: refused while open_s has not passed. Returns the
    refusal, or None when so much time passed that the breaker may be half-open (a probe it
    handed out is given back with a neutral outcome, leaving the state as it was)."""
    answer = await b.allow(name)
    if since.elapsed() < open_s:
        assert not answer.allowed and answer.state == "open", answer
        assert open_s - since.elapsed() - 1e-3 <= answer.retry_after <= open_s
        return answer
    if answer.allowed:
        await b.record(answer, Outcome.CLIENT_ERROR)
    return None


@pytest.fixture(params=["memory", "redis"])
async def make_breakers(request):
    """make(**settings) -> Breakers; all made in one test share one state (like two replicas).
    make.clock sleeps and tells the time as the store sees it."""
    kind = request.param
    clients = []
    clock = FakeClock() if kind == "memory" else RealClock()
    memory = MemoryBreakerStore(clock_us=clock)
    prefix = "b" + uuid.uuid4().hex[:10]

    def make(by_name=None, **settings) -> Breakers:
        table = BreakerTable(default=BreakerSettings(**settings),
                             by_name={n: BreakerSettings(**{**settings, **s}) for n, s in (by_name or {}).items()})
        if kind == "memory":
            return Breakers(table, memory)
        client = make_redis_client(StoreConfig(backend="redis", url=request.getfixturevalue("redis_url")))
        clients.append(client)
        return Breakers(table, RedisBreakerStore(client, prefix))

    make.clock = clock
    yield make
    for client in clients:
        await client.aclose()


async def calls(breakers, name, outcome, n, ttft_s=None):
    results = []
    for _ in range(n):
        permit = await breakers.allow(name)
        assert permit.allowed
        results.append(await breakers.record(permit, outcome, ttft_s))
    return results


async def test_opens_on_failure_rate_only_after_min_calls(make_breakers):
    b = make_breakers(min_calls=10, failure_rate=0.5, open_s=600)   # no test run lasts that long
    await calls(b, "big", Outcome.SUCCESS, 4)
    assert await calls(b, "big", Outcome.FAILURE, 4) == ["counted"] * 4   # 4/8 failed, but 8 < 10 calls
    assert (await b.state("big")).state == "closed"
    assert await calls(b, "big", Outcome.SUCCESS, 1) == ["counted"]        # 4/9
    since = Since(make_breakers.clock)
    assert await calls(b, "big", Outcome.FAILURE, 1) == ["opened"]         # 5/10
    assert await refused_while_open(b, "big", since, 600)
    assert (await b.allow("other")).allowed          # breakers are per name


async def test_client_errors_and_cancels_never_trip(make_breakers):
    b = make_breakers(min_calls=5, failure_rate=0.2)
    assert set(await calls(b, "big", Outcome.CLIENT_ERROR, 30)) == {"ignored"}
    assert set(await calls(b, "big", Outcome.CANCELLED, 10)) == {"ignored"}
    state = await b.state("big")
    assert (state.state, state.calls, state.failures) == ("closed", 0, 0)
    assert Outcome.from_status(404) is Outcome.CLIENT_ERROR and Outcome.from_status(503) is Outcome.FAILURE


async def test_slow_time_to_first_token_trips(make_breakers):
    b = make_breakers(min_calls=4, slow_ttft_s=0.5, slow_rate=0.75)
    await calls(b, "big", Outcome.SUCCESS, 2, ttft_s=0.1)
    # 5 slow of 7 calls stays under 0.75; the 6th slow call (6 of 8) trips it.
    assert await calls(b, "big", Outcome.SUCCESS, 6, ttft_s=2.0) == ["counted"] * 5 + ["opened"]
    assert (await b.state("big")).state == "open"


async def test_half_open_lets_a_limited_number_of_probes_through_and_closes(make_breakers):
    b = make_breakers(min_calls=2, failure_rate=0.5, open_s=0.2, half_open_probes=2)
    since = Since(make_breakers.clock)
    await calls(b, "big", Outcome.FAILURE, 2)
    await refused_while_open(b, "big", since, 0.2)
    await make_breakers.clock.sleep(0.25)
    p1, p2, p3 = await b.allow("big"), await b.allow("big"), await b.allow("big")
    assert p1.is_probe and p2.is_probe
    assert not p3.allowed and p3.state == "half_open"
    assert await b.record(p1, Outcome.SUCCESS, 0.1) == "counted"
    assert not (await b.allow("big")).allowed         # one success so far, one probe still out
    assert await b.record(p2, Outcome.SUCCESS, 0.1) == "closed"
    state = await b.state("big")
    assert (state.state, state.calls) == ("closed", 0)   # a fresh window after closing
    assert (await b.allow("big")).allowed


async def test_a_failed_probe_opens_again(make_breakers):
    b = make_breakers(min_calls=1, failure_rate=1.0, open_s=0.2, half_open_probes=3)
    await calls(b, "big", Outcome.FAILURE, 1)
    await make_breakers.clock.sleep(0.25)
    probe = await b.allow("big")
    other = await b.allow("big")
    since = Since(make_breakers.clock)
    assert await b.record(probe, Outcome.FAILURE) == "opened"
    assert await b.record(other, Outcome.SUCCESS) == "stale"   # issued in the half-open that ended
    await refused_while_open(b, "big", since, 0.2)             # open again, for a full open_s


async def test_a_neutral_probe_frees_its_slot(make_breakers):
    b = make_breakers(min_calls=1, failure_rate=1.0, open_s=0.2, half_open_probes=1)
    await calls(b, "big", Outcome.FAILURE, 1)
    await make_breakers.clock.sleep(0.25)
    probe = await b.allow("big")
    assert not (await b.allow("big")).allowed         # the one slot is taken (probe_timeout_s: 60 s)
    assert await b.record(probe, Outcome.CLIENT_ERROR) == "ignored"
    assert (await b.allow("big")).is_probe


async def test_an_abandoned_probe_expires(make_breakers):
    b = make_breakers(min_calls=1, failure_rate=1.0, open_s=0.1, half_open_probes=1, probe_timeout_s=0.2)
    await calls(b, "big", Outcome.FAILURE, 1)
    await make_breakers.clock.sleep(0.15)
    since = Since(make_breakers.clock)
    assert (await b.allow("big")).is_probe           # never recorded: a crashed replica
    taken = await b.allow("big")
    if since.elapsed() < 0.2:                        # the probe has not timed out yet: its slot is taken
        assert not taken.allowed
    await make_breakers.clock.sleep(0.25)
    assert (await b.allow("big")).is_probe


async def test_calls_from_before_a_transition_are_ignored(make_breakers):
    b = make_breakers(min_calls=2, failure_rate=0.5, open_s=0.1, half_open_probes=1)
    slow_call = await b.allow("big")
    await calls(b, "big", Outcome.FAILURE, 2)          # opens while slow_call is still running
    assert await b.record(slow_call, Outcome.FAILURE) == "stale"
    await make_breakers.clock.sleep(0.15)
    probe = await b.allow("big")
    assert await b.record(probe, Outcome.SUCCESS) == "closed"
    assert await b.record(slow_call, Outcome.FAILURE) == "stale"
    assert (await b.state("big")).failures == 0


async def test_failures_slide_out_of_the_window(make_breakers):
    b = make_breakers(window_s=0.5, min_calls=4, failure_rate=0.5)
    await calls(b, "big", Outcome.FAILURE, 3)
    await make_breakers.clock.sleep(0.6)
    assert await calls(b, "big", Outcome.FAILURE, 1) == ["counted"]   # 1 call in the window
    assert (await b.state("big")).calls == 1


async def test_two_replicas_share_one_breaker(make_breakers):
    one, two = make_breakers(min_calls=3, failure_rate=0.5, open_s=0.3, half_open_probes=1), \
        make_breakers(min_calls=3, failure_rate=0.5, open_s=0.3, half_open_probes=1)
    await calls(one, "big", Outcome.FAILURE, 2)
    since = Since(make_breakers.clock)
    assert await calls(two, "big", Outcome.FAILURE, 1) == ["opened"]
    await refused_while_open(one, "big", since, 0.3)            # the other replica sees it open
    await make_breakers.clock.sleep(0.35)
    probe = await two.allow("big")
    assert probe.is_probe and not (await one.allow("big")).allowed   # the probe slot is shared
    await two.record(probe, Outcome.SUCCESS)
    assert (await one.state("big")).state == "closed"


async def test_first_available_walks_the_fallback_chain(make_breakers):
    # No test run lasts 10 minutes: neither breaker closes during the test.
    b = make_breakers(min_calls=1, failure_rate=1.0, open_s=600, by_name={"small": {"open_s": 1200}})
    since = Since(make_breakers.clock)
    await calls(b, "big", Outcome.FAILURE, 1)
    permit = await b.first_available(["big", "small"])
    assert permit.allowed and permit.name == "small"
    await calls(b, "small", Outcome.FAILURE, 1)
    none = await b.first_available(["big", "small"])
    assert not none.allowed and none.names == ("big", "small")
    # The shortest wait of the chain: big's (600 s), not small's (1200 s).
    assert 600 - since.elapsed() - 1e-3 <= none.retry_after <= 600


class _SlowReplies(MemoryBreakerStore):
    """Answers ALLOW at once but delivers the answer only when `release` is set: a reply still
    on the wire while another request's outcome trips the breaker."""

    def __init__(self):
        super().__init__()
        self.release = asyncio.Event()
        self.allows = 0

    async def allow(self, *args):
        self.allows += 1
        answer = await super().allow(*args)
        await self.release.wait()
        return answer


async def test_a_closed_answer_read_before_a_trip_is_not_cached_after_it():
    store = _SlowReplies()
    breakers = Breakers(BreakerTable(default=BreakerSettings(min_calls=1, failure_rate=0.5, open_s=30)), store,
                        closed_cache_s=30)
    store.release.set()
    first = await breakers.allow("t")                    # "closed", now cached
    breakers._closed_until.clear()                        # the cache expires: the next ALLOW asks the store
    store.release.clear()
    slow = asyncio.create_task(breakers.allow("t"))      # read "closed" in the store, reply held back
    await asyncio.sleep(0)
    assert await breakers.record(first, Outcome.FAILURE) == "opened"   # another request trips it
    store.release.set()
    assert (await slow).allowed                           # the late reply still lets its own call go
    refused = await breakers.allow("t")                   # but was not cached: the store says open
    assert not refused.allowed and refused.state == "open"
    assert store.allows == 3
