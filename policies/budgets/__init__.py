"""Budgets and rate limits per scope (API key, tenant, tier, agent session), on Redis or in memory.

Design notes
- One decision per request: every scope is checked and, only if all pass, reserved in all of
  them, in one Lua script (Redis) or one await-free method (memory). Rates are GCRA over one
  minute (burst = the per-minute limit); budgets count per UTC day and month; concurrency is
  a sorted set of reservation ids with their expiry. Time is the store's clock (Redis TIME).
- Reservations expire (store.reservation_ttl_s): the next decision reaps expired ones, so a
  crashed gateway frees its capacity. A finish (reconcile or release) is applied exactly once
  per reservation id; a late one still commits its usage; one whose record the store lost
  (a Redis restart without persistence) is committed from the copy the gateway holds.
- Redis Cluster: every key starts with the hash tag {key_prefix}, so all budget and breaker
  state lives in one slot and each script touches one slot. Scopes of different kinds (a
  tier shared by all tenants, a tenant, its sessions) meet in one decision, so any finer split
  would break its atomicity; the cost is that this state does not spread over shards (a few
  hundred bytes per scope, one short script per request). Scripts build their keys from the
  tag (the reaper cannot know them in advance): fine on open-source Redis Cluster, refused by
  proxies that demand every key in KEYS.
- Redis down: fail-closed raises BudgetStoreUnavailable (503); fail-open admits under a local
  in-memory limiter with the same limits, per replica, that starts from the usage the replica
  last saw in Redis (fail_open.py): each replica admits at most the remainder it last saw,
  not a fresh budget. Finishes that cannot reach Redis are
  queued and replayed when it answers; usage admitted locally is replayed too. A queue lives
  in memory: a gateway that crashes while Redis is down loses its queue (its reservations
  then expire, and the usage of those requests goes uncounted).
"""

from policies.budgets.budgets import Budgets
from policies.budgets.headers import (
    admission_headers,
    ratelimit_headers,
    retry_after_headers,
)
from policies.budgets.memory_store import MemoryBudgetStore
from policies.budgets.store import BudgetStore, ScopeUsage
from policies.budgets.types import (
    Admission,
    BudgetStoreUnavailable,
    FinishStatus,
    InvalidScope,
    RateLimitInfo,
    Reservation,
    Scopes,
)

__all__ = [
    "Admission", "BudgetStore", "BudgetStoreUnavailable", "Budgets", "FinishStatus", "InvalidScope",
    "MemoryBudgetStore", "RateLimitInfo", "Reservation", "ScopeUsage", "Scopes", "admission_headers",
    "ratelimit_headers", "retry_after_headers",
]
