"""The console's memory: the decision ring, the per-tier series (bounded, closed once a second),
and what the recorder derives from a finished request (breaker transitions with their cause,
budget refusals, scopes seen), written to the history in one flush."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gateway.console.history import MAX_SCOPES, MemoryHistory
from gateway.console.recorder import ConsoleRecorder
from gateway.context import RequestContext
from gateway.skips import Skip, SkipReason
from gateway.telemetry.decision_log import DecisionLog
from gateway.telemetry.tier_series import TierSeries
from policies.budgets.types import Admission, RateLimitInfo
from policies.limits_config import BreakerSettings


def _ctx(i: int = 0, tier: str | None = "small", **fields) -> RequestContext:
    ctx = RequestContext(f"req-{i}", "chat", model="auto", profile="latency", profile_source="hint",
                         route_reason="latency", chain=("small", "large"), tier=tier, tenant="acme", **fields)
    ctx.usage.completion_tokens = 6
    ctx.first_token_at = ctx.started + 0.05
    ctx.finished_at = ctx.started + 0.3
    return ctx


def test_decision_log_keeps_the_last_n_newest_first():
    log = DecisionLog(size=3)
    assert log.record(RequestContext("unrouted", "chat")) is None      # refused before classification
    for i in range(5):
        log.record(_ctx(i))
    assert [d["request_id"] for d in log.recent()] == ["req-4", "req-3", "req-2"] and log.total == 5
    d = log.recent(1)[0]
    assert d["chain"] == ["small", "large"] and d["tier"] == "small" and d["rule"] == "latency"
    assert d["overhead_ms"] >= 0 and d["ttft_ms"] == 50.0


def test_series_closes_a_point_per_sample_and_stays_bounded():
    now = [1000.0]
    series = TierSeries(points=4, clock=lambda: now[0])
    series.request_done("small", output_tokens=10, failed=False, ttft_s=0.1, tpot_s=0.02)
    series.request_done("small", output_tokens=0, failed=True, ttft_s=None, tpot_s=None)
    series.sample({"small": {"queue": 2, "running": 3, "kv_usage": 0.5, "in_flight": 1}, "large": {}})
    view = series.view("small")
    point = dict(zip(view["fields"], view["points"][0]))
    assert point == {"t": 1000.0, "requests": 2, "errors": 1, "output_tokens": 10, "ttft_ms": 100.0, "tpot_ms": 20.0,
                     "queue": 2, "running": 3, "kv_usage": 0.5, "in_flight": 1}
    for _ in range(10):
        now[0] += 1
        series.sample({"small": {}})
    assert len(series.view("small")["points"]) == 4 and series.tiers() == ["small"]     # large was removed
    assert series.view("small")["totals"] == {"requests": 2, "errors": 1, "output_tokens": 10}


def _runtime():
    breakers = SimpleNamespace(settings=lambda _: BreakerSettings(min_calls=2))
    limits = SimpleNamespace(breakers=breakers, shared=False, active=True)
    return SimpleNamespace(limits=limits, tiers={})


def test_recorder_derives_breaker_transitions_refusals_and_scopes():
    recorder = ConsoleRecorder(SimpleNamespace(current=_runtime()), replica="test:1")
    rt = recorder.holder.current
    opened = _ctx(1)
    opened.fallbacks.append(Skip("large", SkipReason.TIER_FAILURE, "failed: answered 502"))
    opened.breaker_events += [("large", "failure"), ("large", "opened"), ("small", "success")]
    probe = _ctx(2)
    probe.breaker_events += [("large", "probe"), ("large", "success"), ("large", "closed")]
    refused = _ctx(3, tier=None, status=429)
    refused.admission = Admission(False, "insufficient_quota", "no", None, RateLimitInfo(), None, scope="t:acme",
                                  limit_kind="tokens_per_day")
    limits = SimpleNamespace(call=SimpleNamespace(body=SimpleNamespace(n=1)), limits=rt.limits,
                             api_key="key-1", session="s-9")
    for ctx in (opened, probe, refused):
        recorder.request_ended(rt, ctx, limits)
    assert recorder.series.view("large")["totals"] == {"requests": 1, "errors": 1, "output_tokens": 0}
    asyncio.run(recorder.flush(rt))
    history = recorder.memory
    events = asyncio.run(history.breaker_events(["large"]))["large"]
    assert [e["event"] for e in events] == ["closed", "probe", "opened"]           # newest first
    assert "failed: answered 502" in events[2]["why"] and ">= 2 calls" in events[2]["why"]
    counts, recent = asyncio.run(history.refusals())
    assert [(c.scope, c.kind, c.count) for c in counts.counted] == [("t:acme", "tokens_per_day", 1)]
    assert recent[0]["replica"] == "test:1"
    seen = asyncio.run(history.seen(10))
    assert seen == {"tenant": ["acme"], "api_key": ["key-1"], "session": ["acme/s-9"]}
    assert len(recorder.decisions) == 3


def test_memory_history_keeps_at_most_max_scopes():
    history = MemoryHistory()
    asyncio.run(history.add_seen({"tenant": {f"t{i}": float(i) for i in range(MAX_SCOPES + 10)}}))
    seen = asyncio.run(history.seen(MAX_SCOPES + 10))["tenant"]
    assert len(seen) == MAX_SCOPES and seen[0] == f"t{MAX_SCOPES + 9}"
