"""/metrics served by a real uvicorn on loopback, scraped over HTTP and parsed with
prometheus_client's own parser."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import httpx
import prometheus_client
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from engines.stats import EngineStats
from gateway.telemetry.metrics import GatewayMetrics, metrics_route

ALLOWED_LABELS = {"tier", "profile", "tenant_class", "type", "reason", "state"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve():
    """Serve a GatewayMetrics' /metrics on loopback; yields a function returning the base URL."""
    servers = []

    def start(metrics: GatewayMetrics) -> str:
        port = _free_port()
        app = Starlette(routes=[metrics_route(metrics)])
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def scrape(base: str) -> dict:
    """{(sample name, sorted label items): value} of one real HTTP scrape."""
    resp = httpx.get(f"{base}/metrics", timeout=5)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    out = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            assert set(s.labels) - {"le"} <= ALLOWED_LABELS, s
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**kw) -> tuple:
    return tuple(sorted(kw.items()))


REQ = {"tier": "small", "profile": "latency", "tenant_class": "pro"}


def test_scrape_request_histograms_tokens_budgets_tiers_and_breakers(serve):
    metrics = GatewayMetrics()
    stats = EngineStats(kv_blocks_total=200, kv_blocks_used=50, prefix_queried_tokens=400, prefix_hit_tokens=100,
                        preemptions=3, queue_depth=7, running=12)
    metrics.add_tier("small", lambda: stats)
    breakers = {"small": "closed", "remote": "open"}
    metrics.set_breaker_source(lambda: breakers)
    metrics.observe_request(**REQ, duration_s=0.5, ttft_s=0.09, input_tokens=20, output_tokens=5,
                            cache_read_tokens=16)
    metrics.observe_request(**REQ, duration_s=2.0, ttft_s=0.3, input_tokens=8, output_tokens=1,
                            error_reason="engine_error")
    metrics.budget_rejected(tenant_class="free", reason="tokens_per_minute")
    metrics.budget_rejected(tenant_class="free", reason="tokens_per_minute")
    metrics.budget_rejected(tenant_class="free", reason="concurrency")
    base = serve(metrics)
    m = scrape(base)
    req = labels(**REQ)

    ttft = "gen_ai_server_time_to_first_token_seconds"
    assert m[(f"{ttft}_count", req)] == 1  # the failed request has no TTFT
    assert m[(f"{ttft}_sum", req)] == pytest.approx(0.09)
    assert m[(f"{ttft}_bucket", labels(**REQ, le="0.08"))] == 0
    assert m[(f"{ttft}_bucket", labels(**REQ, le="0.1"))] == 1
    tpot = "gen_ai_server_time_per_output_token_seconds"
    assert m[(f"{tpot}_count", req)] == 1
    assert m[(f"{tpot}_sum", req)] == pytest.approx((0.5 - 0.09) / 4)
    dur = "gen_ai_server_request_duration_seconds"
    assert m[(f"{dur}_count", req)] == 2 and m[(f"{dur}_sum", req)] == pytest.approx(2.5)
    assert m[(f"{dur}_bucket", labels(**REQ, le="0.64"))] == 1
    assert m[(f"{dur}_bucket", labels(**REQ, le="+Inf"))] == 2

    assert m[("tiergate_tokens_total", labels(**REQ, type="input"))] == 28
    assert m[("tiergate_tokens_total", labels(**REQ, type="output"))] == 6
    assert m[("tiergate_tokens_total", labels(**REQ, type="cache_read"))] == 16
    assert m[("tiergate_request_errors_total", labels(tier="small", reason="engine_error"))] == 1
    assert m[("tiergate_budget_rejections_total", labels(tenant_class="free", reason="tokens_per_minute"))] == 2
    assert m[("tiergate_budget_rejections_total", labels(tenant_class="free", reason="concurrency"))] == 1

    t = labels(tier="small")
    assert m[("tiergate_tier_kv_cache_usage_ratio", t)] == 0.25
    assert m[("tiergate_tier_prefix_cache_hit_ratio", t)] == 0.25
    assert m[("tiergate_tier_prefix_cache_queried_tokens_total", t)] == 400
    assert m[("tiergate_tier_prefix_cache_hit_tokens_total", t)] == 100
    assert m[("tiergate_tier_preemptions_total", t)] == 3
    assert m[("tiergate_tier_queue_depth", t)] == 7
    assert m[("tiergate_tier_running_sequences", t)] == 12
    assert not any(name.startswith("tiergate_tier_spec_") for name, _ in m)  # this engine does not speculate

    for tier, current in breakers.items():
        for state in ("closed", "open", "half_open"):
            assert m[("tiergate_breaker_state", labels(tier=tier, state=state))] == (state == current)

    # Engine figures and breaker states are read at scrape time, not copied at registration.
    stats.kv_blocks_used, stats.queue_depth, stats.preemptions = 150, 0, 4
    breakers["remote"] = "half_open"
    m = scrape(base)
    assert m[("tiergate_tier_kv_cache_usage_ratio", t)] == 0.75
    assert m[("tiergate_tier_queue_depth", t)] == 0
    assert m[("tiergate_tier_preemptions_total", t)] == 4
    assert m[("tiergate_breaker_state", labels(tier="remote", state="half_open"))] == 1
    assert m[("tiergate_breaker_state", labels(tier="remote", state="open"))] == 0


def test_speculative_figures_appear_for_tiers_that_have_them(serve):
    spec = EngineStats(running=2)
    spec.spec_source("ngram", max_drafts=4).record(proposed=4, accepted=3)
    spec.spec_source("self", max_drafts=4).record(proposed=4, accepted=0)
    not_yet = EngineStats()
    not_yet.spec_source("ngram", max_drafts=4)  # speculating engine before its first verification

    @dataclass
    class UpstreamStats:  # an upstream tier may report only what it knows
        running: int = 5

    metrics = GatewayMetrics()
    metrics.add_tier("spec", lambda: spec)
    metrics.add_tier("plain", lambda: EngineStats(running=1))
    metrics.add_tier("not_yet", lambda: not_yet)
    metrics.add_tier("remote", UpstreamStats)
    m = scrape(serve(metrics))
    assert m[("tiergate_tier_spec_acceptance_ratio", labels(tier="spec"))] == 3 / 8
    assert m[("tiergate_tier_spec_accepted_tokens_total", labels(tier="spec"))] == 3
    assert m[("tiergate_tier_spec_proposed_tokens_total", labels(tier="spec"))] == 8
    assert m[("tiergate_tier_running_sequences", labels(tier="spec"))] == 2
    assert ("tiergate_tier_spec_acceptance_ratio", labels(tier="plain")) not in m
    # No proposal yet: counters at 0, but no ratio (0/0 is not an acceptance rate of 0).
    assert m[("tiergate_tier_spec_proposed_tokens_total", labels(tier="not_yet"))] == 0
    assert ("tiergate_tier_spec_acceptance_ratio", labels(tier="not_yet")) not in m
    # Fields a stats object lacks are left out rather than reported as 0.
    assert m[("tiergate_tier_running_sequences", labels(tier="remote"))] == 5
    assert not any(dict(lbl).get("tier") == "remote" for name, lbl in m if name != "tiergate_tier_running_sequences")


def test_a_failing_stats_source_does_not_break_the_scrape(serve, caplog):
    def dead():
        raise RuntimeError("engine stopped")

    def broken_breakers():
        raise RuntimeError("redis down")

    metrics = GatewayMetrics()
    metrics.add_tier("dead", dead)
    metrics.add_tier("alive", lambda: EngineStats(queue_depth=2))
    metrics.set_breaker_source(broken_breakers)
    m = scrape(serve(metrics))
    assert m[("tiergate_tier_queue_depth", labels(tier="alive"))] == 2
    assert not any(dict(lbl).get("tier") == "dead" for _, lbl in m)
    assert "stats of tier 'dead' failed" in caplog.text and "breaker states failed" in caplog.text


def test_tpot_needs_two_output_tokens_and_ttft():
    metrics = GatewayMetrics()
    metrics.observe_request(**REQ, duration_s=0.2, ttft_s=0.2, output_tokens=1)
    metrics.observe_request(**REQ, duration_s=0.2, output_tokens=3)  # no TTFT known: no TPOT either
    text = metrics.exposition().decode()
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in text_string_to_metric_families(text) for s in f.samples}
    assert m[("gen_ai_server_time_to_first_token_seconds_count", labels(**REQ))] == 1
    assert ("gen_ai_server_time_per_output_token_seconds_count", labels(**REQ)) not in m


def test_each_gateway_has_its_own_registry():
    a, b = GatewayMetrics(), GatewayMetrics()
    a.observe_request(**REQ, duration_s=1.0)
    assert b"gen_ai_server_request_duration_seconds_count{" in a.exposition()
    assert b"gen_ai_server_request_duration_seconds_count{" not in b.exposition()
    assert b"gen_ai_server" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


def _parsed(metrics: GatewayMetrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.exposition().decode()) for s in f.samples}


def test_tpot_is_per_choice_when_choices_decode_side_by_side():
    metrics = GatewayMetrics()
    # 2 choices x 5 tokens in 1.0 s after a 0.2 s TTFT: 0.8 s / 4 gaps = 0.2 s per token, not 0.8 / 9.
    metrics.observe_request(**REQ, duration_s=1.0, ttft_s=0.2, output_tokens=10, sequences=2)
    m = _parsed(metrics)
    assert m[("gen_ai_server_time_per_output_token_seconds_sum", labels(**REQ))] == pytest.approx(0.2)


def test_a_tier_set_follows_the_tiers_in_force_at_each_scrape():
    from gateway.telemetry.tier_stats import tier_set_source

    class Tier:
        def __init__(self, in_flight, engine=None):
            self.in_flight, self.engine = in_flight, engine

    @dataclass
    class Engine:
        stats: EngineStats

    class Holder:
        current = None

    holder, runtime = Holder(), type("Runtime", (), {})()
    runtime.tiers = {"emb": Tier(2, Engine(EngineStats(kv_blocks_total=10, kv_blocks_used=4, queue_depth=3))),
                     "remote": Tier(1), "loading": Tier(0)}
    holder.current = runtime
    metrics = GatewayMetrics()
    metrics.add_tier_set(tier_set_source(holder))
    m = _parsed(metrics)
    assert m[("tiergate_tier_in_flight_requests", labels(tier="emb"))] == 2
    assert m[("tiergate_tier_in_flight_requests", labels(tier="remote"))] == 1
    assert m[("tiergate_tier_kv_cache_usage_ratio", labels(tier="emb"))] == pytest.approx(0.4)
    assert m[("tiergate_tier_queue_depth", labels(tier="emb"))] == 3
    # Tiers without an engine report what the gateway knows (in flight), not zeros for the rest.
    assert ("tiergate_tier_kv_cache_usage_ratio", labels(tier="remote")) not in m
    assert ("tiergate_tier_queue_depth", labels(tier="loading")) not in m
    # A reload swaps the tier set: the next scrape shows the new one only.
    new = type("Runtime", (), {})()
    new.tiers = {"other": Tier(5)}
    holder.current = new
    m = _parsed(metrics)
    assert m[("tiergate_tier_in_flight_requests", labels(tier="other"))] == 5
    assert ("tiergate_tier_in_flight_requests", labels(tier="emb")) not in m


def test_breaker_state_follows_the_events_requests_saw():
    metrics = GatewayMetrics()

    def states() -> dict:
        m = _parsed(metrics)
        return {dict(key)["tier"]: dict(key)["state"] for (name, key), v in m.items()
                if name == "tiergate_breaker_state" and v == 1}

    assert states() == {}
    metrics.breaker_events([("a", "success"), ("b", "failure"), ("b", "opened")])
    assert states() == {"a": "closed", "b": "open"}
    metrics.breaker_events([("b", "open")])              # refused while open
    assert states()["b"] == "open"
    metrics.breaker_events([("b", "success")])           # a call let through an open breaker: a probe
    assert states()["b"] == "half_open"
    metrics.breaker_events([("b", "success"), ("b", "closed")])
    assert states() == {"a": "closed", "b": "closed"}
    metrics.set_breaker_source(lambda: {"a": "open"})    # an exact source replaces what requests saw
    assert states() == {"a": "open"}


def test_breaker_states_read_from_the_store_fall_back_to_what_requests_saw():
    import asyncio

    from policies.budgets.types import StoreError

    metrics = GatewayMetrics()
    metrics.breaker_events([("a", "success"), ("b", "failure"), ("b", "opened")])
    reads = {"fail": False}

    async def read() -> dict:
        if reads["fail"]:
            raise StoreError("redis breaker state failed: ConnectionError")
        return {"a": "open", "b": "closed"}     # another replica moved both

    def states() -> dict:
        asyncio.run(metrics.refresh())
        m = _parsed(metrics)
        return {dict(key)["tier"]: dict(key)["state"] for (name, key), v in m.items()
                if name == "tiergate_breaker_state" and v == 1}

    metrics.set_breaker_reader(read)
    assert states() == {"a": "open", "b": "closed"}          # the store's state, not this replica's
    reads["fail"] = True
    assert states() == {"a": "closed", "b": "open"}          # store down: what requests here saw
