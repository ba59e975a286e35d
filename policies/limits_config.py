"""YAML schema of budgets, rate limits, circuit breakers and retries (the `limits:` section).

Every field has a safe default, so `limits: {}` (or no section at all) means: in-memory store,
no limits, breakers with conservative thresholds, a 20 % retry budget.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.url_check import check_redis_url


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScopeLimits(_Strict):
    """Limits of one scope (an API key, a tenant, a tier, an agent session). None: no limit."""

    rpm: int | None = Field(None, ge=0, description="requests per minute")
    tpm: int | None = Field(None, ge=0, description="tokens per minute, input + output")
    max_concurrent: int | None = Field(None, ge=0, description="requests in flight at once")
    tokens_per_day: int | None = Field(None, ge=0, description="input + output tokens per UTC day")
    tokens_per_month: int | None = Field(None, ge=0, description="input + output tokens per UTC month")
    cost_per_day: float | None = Field(None, ge=0, description="USD per UTC day, from the tier prices")
    cost_per_month: float | None = Field(None, ge=0, description="USD per UTC month, from the tier prices")

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


class ScopeTable(_Strict):
    """`default` applies to every id of this scope kind that `by_id` does not list."""

    default: ScopeLimits | None = None
    by_id: dict[str, ScopeLimits] = {}

    def for_id(self, scope_id: str) -> ScopeLimits | None:
        return self.by_id.get(scope_id, self.default)


class TierPrice(_Strict):
    input_per_1m: float = Field(0.0, ge=0, description="USD per million input tokens")
    output_per_1m: float = Field(0.0, ge=0, description="USD per million output tokens")


class StoreConfig(_Strict):
    backend: Literal["memory", "redis"] = "memory"
    url: str | None = Field(None, description="redis://host:port/db; required for the redis backend")
    key_prefix: str = Field("tiergate", pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
                            description="all keys share the hash tag {key_prefix}: one Cluster slot")
    on_store_failure: Literal["open", "closed"] = Field(
        "closed", description="Redis unreachable: 'open' admits under a local per-replica limiter, "
                              "'closed' refuses requests (503)")
    timeout_s: float = Field(2.0, gt=0, description="socket timeout of one Redis call; it also counts time "
                                                    "the event loop was busy, so keep it well above Redis' latency")
    reconnect_interval_s: float = Field(0.5, gt=0, description="after a failure, how often to try Redis again")
    reservation_ttl_s: float = Field(900.0, gt=0, description="a reservation not finished by then is freed")
    tombstone_ttl_s: float = Field(
        3600.0, gt=0, description="how long a finished reservation id is remembered: duplicate finishes and "
                                  "replays within it are no-ops")
    breaker_closed_cache_s: float = Field(
        0.05, ge=0, description="a replica reuses a shared breaker's 'closed' answer this long before asking "
                                "Redis again (0: ask on every call): another replica's trip is seen that much later")
    max_connections: int = Field(64, gt=0)
    replay_queue_max: int = Field(100_000, gt=0, description="reconciliations kept while Redis is down")

    @model_validator(mode="after")
    def _redis_needs_url(self) -> StoreConfig:
        if self.backend == "redis" and not self.url:
            raise ValueError("the redis backend needs a url (redis://host:port/db)")
        if self.backend == "redis":
            check_redis_url(self.url, "url")
        return self


class BreakerSettings(_Strict):
    window_s: float = Field(30.0, gt=0, description="sliding window of the failure and slow rates")
    min_calls: int = Field(20, ge=1, description="calls in the window before the breaker may trip")
    failure_rate: float = Field(0.5, gt=0, le=1, description="failed / calls that opens the breaker")
    # A time to first token grows with the prompt: set above the TTFT of the longest prompt the
    # tier takes, or one tenant's long prompts count as slow calls for every tenant.
    slow_ttft_s: float | None = Field(None, gt=0, description="a time to first token above this is slow")
    slow_rate: float = Field(0.8, gt=0, le=1, description="slow / calls that opens the breaker")
    open_s: float = Field(15.0, gt=0, description="how long an open breaker refuses before probing")
    half_open_probes: int = Field(3, ge=1, description="probe calls in half-open; all must succeed to close")
    probe_timeout_s: float = Field(60.0, gt=0, description="a probe not recorded by then frees its slot")


class BreakerTable(_Strict):
    default: BreakerSettings = BreakerSettings()
    by_name: dict[str, BreakerSettings] = {}

    def for_name(self, name: str) -> BreakerSettings:
        return self.by_name.get(name, self.default)


class RetryConfig(_Strict):
    budget_ratio: float = Field(0.2, ge=0, le=1, description="retries allowed per request in the window")
    window_s: float = Field(10.0, gt=0)
    min_retries_per_window: int = Field(0, ge=0, description="retries always allowed (low traffic)")
    # A stream is held to it too: 600 s, the openai SDK's and LiteLLM's own request timeout, leaves
    # a CPU tier decoding a few tokens a second under load room for a long answer.
    deadline_s: float = Field(600.0, gt=0, description="a request's whole time, retries and a stream's "
                              "relay included")


class LimitsConfig(_Strict):
    store: StoreConfig = StoreConfig()
    api_keys: ScopeTable = ScopeTable()
    tenants: ScopeTable = ScopeTable()
    tiers: ScopeTable = ScopeTable()
    sessions: ScopeTable = ScopeTable()
    prices: dict[str, TierPrice] = {}
    breakers: BreakerTable = BreakerTable()
    retry: RetryConfig = RetryConfig()

    @model_validator(mode="after")
    def _reservation_outlives_requests(self) -> LimitsConfig:
        # A reservation that expires while its request still runs frees capacity too early.
        if self.store.reservation_ttl_s <= self.retry.deadline_s:
            raise ValueError(f"store.reservation_ttl_s ({self.store.reservation_ttl_s}) must exceed "
                             f"retry.deadline_s ({self.retry.deadline_s})")
        return self
