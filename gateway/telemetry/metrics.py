"""Prometheus metrics for one gateway, on its own CollectorRegistry (never the global one).

Request metrics follow the GenAI server conventions (names and bucket boundaries of
gen_ai.server.time_to_first_token, .time_per_output_token, .request.duration, in seconds).
Engine figures are read at scrape time from each tier's stats object (engines.stats.EngineStats
or anything with the same attribute names), so the engine thread does no metrics work.

Labels stay low-cardinality: tier, profile, tenant_class, type, reason, state. Never pass a
tenant id, an API key or request text as a label value.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

log = logging.getLogger(__name__)

# Bucket boundaries recommended by the GenAI semantic conventions.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
REQUEST_LABELS = ("tier", "profile", "tenant_class")
BREAKER_STATES = ("closed", "open", "half_open")

StatsSource = Callable[[], object]


class GatewayMetrics:
    """Instruments of one gateway plus the scrape-time collector of tier and breaker state."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("gen_ai_server_time_to_first_token", "Time to first token of successful "
                              "responses", REQUEST_LABELS, unit="seconds", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("gen_ai_server_time_per_output_token", "Time per output token after the "
                              "first, successful responses", REQUEST_LABELS, unit="seconds",
                              buckets=TPOT_BUCKETS, registry=r)
        self.duration = Histogram("gen_ai_server_request_duration", "Request duration to the last byte",
                                  REQUEST_LABELS, unit="seconds", buckets=DURATION_BUCKETS, registry=r)
        self.tokens = Counter("tiergate_tokens", "Tokens by type: input (all prompt tokens), output, "
                              "cache_read (prompt tokens served by the prefix cache)",
                              (*REQUEST_LABELS, "type"), registry=r)
        self.errors = Counter("tiergate_request_errors", "Requests that failed after routing, by reason",
                              ("tier", "reason"), registry=r)
        self.budget_rejections = Counter("tiergate_budget_rejections", "Requests refused by a budget",
                                         ("tenant_class", "reason"), registry=r)
        self._collector = _TierStateCollector()
        r.register(self._collector)

    # ---- wiring (at start)
    def add_tier(self, tier: str, stats: StatsSource) -> None:
        """Read `stats()` at every scrape; e.g. add_tier("small", lambda: engine.stats)."""
        self._collector.tiers[tier] = stats

    def set_breaker_source(self, states: Callable[[], Mapping[str, str]]) -> None:
        """`states()` -> {tier: "closed" | "open" | "half_open"}, read at every scrape."""
        self._collector.breakers = states

    # ---- per request
    def observe_request(self, *, tier: str, profile: str, tenant_class: str, duration_s: float,
                        ttft_s: float | None = None, input_tokens: int = 0, output_tokens: int = 0,
                        cache_read_tokens: int = 0, error_reason: str | None = None) -> None:
        """One finished request. TTFT and TPOT only for successful responses (GenAI conventions);
        TPOT = (duration - TTFT) / (output tokens - 1)."""
        labels = (tier, profile, tenant_class)
        self.duration.labels(*labels).observe(duration_s)
        self.tokens.labels(*labels, "input").inc(input_tokens)
        self.tokens.labels(*labels, "output").inc(output_tokens)
        self.tokens.labels(*labels, "cache_read").inc(cache_read_tokens)
        if error_reason is not None:
            self.errors.labels(tier, error_reason).inc()
            return
        if ttft_s is not None:
            self.ttft.labels(*labels).observe(ttft_s)
            if output_tokens > 1:
                self.tpot.labels(*labels).observe(max(duration_s - ttft_s, 0.0) / (output_tokens - 1))

    def budget_rejected(self, *, tenant_class: str, reason: str) -> None:
        self.budget_rejections.labels(tenant_class, reason).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


# (metric suffix, help, stats attribute, kind)
_TIER_FIELDS = (
    ("kv_cache_usage_ratio", "Share of KV cache blocks in use", "kv_usage", "gauge"),
    ("prefix_cache_hit_ratio", "Prompt tokens served by the prefix cache / tokens looked up, since start",
     "prefix_hit_rate", "gauge"),
    ("prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache", "prefix_queried_tokens",
     "counter"),
    ("prefix_cache_hit_tokens", "Prompt tokens served by the prefix cache", "prefix_hit_tokens", "counter"),
    ("preemptions", "Sequences preempted for lack of KV blocks", "preemptions", "counter"),
    ("queue_depth", "Requests waiting to be scheduled", "queue_depth", "gauge"),
    ("running_sequences", "Sequences in the running batch", "running", "gauge"),
    # Only for engines that decode speculatively: summed over their draft sources (stats.spec).
    ("spec_acceptance_ratio", "Accepted / proposed draft tokens, since start", "spec_acceptance", "gauge"),
    ("spec_accepted_tokens", "Draft tokens accepted", "spec_accepted", "counter"),
    ("spec_proposed_tokens", "Draft tokens proposed", "spec_proposed", "counter"),
)


def _tier_values(stats: object) -> dict[str, object]:
    """The figures of one stats object; a field it lacks is None (left out, not reported as 0)."""
    values = {attr: getattr(stats, attr, None) for _, _, attr, _ in _TIER_FIELDS if not attr.startswith("spec_")}
    spec = getattr(stats, "spec", None)  # {draft source: engines.stats.SpecStats}
    if spec:
        proposed = sum(s.proposed_tokens for s in spec.values())
        accepted = sum(s.accepted_tokens for s in spec.values())
        values.update(spec_proposed=proposed, spec_accepted=accepted,
                      spec_acceptance=accepted / proposed if proposed else None)
    return values


class _TierStateCollector:
    """Builds per-tier and breaker families from their sources at scrape time."""

    def __init__(self) -> None:
        self.tiers: dict[str, StatsSource] = {}
        self.breakers: Callable[[], Mapping[str, str]] | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        by_attr = {attr: families[i] for i, (_, _, attr, _) in enumerate(_TIER_FIELDS)}
        for tier, source in list(self.tiers.items()):
            try:
                values = _tier_values(source())
            except Exception:  # a broken or stopped tier must not break the scrape
                log.warning("metrics: reading the stats of tier %r failed", tier, exc_info=True)
                continue
            for attr, value in values.items():
                if isinstance(value, (int, float)) and attr in by_attr:
                    by_attr[attr].add_metric([tier], float(value))
        breaker = families[-1]
        if self.breakers is not None:
            try:
                states = dict(self.breakers())
            except Exception:
                log.warning("metrics: reading breaker states failed", exc_info=True)
                states = {}
            for tier, state in states.items():
                for known in dict.fromkeys((*BREAKER_STATES, state)):
                    breaker.add_metric([tier, known], 1.0 if known == state else 0.0)
        # Families with no sample (e.g. speculative figures where no tier speculates) are left out.
        return [f for f in families if f.samples]

    @staticmethod
    def _families() -> list[Metric]:
        out: list[Metric] = []
        for suffix, doc, _, kind in _TIER_FIELDS:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            out.append(cls(f"tiergate_tier_{suffix}", doc, labels=["tier"]))
        out.append(GaugeMetricFamily("tiergate_breaker_state", "1 for the breaker's current state, else 0",
                                     labels=["tier", "state"]))
        return out


def metrics_endpoint(metrics: GatewayMetrics) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint serving `metrics` in the Prometheus text format."""

    async def endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return endpoint


def metrics_route(metrics: GatewayMetrics, path: str = "/metrics") -> Route:
    return Route(path, metrics_endpoint(metrics), methods=["GET"], name="metrics")
