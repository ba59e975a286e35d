"""Per-tier time series of the last few minutes, for the console's sparklines.

Two kinds of figures meet in one point per tier and per second:
- what finished calls tell (output tokens, calls answered by the tier, calls that failed there,
  TTFT, TPOT): added as each request ends, into the tier's open accumulator;
- what the tier is doing now (queue, running sequences, KV use, calls in flight): read when
  the point is closed.
`sample()` closes the current second's point of every tier (the app calls it once a second);
each tier keeps `points` of them (a deque: memory stays bounded whatever the traffic). A tier
that a reload removed is forgotten at the next sample.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_POINTS = 300          # 5 minutes at 1 s
FIELDS = ("t", "requests", "errors", "output_tokens", "ttft_ms", "tpot_ms", "queue", "running", "kv_usage",
          "in_flight")


@dataclass(slots=True)
class _Open:
    """The figures of requests that ended since the last point."""

    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    ttft_sum_ms: float = 0.0
    ttft_n: int = 0
    tpot_sum_ms: float = 0.0
    tpot_n: int = 0


class _Series:
    __slots__ = ("open", "points", "totals")

    def __init__(self, points: int):
        self.open = _Open()
        self.points: deque[tuple] = deque(maxlen=points)
        self.totals = {"requests": 0, "errors": 0, "output_tokens": 0}


def _mean(total: float, n: int) -> float | None:
    return round(total / n, 3) if n else None


class TierSeries:
    def __init__(self, points: int = DEFAULT_POINTS, clock=time.time):
        self._points = points
        self._clock = clock
        self._tiers: dict[str, _Series] = {}
        self.last_sample: float | None = None

    def _series(self, tier: str) -> _Series:
        series = self._tiers.get(tier)
        if series is None:
            series = self._tiers[tier] = _Series(self._points)
        return series

    def request_done(self, tier: str, *, output_tokens: int, failed: bool, ttft_s: float | None,
                     tpot_s: float | None) -> None:
        series = self._series(tier)
        acc = series.open
        acc.requests += 1
        acc.errors += failed
        acc.output_tokens += output_tokens
        if ttft_s is not None and math.isfinite(ttft_s):
            acc.ttft_sum_ms += ttft_s * 1000
            acc.ttft_n += 1
        if tpot_s is not None and math.isfinite(tpot_s):
            acc.tpot_sum_ms += tpot_s * 1000
            acc.tpot_n += 1
        totals = series.totals
        totals["requests"] += 1
        totals["errors"] += failed
        totals["output_tokens"] += output_tokens

    def sample(self, gauges: Mapping[str, Mapping[str, float | int | None]]) -> None:
        """Close the current point of every tier in `gauges` ({tier: {queue, running, kv_usage,
        in_flight}}, read now); tiers not in it are dropped."""
        now = self._clock()
        for gone in set(self._tiers) - set(gauges):
            del self._tiers[gone]
        for tier, g in gauges.items():
            series = self._series(tier)
            acc = series.open
            series.points.append((round(now, 3), acc.requests, acc.errors, acc.output_tokens,
                                  _mean(acc.ttft_sum_ms, acc.ttft_n), _mean(acc.tpot_sum_ms, acc.tpot_n),
                                  g.get("queue"), g.get("running"), g.get("kv_usage"), g.get("in_flight")))
            series.open = _Open()
        self.last_sample = now

    def view(self, tier: str) -> dict:
        """{"fields": [...], "points": [[...], ...] oldest first, "totals": {...}, "window": {...}}:
        the window sums what the points hold (traffic share, tokens/s over the window)."""
        series = self._tiers.get(tier)
        if series is None:
            return {"fields": list(FIELDS), "points": [], "totals": {"requests": 0, "errors": 0, "output_tokens": 0},
                    "window": {"seconds": 0.0, "requests": 0, "errors": 0, "output_tokens": 0}}
        points = [list(p) for p in series.points]
        seconds = points[-1][0] - points[0][0] + 1.0 if points else 0.0
        window = {"seconds": round(seconds, 3), "requests": sum(p[1] for p in points),
                  "errors": sum(p[2] for p in points), "output_tokens": sum(p[3] for p in points)}
        return {"fields": list(FIELDS), "points": points, "totals": dict(series.totals), "window": window}

    def tiers(self) -> list[str]:
        return list(self._tiers)
