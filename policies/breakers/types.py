"""Values of the circuit-breaker API."""

from __future__ import annotations

import enum
from dataclasses import dataclass

BUCKETS = 10            # the sliding window is kept as this many time buckets
BUSY_RETRY_S = 1.0      # half-open with every probe slot taken: come back in about this long


class Outcome(str, enum.Enum):
    SUCCESS = "s"
    FAILURE = "f"        # 5xx, connection error, timeout: counts against the upstream
    CLIENT_ERROR = "n"   # 4xx: the request's fault, never the upstream's; not counted
    CANCELLED = "c"      # the client left before an outcome: not counted

    @classmethod
    def from_status(cls, status: int) -> Outcome:
        if status < 400:
            return cls.SUCCESS
        if status < 500:
            return cls.CLIENT_ERROR
        return cls.FAILURE

    @property
    def counted(self) -> bool:
        return self in (Outcome.SUCCESS, Outcome.FAILURE)


@dataclass(frozen=True)
class Permit:
    """Leave to send one call to `name`; hand it back to Breakers.record exactly once."""

    name: str
    generation: int          # the breaker's state generation when issued: stale records are ignored
    probe_id: str = ""       # set for a half-open probe
    local: bool = False      # issued by the local fallback while the shared store was down
    allowed: bool = True

    @property
    def is_probe(self) -> bool:
        return bool(self.probe_id)


@dataclass(frozen=True)
class Rejection:
    name: str
    state: str               # "open" or "half_open"
    retry_after: float       # seconds until the breaker may let a call through
    allowed: bool = False


@dataclass(frozen=True)
class AllOpen:
    """Every breaker of a fallback chain refused: answer 503 with this Retry-After."""

    names: tuple[str, ...]
    retry_after: float
    allowed: bool = False


@dataclass(frozen=True)
class BreakerState:
    name: str
    state: str               # "closed", "open", "half_open"
    generation: int
    open_for_s: float        # seconds left open (0 unless open)
    calls: int               # in the sliding window (closed state)
    failures: int
    slow: int
    probes_in_flight: int
    probe_successes: int


@dataclass(frozen=True)
class StoreAllow:
    code: str                # "ok", "probe", "open", "busy"
    generation: int
    retry_after_s: float


STATE_NAMES = {"c": "closed", "o": "open", "h": "half_open"}
