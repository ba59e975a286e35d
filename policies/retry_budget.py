"""Retry budget and per-request deadline: the two things that stop a retry storm.

A retry is allowed only while retries stay within `budget_ratio` of the requests seen over the
sliding window (plus `min_retries_per_window` for low traffic), so a failing upstream sees at
most (1 + ratio) x the normal load, never a multiple of it. Every attempt also fits inside the
request's deadline. Both are per replica: a budget enforced locally on each replica is still a
ratio of that replica's traffic, which is what bounds the load.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from policies.limits_config import RetryConfig

_BUCKETS = 10


class RetryBudget:
    def __init__(self, config: RetryConfig, clock=time.monotonic):
        self._ratio = config.budget_ratio
        self._min = config.min_retries_per_window
        self._width = config.window_s / _BUCKETS
        self._clock = clock
        self._buckets: dict[int, list[int]] = {}  # bucket index -> [requests, retries]

    def _totals(self) -> tuple[int, int, int]:
        idx = math.floor(self._clock() / self._width)
        for old in [k for k in self._buckets if k <= idx - _BUCKETS]:
            del self._buckets[old]
        requests = sum(v[0] for v in self._buckets.values())
        retries = sum(v[1] for v in self._buckets.values())
        return idx, requests, retries

    def record_request(self) -> None:
        """Count one original request (not a retry)."""
        idx, _, _ = self._totals()
        self._buckets.setdefault(idx, [0, 0])[0] += 1

    def try_retry(self) -> bool:
        """True (and the retry is counted) if one more retry stays within the budget."""
        idx, requests, retries = self._totals()
        if retries + 1 > self._ratio * requests + self._min:
            return False
        self._buckets.setdefault(idx, [0, 0])[1] += 1
        return True

    def snapshot(self) -> tuple[int, int]:
        """(requests, retries) in the current window."""
        _, requests, retries = self._totals()
        return requests, retries


@dataclass(frozen=True)
class Deadline:
    """The time a request must be done by (monotonic clock)."""

    at: float
    clock: object = time.monotonic

    @classmethod
    def after(cls, seconds: float, clock=time.monotonic) -> Deadline:
        return cls(clock() + seconds, clock)

    def remaining(self) -> float:
        return max(0.0, self.at - self.clock())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def cap(self, timeout: float | None) -> float:
        """An attempt's timeout, cut to what is left of the deadline."""
        left = self.remaining()
        return left if timeout is None else min(timeout, left)
