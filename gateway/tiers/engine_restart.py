"""Restarting an embedded tier's engine after it died, in the background: with backoff, at most
`max_restarts` attempts within `window_s`, every step logged. Past the limit the tier gives up
(it stays failed until the process restarts): a fault that survives a fresh engine several
times is not one a restart fixes, and each attempt would cost its batch of requests again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engines.llm_engine import LLMEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    # Wait before the 1st, 2nd, 3rd ... attempt of a window (the last value repeats): the
    # first is short, as most faults that kill an engine are not the device being gone.
    backoff_s: tuple[float, ...] = (1.0, 5.0, 30.0)
    max_restarts: int = 3
    window_s: float = 600.0


class EngineRestarter:
    """One tier's restarts. `rebuild()` runs in a worker thread and returns a new engine;
    `on_restarted(engine)` and `on_give_up(reason)` run on the event loop. `sleep` waits out
    each backoff (a test may hold a restart there)."""

    def __init__(self, tier_name: str, rebuild: Callable[[], LLMEngine],
                 on_restarted: Callable[[LLMEngine], None], on_give_up: Callable[[str], None],
                 policy: RestartPolicy | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        self.tier_name = tier_name
        self.policy = policy or RestartPolicy()
        self.restarts = 0                      # engines rebuilt over the tier's life
        self.sleep = sleep
        self._rebuild = rebuild
        self._on_restarted = on_restarted
        self._on_give_up = on_give_up
        self._clock = clock
        self._attempts: deque[float] = deque()   # when each attempt of the window started
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Begin restarting (on the event loop); a restart already under way is left alone."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"restart-{self.tier_name}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        policy, name = self.policy, self.tier_name
        while True:
            now = self._clock()
            while self._attempts and now - self._attempts[0] > policy.window_s:
                self._attempts.popleft()
            done = len(self._attempts)
            if done >= policy.max_restarts:
                reason = f"engine kept stopping: gave up after {done} restarts within {policy.window_s:g}s"
                log.error("tier %s: %s", name, reason)
                self._on_give_up(reason)
                return
            delay = policy.backoff_s[min(done, len(policy.backoff_s) - 1)]
            self._attempts.append(now)
            log.warning("tier %s: engine stopped; restart %d of at most %d in %.1fs",
                        name, done + 1, policy.max_restarts, delay)
            await self.sleep(delay)
            try:
                engine = await asyncio.to_thread(self._rebuild)
            except Exception as exc:  # noqa: BLE001 - logged; the next attempt (or giving up) follows
                log.error("tier %s: engine restart failed: %s", name, str(exc).splitlines()[0] if str(exc) else
                          type(exc).__name__)
                continue
            self.restarts += 1
            self._on_restarted(engine)
            log.warning("tier %s: engine restarted (%d restart(s) so far)", name, self.restarts)
            return
