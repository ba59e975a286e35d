"""Clocks for the budget and breaker store tests: a fake one for the memory store, the machine's
for Redis, with the same interface."""

from __future__ import annotations

import asyncio
import time


class FakeClock:
    """The memory store's clock: time passes only when the test sleeps."""

    def __init__(self):
        self.us = int(time.time() * 1e6)

    def __call__(self) -> int:
        return self.us

    async def sleep(self, seconds: float) -> None:
        self.us += int(seconds * 1e6)
        await asyncio.sleep(0)

    def now(self) -> float:
        return self.us / 1e6


class RealClock:
    """Redis' clock is the machine's (the test runs on the same host)."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def now(self) -> float:
        return time.time()
