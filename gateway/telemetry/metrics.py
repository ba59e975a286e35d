"""Prometheus metrics for one gateway, on its own CollectorRegistry (never the global one).

Request metrics follow the GenAI server conventions (names and bucket boundaries of
gen_ai.server.time_to_first_token, .time_per_output_token, .request.duration, in seconds).
Engine figures are read at scrape time from each tier's stats object (engines.stats.EngineStats
or anything with the same attribute names), so the engine thread does no metrics work.

Labels stay low-cardinality: tier, profile, tenant_class, type, reason, state, code (an HTTP
status from a fixed list), and the cascade's
from / to tiers, outcome and signal. Never pass a
tenant id, an API key or request text as a label value.
"""

from __future__ import annotations

import asyncio
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
# The cascade's confidence (policies.cascade: a mean logprob, a mean entropy negated, in nats, or
# a predicted gain negated, in bits per byte): higher is surer. The first two lie in [-8, 0], the
# last mostly in [-0.5, 0.25] around thresholds near -0.15: finer steps there.
CONFIDENCE_BUCKETS = (-8.0, -6.0, -4.0, -3.0, -2.5, -2.0, -1.5, -1.0, -0.75, -0.5, -0.3, -0.25, -0.2, -0.15, -0.1,
                      -0.05, 0.0, 0.05, 0.1, 0.25)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
REQUEST_LABELS = ("tier", "profile", "tenant_class")
BREAKER_STATES = ("closed", "open", "half_open")
# What a request refused before routing is answered (bad key, bad JSON or schema, unknown model,
# body too large or too slow): its `code` label is one of these, anything else "http_other".
REJECTED_CODES = frozenset(f"http_{status}" for status in (400, 401, 403, 404, 405, 408, 411, 413, 415, 422, 429))
BREAKER_READ_TIMEOUT_S = 1.0

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
        self.rejected = Counter("tiergate_requests_rejected", "Requests refused before routing (bad key, bad "
                                "body, unknown model, body too large), by HTTP status", ("code",), registry=r)
        self.budget_rejections = Counter("tiergate_budget_rejections", "Requests refused by a budget",
                                         ("tenant_class", "reason"), registry=r)
        self.cascade_decisions = Counter("tiergate_cascade_decisions", "Cascade decisions on a first tier's "
                                         "first tokens: kept (it answers) or escalated (the `to` tier answers)",
                                         ("from_tier", "to_tier", "outcome"), registry=r)
        self.cascade_confidence = Histogram("tiergate_cascade_confidence", "Confidence of the first tokens "
                                            "judged by a cascade (mean logprob, mean entropy negated, or "
                                            "predicted gain negated)",
                                            ("from_tier", "signal"), buckets=CONFIDENCE_BUCKETS, registry=r)
        self.tier_skips = Counter("tiergate_tier_skips", "Tiers of a request's chain passed over, by reason "
                                  "(capability: the request needs what the tier lacks, e.g. tools; not_ready, "
                                  "breaker_open, tier_busy, ...) and, for capability skips, what was lacking",
                                  ("tier", "reason", "capability"), registry=r)
        self._collector = _TierStateCollector()
        r.register(self._collector)
        # Until a source is set: each breaker's state as this replica's requests last saw it.
        self._breakers_seen: dict[str, str] = {}
        self._collector.breakers = self._breakers_seen.copy
        self._breaker_reader: Callable[[], Awaitable[Mapping[str, str]]] | None = None

    # ---- wiring (at start)
    def add_tier(self, tier: str, stats: StatsSource) -> None:
        """Read `stats()` at every scrape; e.g. add_tier("small", lambda: engine.stats)."""
        self._collector.tiers[tier] = stats

    def add_tier_set(self, tiers: Callable[[], Mapping[str, object]]) -> None:
        """Read `tiers()` -> {tier: stats object or None} at every scrape: for a tier set that a
        config reload may change."""
        self._collector.tier_sets.append(tiers)

    def set_breaker_source(self, states: Callable[[], Mapping[str, str]]) -> None:
        """`states()` -> {tier: "closed" | "open" | "half_open"}, read at every scrape."""
        self._collector.breakers = states

    def set_breaker_reader(self, read: Callable[[], Awaitable[Mapping[str, str]]]) -> None:
        """An async `read()` -> {tier: state} from the breaker store itself (shared by every
        replica when it is Redis), awaited by the /metrics endpoint before each scrape."""
        self._breaker_reader = read

    async def refresh(self) -> None:
        """Read what the scrape needs from async sources; on failure keep this replica's view."""
        if self._breaker_reader is None:
            return
        try:
            async with asyncio.timeout(BREAKER_READ_TIMEOUT_S):
                states = dict(await self._breaker_reader())
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail because a store is down
            log.warning("metrics: reading breaker states from the store failed (%r); reporting this "
                        "replica's view", exc)
            self._collector.breakers = self._breakers_seen.copy
            return
        self._collector.breakers = lambda: states

    def breaker_events(self, events: Iterable[tuple[str, str]]) -> None:
        """A request's breaker steps (its context's breaker_events, in order): (tier, event) with
        event "open"/"half_open" (call refused), "opened"/"closed" (a transition the request
        caused), "probe" (a half-open breaker let the call through), or a recorded outcome
        ("success", "failure", ...: a call was let through)."""
        seen = self._breakers_seen
        for tier, event in events:
            if event in BREAKER_STATES:            # refused while open / half-open, or closed by a probe
                seen[tier] = event
            elif event == "opened":
                seen[tier] = "open"
            elif event == "probe":                 # a half-open breaker let this call through
                seen[tier] = "half_open"
            elif seen.get(tier) == "open":          # an open breaker lets only probes through
                seen[tier] = "half_open"
            else:
                seen.setdefault(tier, "closed")

    # ---- per request
    def tier_skipped(self, *, tier: str, reason: str, capability: str = "") -> None:
        """One tier passed over; `capability` only for capability skips (what was lacking: one of a
        few names), never free text, so that the label set stays bounded."""
        self.tier_skips.labels(tier, reason, capability).inc()

    def observe_request(self, *, tier: str, profile: str, tenant_class: str, duration_s: float,
                        ttft_s: float | None = None, input_tokens: int = 0, output_tokens: int = 0,
                        cache_read_tokens: int = 0, error_reason: str | None = None, sequences: int = 1) -> None:
        """One finished request. TTFT and TPOT only for successful responses (GenAI conventions);
        TPOT = (duration - TTFT) / (output tokens per sequence - 1): the sequences of a request
        (prompts x choices, gateway/token_bounds.sequences) are decoded side by side."""
        labels = (tier, profile, tenant_class)
        self.duration.labels(*labels).observe(duration_s)
        self.count_tokens(tier=tier, profile=profile, tenant_class=tenant_class, input_tokens=input_tokens,
                          output_tokens=output_tokens, cache_read_tokens=cache_read_tokens)
        if error_reason is not None:
            self.errors.labels(tier, error_reason).inc()
            return
        if ttft_s is not None:
            self.ttft.labels(*labels).observe(ttft_s)
            per_sequence = output_tokens / max(sequences, 1)
            if per_sequence > 1:
                self.tpot.labels(*labels).observe(max(duration_s - ttft_s, 0.0) / (per_sequence - 1))

    def count_tokens(self, *, tier: str, profile: str, tenant_class: str, input_tokens: int, output_tokens: int,
                     cache_read_tokens: int) -> None:
        labels = (tier, profile, tenant_class)
        self.tokens.labels(*labels, "input").inc(input_tokens)
        self.tokens.labels(*labels, "output").inc(output_tokens)
        self.tokens.labels(*labels, "cache_read").inc(cache_read_tokens)

    def cascade_decided(self, *, from_tier: str, to_tier: str, escalated: bool, signal: str, score: float) -> None:
        self.cascade_decisions.labels(from_tier, to_tier, "escalated" if escalated else "kept").inc()
        self.cascade_confidence.labels(from_tier, signal).observe(score)

    def request_rejected(self, status: int) -> None:
        """A request answered with an error before it was routed (no tier figures for it)."""
        code = f"http_{status}"
        self.rejected.labels(code if code in REJECTED_CODES else "http_other").inc()

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
    ("in_flight_requests", "Calls the gateway has open to this tier", "in_flight", "gauge"),
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
        self.tier_sets: list[Callable[[], Mapping[str, object]]] = []
        self.breakers: Callable[[], Mapping[str, str]] | None = None

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        by_attr = {attr: families[i] for i, (_, _, attr, _) in enumerate(_TIER_FIELDS)}
        for tier, stats in self._tier_stats():
            try:
                values = _tier_values(stats())
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

    def _tier_stats(self) -> list[tuple[str, StatsSource]]:
        out = list(self.tiers.items())
        for tier_set in self.tier_sets:
            try:
                current = dict(tier_set())
            except Exception:
                log.warning("metrics: reading a tier set failed", exc_info=True)
                continue
            out += [(tier, lambda s=stats: s) for tier, stats in current.items() if tier not in self.tiers]
        return out

    @staticmethod
    def _families() -> list[Metric]:
        out: list[Metric] = []
        for suffix, doc, _, kind in _TIER_FIELDS:
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            out.append(cls(f"tiergate_tier_{suffix}", doc, labels=["tier"]))
        out.append(GaugeMetricFamily("tiergate_breaker_state", "1 for the breaker's current state, else 0 "
                                     "(read from the breaker store at scrape time)",
                                     labels=["tier", "state"]))
        return out


# The /metrics entry of the gateway's /openapi.json.
METRICS_OPENAPI = {"get": {"summary": "Prometheus metrics: request histograms, token usage, per-tier engine "
                                      "figures, budget rejections, breaker states",
                           "responses": {"200": {"description": "Prometheus text exposition format 0.0.4",
                                                 "content": {CONTENT_TYPE_LATEST.split(";")[0]: {
                                                     "schema": {"type": "string"}}}}}}}


def metrics_endpoint(metrics: GatewayMetrics) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint serving `metrics` in the Prometheus text format."""

    async def endpoint(request: Request) -> Response:
        await metrics.refresh()
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return endpoint


def metrics_route(metrics: GatewayMetrics, path: str = "/metrics") -> Route:
    return Route(path, metrics_endpoint(metrics), methods=["GET"], name="metrics")
