"""One object per request that lives from the first byte to the last: who asked, how it was
classified and routed, which tiers were tried, usage and timings. Plain typed data: the
response headers, the log line, spans and metrics are all read from it. What acts on a
request (its telemetry, its limits, each tier attempt) lives in objects of its own."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.skips import Skip
from policies.budgets import Admission

if TYPE_CHECKING:
    from gateway.cascade_gate import CascadeVerdict


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_tokens += other.cached_tokens

    def as_openai(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: str                         # "chat" | "completions"
    started: float = field(default_factory=time.perf_counter)
    received_at: float = field(default_factory=time.time)
    tenant: str | None = None
    tenant_class: str | None = None
    key_name: str | None = None
    user: str | None = None
    prefix_scope: str | None = None       # the prefix-cache scope gateway/cache_salt.py derives (None: unscoped)
    # Others may send to the same caches (auth on: other tenants; a cache_salt: other end users):
    # an upstream that cannot keep them apart must not tell this request what it found cached.
    prefix_private: bool = False
    priority: int = 0
    model: str | None = None              # the alias the client named
    stream: bool = False
    prompt_tokens_estimate: int | None = None
    profile: str | None = None
    profile_source: str | None = None     # "hint" | "rule" | "default"
    reasons: list[str] = field(default_factory=list)
    needs: frozenset[str] = frozenset()   # what the request needs of a tier (policies/needs.py)
    route_reason: str | None = None
    chain: tuple[str, ...] = ()
    tier: str | None = None               # the tier that answered (or is answering)
    fallbacks: list[Skip] = field(default_factory=list)  # tiers passed over, in order, and why
    cascade: CascadeVerdict | None = None    # the cascade's decision, when one judged the request
    text_gain: float | None = None        # the gain model's prediction from the text (the cascade adds the prefill's)
    escalated_from: str | None = None     # the cascade handed the request from this tier to ctx.tier
    # Summed over every tier call: the cascade's first tier included (its tokens were work done,
    # charged to budgets); the client's usage is the answering tier's own.
    usage: Usage = field(default_factory=Usage)
    # The same, by the tier that did the work: metrics count each tier's tokens under its own
    # name (after an escalation the two tiers' tokenizers count different tokens).
    tier_usage: dict[str, Usage] = field(default_factory=dict)
    tier_seconds: float = 0.0             # time spent waiting on tiers (excluded from the overhead)
    first_token_at: float | None = None
    headers_at: float | None = None
    finished_at: float | None = None
    status: int = 200
    error: str | None = None
    client_disconnected: bool = False     # the client left before the end (a stream cut short, or a 499)
    # ---- budgets, rate limits, breakers (written by gateway/request_limits.py, gateway/attempt.py)
    admission: Admission | None = None    # the last budget decision (ok or refused)
    ratelimit_headers: dict[str, str] | None = None   # x-ratelimit-* of the admitted attempt
    # (tier, event) per breaker step: "open"/"half_open" (skipped), "probe" (let through half-open),
    # "success", "failure", "client_error", "cancelled" (recorded outcomes), "opened"/"closed"
    # (transitions they caused)
    breaker_events: list[tuple[str, str]] = field(default_factory=list)

    # ---- timings --------------------------------------------------------------------
    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_at is None else (self.first_token_at - self.started) * 1000

    def overhead_ms(self, until: float | None = None) -> float:
        """Gateway time up to `until` (default now), not counting the time spent in tiers."""
        end = until if until is not None else time.perf_counter()
        return max(0.0, (end - self.started - self.tier_seconds) * 1000)

    @property
    def shown_status(self) -> int:
        """The status operators see: 499 for a client that left, also when a stream's 200 had
        already gone out (nginx's convention)."""
        return 499 if self.client_disconnected else self.status

    # ---- outputs --------------------------------------------------------------------
    def response_headers(self) -> dict[str, str]:
        self.headers_at = now = time.perf_counter()
        headers = {"x-request-id": self.request_id, "x-tiergate-overhead-ms": f"{self.overhead_ms(now):.3f}"}
        if self.tier is not None:
            headers["x-tiergate-tier"] = self.tier
        if self.profile is not None:
            headers["x-tiergate-profile"] = self.profile
        if self.reasons:
            headers["x-tiergate-reasons"] = _header_safe("; ".join(self.reasons))
        if self.fallbacks:
            headers["x-tiergate-fallbacks"] = _header_safe("; ".join(map(str, self.fallbacks)))
        if self.escalated_from is not None:
            headers["x-tiergate-escalated-from"] = self.escalated_from
        return headers

    def log_fields(self) -> dict:
        end = self.finished_at or time.perf_counter()
        return {
            "request_id": self.request_id, "endpoint": self.endpoint, "tenant": self.tenant, "user": self.user,
            "model": self.model, "stream": self.stream, "profile": self.profile, "profile_source": self.profile_source,
            "reasons": self.reasons, "route": self.route_reason, "chain": list(self.chain), "tier": self.tier,
            "fallbacks": [skip.for_log() for skip in self.fallbacks], "escalated_from": self.escalated_from,
            "needs": sorted(self.needs),
            "status": self.shown_status, "error": self.error, "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens, "cached_tokens": self.usage.cached_tokens,
            "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 2),
            "total_ms": round((end - self.started) * 1000, 2), "overhead_ms": round(self.overhead_ms(end), 3),
        }


def _header_safe(text: str) -> str:
    # Header values are latin-1 without control characters; reasons are ours but may quote user input.
    if not (text.isascii() and text.isprintable()):
        text = "".join(c if " " <= c <= "~" else "?" for c in text)
    return text[:1024]
