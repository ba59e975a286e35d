"""Per-tier figures for /metrics: the engine's counters (embedded tiers) plus the calls the
gateway has open to the tier (every tier), read at scrape time.

Duck-typed on the gateway's tiers (name, in_flight; embedded: engine.stats) and on the
runtime holder (holder.current.tiers), so a config reload's new tiers show up by themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any


class TierStatsView:
    """`in_flight` from the tier; every other figure from the engine's stats, if it has an engine."""

    __slots__ = ("_engine_stats", "in_flight")

    def __init__(self, in_flight: int, engine_stats: object | None):
        self.in_flight = in_flight
        self._engine_stats = engine_stats

    def __getattr__(self, name: str) -> Any:   # only for names not on the view itself
        if self._engine_stats is None:
            raise AttributeError(name)
        return getattr(self._engine_stats, name)


def tier_stats(tier: Any) -> TierStatsView:
    engine = getattr(tier, "engine", None)   # None for upstreams and for tiers still loading
    return TierStatsView(tier.in_flight, engine.stats if engine is not None else None)


def tier_set_source(holder: Any) -> Callable[[], Mapping[str, TierStatsView]]:
    """For GatewayMetrics.add_tier_set: the tiers of the config in force at scrape time."""

    def current() -> Mapping[str, TierStatsView]:
        return {name: tier_stats(tier) for name, tier in holder.current.tiers.items()}

    return current


async def breaker_states(holder: Any) -> Mapping[str, str]:
    """For GatewayMetrics.set_breaker_reader: each current tier's breaker state from the breaker
    store (Redis when configured: what every replica sees), one concurrent read per tier. A
    store failure propagates: the scrape then reports this replica's own view."""
    rt = holder.current
    limits = rt.limits
    if limits is None:
        return {}
    names = list(rt.tiers)
    states = await asyncio.gather(*(limits.breakers.shared_state(name) for name in names))
    return {name: st.state for name, st in zip(names, states)}
