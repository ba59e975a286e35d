"""Each tenant's share of the gateway's connections to one upstream tier.

Without it one tenant's slow or stalled calls can hold every connection of the pool, and every
other tenant waits for a slot it never gets. A tenant at its share waits (up to the pool
timeout) for one of its own calls to end; past that the call is refused as the tenant's own
overload, which does not touch the tier's breaker.
"""

from __future__ import annotations

import asyncio


class TenantShares:
    def __init__(self, limit: int, timeout_s: float):
        self.limit = limit
        self._timeout = timeout_s
        self._gates: dict[str | None, asyncio.Semaphore] = {}   # one per tenant: the config names them all
        self._held: dict[str | None, int] = {}

    def held(self, tenant: str | None) -> int:
        return self._held.get(tenant, 0)

    async def acquire(self, tenant: str | None) -> bool:
        """Take one of the tenant's slots; False if none came free within the timeout."""
        gate = self._gates.get(tenant)
        if gate is None:
            gate = self._gates[tenant] = asyncio.Semaphore(self.limit)
        if gate.locked():
            try:
                async with asyncio.timeout(self._timeout):
                    await gate.acquire()
            except TimeoutError:
                return False
        else:
            await gate.acquire()       # free: returns at once
        self._held[tenant] = self._held.get(tenant, 0) + 1
        return True

    def release(self, tenant: str | None) -> None:
        self._held[tenant] -= 1
        self._gates[tenant].release()
