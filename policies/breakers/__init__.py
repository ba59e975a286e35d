"""Circuit breakers per tier or upstream, in memory or shared through Redis."""

from policies.breakers.breakers import Breakers
from policies.breakers.memory_store import MemoryBreakerStore
from policies.breakers.types import AllOpen, BreakerState, Outcome, Permit, Rejection

__all__ = ["AllOpen", "BreakerState", "Breakers", "MemoryBreakerStore", "Outcome", "Permit", "Rejection"]
