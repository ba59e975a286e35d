"""The console's refusal counts per (budget scope, limit kind), bounded.

A session id is the client's choice, so a client that sends a new one per request could
otherwise grow the table (and every poll of the console) without limit. Counts are kept per
kind of scope (tenant, API key, tier, session) for at most MAX_COUNTED entries; when a new
entry arrives at a full table the least refused entry leaves and its count goes to the kind's
aggregate (`others`), so the totals stay exact and the most refused scopes stay listed.

Entries are (scope, limit kind) pairs, never a joined string: a scope id may hold any printable
character, "|" included. In Redis a member is the pair as a JSON array.

Redis keys, under the limits' hash tag `{prefix}` (both expire REFUSALS_TTL_S after the last
refusal of that kind of scope):
  {prefix}:con:rejc:<scope kind>   zset  JSON [scope, limit kind] -> refusals
  {prefix}:con:rejo:<scope kind>   string refusals of entries no longer listed
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from policies.budgets.types import SCOPE_PREFIX

MAX_COUNTED = 100               # entries per kind of scope
REFUSALS_TTL_S = 7 * 86400      # counts of a kind of scope no one was refused in for a week go
_KIND_OF_PREFIX = {prefix: kind for kind, prefix in SCOPE_PREFIX.items()}
SCOPE_KINDS = (*SCOPE_PREFIX, "other")


@dataclass(frozen=True, slots=True)
class RefusalCount:
    scope: str          # "t:acme", "s:acme/sess-1", ...
    kind: str           # the limit refused: tokens_per_day, rpm, ...
    count: int


@dataclass(frozen=True, slots=True)
class RefusalCounts:
    counted: tuple[RefusalCount, ...]       # most refused first, at most MAX_COUNTED per kind of scope
    others: int                             # refusals of entries that left the table

    def of_scope(self, scope: str) -> int:
        return sum(c.count for c in self.counted if c.scope == scope)

    def as_json(self, shown: int) -> dict:
        """The `shown` most refused entries of each kind of scope; the rest summed in `others`."""
        listed, per_kind, others = [], {}, self.others
        for c in self.counted:
            kind = scope_kind(c.scope)
            if per_kind.get(kind, 0) < shown:
                per_kind[kind] = per_kind.get(kind, 0) + 1
                listed.append({"scope": c.scope, "kind": c.kind, "count": c.count})
            else:
                others += c.count
        return {"counted": listed, "others": others}


def scope_kind(scope: str) -> str:
    """tenant / api_key / tier / session, from the scope id's prefix; "other" for anything else."""
    return _KIND_OF_PREFIX.get(scope[:2], "other")


def _ranked(counts: Iterable[RefusalCount]) -> tuple[RefusalCount, ...]:
    return tuple(sorted(counts, key=lambda c: (-c.count, c.scope, c.kind)))


class MemoryRefusalCounts:
    def __init__(self, limit: int = MAX_COUNTED) -> None:
        self._limit = limit
        self._tables: dict[str, dict[tuple[str, str], int]] = {k: {} for k in SCOPE_KINDS}
        self._others = 0

    def add(self, scope: str, kind: str) -> None:
        table = self._tables[scope_kind(scope)]
        key = (scope, kind)
        if key not in table and len(table) >= self._limit:
            least = min(table, key=table.__getitem__)
            self._others += table.pop(least)
        table[key] = table.get(key, 0) + 1

    def read(self) -> RefusalCounts:
        counts = (RefusalCount(s, k, n) for table in self._tables.values() for (s, k), n in table.items())
        return RefusalCounts(_ranked(counts), self._others)


# One batch of refusals of one kind of scope, atomically: a full table first gives up its least
# refused entry (to the aggregate) for a new one. ARGV: limit, ttl, then one member per refusal.
_ADD = """
local limit, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, #ARGV do
  local member = ARGV[i]
  if not redis.call('ZSCORE', KEYS[1], member) and redis.call('ZCARD', KEYS[1]) >= limit then
    local least = redis.call('ZPOPMIN', KEYS[1])
    redis.call('INCRBY', KEYS[2], math.floor(tonumber(least[2])))
  end
  redis.call('ZINCRBY', KEYS[1], 1, member)
end
redis.call('EXPIRE', KEYS[1], ttl)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
return 0
"""


class RedisRefusalCounts:
    def __init__(self, client, key) -> None:
        """`key(*parts)`: the history's key under the limits' hash tag."""
        self._redis = client
        self._key = key
        self._add = client.register_script(_ADD)

    async def add(self, refusals: Iterable[tuple[str, str]]) -> None:
        by_kind: dict[str, list[str]] = {}
        for scope, kind in refusals:
            by_kind.setdefault(scope_kind(scope), []).append(json.dumps([scope, kind]))
        for scope_kind_, members in by_kind.items():
            await self._add(keys=[self._key("rejc", scope_kind_), self._key("rejo", scope_kind_)],
                            args=[MAX_COUNTED, REFUSALS_TTL_S, *members])

    async def read(self) -> RefusalCounts:
        async with self._redis.pipeline(transaction=False) as pipe:
            for kind in SCOPE_KINDS:
                pipe.zrevrange(self._key("rejc", kind), 0, MAX_COUNTED - 1, withscores=True)
                pipe.get(self._key("rejo", kind))
            answers = await pipe.execute()
        counts, others = [], 0
        for members, other in zip(answers[::2], answers[1::2]):
            for member, score in members:
                scope, kind = json.loads(member)
                counts.append(RefusalCount(scope, kind, int(score)))
            others += int(other or 0)
        return RefusalCounts(_ranked(counts), others)
