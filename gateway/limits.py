"""The process-wide side of the limits: the budgets, circuit breakers and retry budget built from
one `limits:` config, and what a config reload does to them.

Reload: while `limits.store` is unchanged the store (its Redis connection pool, or the memory
store with its counters and breaker states) is kept; the new scope limits, prices, breaker
settings and retry budget apply to requests that start after the swap, and requests in flight
finish (reconcile) under the limits they started with. A changed `limits.store` opens the new
store for new requests; the old one is closed once its last request has finished. Counters do
not move from one store to another.

The fail-open limiter belongs to the store too: a reload during a Redis outage goes on counting
what the replica admitted locally and what it last saw in Redis, instead of granting a fresh
budget. Upstream tiers' tokenizers (budget estimates) are loaded once and kept across reloads.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.tier_tokenizers import TierTokenizers
from policies.breakers import Breakers, MemoryBreakerStore
from policies.budgets import Budgets, MemoryBudgetStore
from policies.budgets.fail_open import FailOpenLimiter
from policies.limits_config import LimitsConfig, RetryConfig, ScopeTable, StoreConfig
from policies.retry_budget import RetryBudget
from policies.url_check import shown_url

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 5.0       # shutdown: time for reconciliations queued during a Redis outage
# retry.min_retries_per_window when the config leaves it out: at low traffic a 20 % ratio of a
# handful of requests is zero retries, and a single failed tier would then refuse its fallback.
DEFAULT_MIN_RETRIES_PER_WINDOW = 10


class _Stores:
    """The budget and breaker stores of one `limits.store` config, shared by every GatewayLimits
    built on it and closed by the last one."""

    def __init__(self, config: StoreConfig):
        self.config = config
        self.users = 0
        self.fail_open = FailOpenLimiter()   # used only by a shared store, when it is down
        if config.backend == "memory":
            self.redis = None
            self.budgets = MemoryBudgetStore()
            self.breakers = MemoryBreakerStore()
            return
        from policies.breakers.redis_store import RedisBreakerStore
        from policies.budgets.redis_store import RedisBudgetStore, make_redis_client
        self.redis = make_redis_client(config)
        self.budgets = RedisBudgetStore(self.redis, config.key_prefix)
        self.breakers = RedisBreakerStore(self.redis, config.key_prefix)

    async def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.redis is not None:
            await self.redis.aclose()


def has_rules(table: ScopeTable) -> bool:
    return (table.default is not None and not table.default.is_empty()) or any(
        not limits.is_empty() for limits in table.by_id.values())


def has_budget_rules(config: LimitsConfig) -> bool:
    """Whether any scope has a limit: without one, requests skip the budget path entirely."""
    return any(has_rules(t) for t in (config.api_keys, config.tenants, config.tiers, config.sessions))


def retry_config(config: RetryConfig) -> RetryConfig:
    if "min_retries_per_window" in config.model_fields_set:
        return config
    return config.model_copy(update={"min_retries_per_window": DEFAULT_MIN_RETRIES_PER_WINDOW})


class GatewayLimits:
    def __init__(self, config: LimitsConfig, stores: _Stores, retry: RetryBudget | None = None,
                 tokenizers: TierTokenizers | None = None):
        self.config = config
        self._stores = stores
        stores.users += 1
        self.budgets = Budgets(config, stores.budgets, shared=stores.redis is not None, fail_open=stores.fail_open)
        self.tokenizers = tokenizers if tokenizers is not None else TierTokenizers()
        self.breakers = Breakers(config.breakers, stores.breakers,
                                 reconnect_interval_s=config.store.reconnect_interval_s,
                                 # only a shared store is worth a cache (a memory store answers at once)
                                 closed_cache_s=config.store.breaker_closed_cache_s if stores.redis else 0.0)
        self.retry = retry or RetryBudget(retry_config(config.retry))
        self.active = has_budget_rules(config)
        self.keys_limited = has_rules(config.api_keys)   # only then is a key's label needed
        self.in_flight = 0                     # requests using these limits (a reload waits for them)
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    @classmethod
    def open(cls, config: LimitsConfig) -> GatewayLimits:
        return cls(config, _Stores(config.store))

    @property
    def shared(self) -> bool:
        return self._stores.redis is not None

    @property
    def redis(self):
        """The shared store's Redis client (None for the memory store): the console reads its
        history there too."""
        return self._stores.redis

    @property
    def closed(self) -> bool:
        return self._closed

    def reconfigured(self, config: LimitsConfig) -> GatewayLimits:
        """The limits for a reloaded config: self if nothing changed, else new ones (on the same
        store when `store` did not change)."""
        if config == self.config:
            return self
        retry = self.retry if config.retry == self.config.retry else None
        stores = self._stores if config.store == self.config.store else _Stores(config.store)
        return GatewayLimits(config, stores, retry, self.tokenizers)

    async def check_store(self) -> None:
        """Log at start whether the shared store answers (requests work either way, per policy)."""
        if self.shared:
            try:
                await self._stores.budgets.ping()
            except Exception as exc:  # noqa: BLE001 - a log line, the policy handles the rest
                log.warning("budget store %s unreachable at start (%s); policy: fail-%s",
                            shown_url(self.config.store.url), exc, self.config.store.on_store_failure)

    def spawn(self, coro) -> None:
        """Run a finishing step (a reconcile nobody awaits) so that close() waits for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def retire(self, max_wait_s: float) -> None:
        """Close once the requests that started under these limits have finished."""
        deadline = time.monotonic() + max_wait_s
        while self.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.breakers.close()     # breakers first: they may share the budgets' Redis client
        if not await self.budgets.flush(FLUSH_TIMEOUT_S):
            log.error("%d budget reconciliations could not be applied before shutdown",
                      self.budgets.pending_replays)
        await self.budgets.close(flush_timeout=0)
        await self._stores.release()

