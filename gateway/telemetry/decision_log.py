"""The last routing decisions, for the operator console: a fixed-size ring of small records.

One record per request that was classified (auth failures and unparsable bodies never reach
routing and are left out). A record is built from the request's context once it has ended, so
it holds what the request actually went through: profile and rule, the chain, the tier that
answered, each tier passed over and why, a cascade's escalation, and the latency the gateway
itself added. Bounded: the oldest record falls out (deque maxlen), and so does traffic share.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.context import RequestContext

DEFAULT_SIZE = 200
_MAX_REASONS = 8          # a record stays small whatever a request carried


class DecisionLog:
    __slots__ = ("_records", "total")

    def __init__(self, size: int = DEFAULT_SIZE):
        self._records: deque[dict] = deque(maxlen=size)
        self.total = 0                       # decisions recorded since start (the ring keeps the last)

    def record(self, ctx: RequestContext) -> dict | None:
        """Keep the decision of a finished request; None (nothing kept) when it was never routed."""
        if ctx.profile is None:
            return None
        end = ctx.finished_at or time.perf_counter()
        cascade = ctx.cascade
        entry = {
            "at": ctx.received_at,
            "request_id": ctx.request_id,
            "model": ctx.model,
            "tenant": ctx.tenant,
            "profile": ctx.profile,
            "profile_source": ctx.profile_source,
            "reasons": ctx.reasons[:_MAX_REASONS],
            "rule": ctx.route_reason,
            "chain": list(ctx.chain),
            "tier": ctx.tier,
            "fallbacks": [{"tier": s.tier, "reason": s.reason.value, "detail": s.detail} for s in ctx.fallbacks],
            "escalated_from": ctx.escalated_from,
            "cascade": None if cascade is None else {
                "from": cascade.from_tier, "to": cascade.to, "escalated": cascade.escalated,
                "signal": cascade.signal, "score": round(cascade.score, 4)},
            "stream": ctx.stream,
            "status": ctx.shown_status,
            "client_disconnected": ctx.client_disconnected,
            "error": ctx.error,
            "overhead_ms": round(ctx.overhead_ms(end), 3),
            "total_ms": round((end - ctx.started) * 1000, 2),
            "ttft_ms": None if ctx.ttft_ms is None else round(ctx.ttft_ms, 2),
            "completion_tokens": ctx.usage.completion_tokens,
        }
        self._records.append(entry)
        self.total += 1
        return entry

    def recent(self, limit: int | None = None) -> list[dict]:
        """Newest first."""
        records = list(self._records)
        records.reverse()
        return records if limit is None else records[:limit]

    def __len__(self) -> int:
        return len(self._records)
