"""Hot reload of the config file on SIGHUP or when the file changes (polled).

The new config is validated and its new tiers started before one reference assignment
swaps it in; requests in flight finish on the snapshot they began with. A bad file, or a
change that needs a restart (an embedded tier added, removed or changed: its engine owns
memory and threads), is logged and the old config stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from gateway.runtime import RuntimeHolder, build_runtime, same_tier_config
from gateway.tiers.embedded import EmbeddedTier
from policies.config import ConfigError, GatewayConfig, is_loopback, load_config
from policies.tier_config import EmbeddedTierConfig

log = logging.getLogger(__name__)


class ReloadRejected(ValueError):
    pass


class ConfigReloader:
    def __init__(self, holder: RuntimeHolder, path: str | Path, host: str):
        self.holder = holder
        self.path = Path(path)
        self.host = host
        self._mtime = self._stat()
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task] = set()
        self.last_error: str | None = None

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime, st.st_size

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload("SIGHUP")))
        except (NotImplementedError, RuntimeError, ValueError):   # not the main thread, or no SIGHUP here
            log.info("SIGHUP reload unavailable; polling %s only", self.path)
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            interval = self.holder.current.config.server.reload_poll_s
            await asyncio.sleep(interval if interval > 0 else 5.0)
            if interval <= 0:
                continue
            mtime = self._stat()
            if mtime is not None and mtime != self._mtime:
                await self.reload("file changed")

    async def reload(self, why: str) -> bool:
        """Load, check and swap in the config file; False (old config kept) on any problem."""
        async with self._lock:
            self._mtime = self._stat()
            try:
                config = await asyncio.to_thread(load_config, self.path)
                self._check(config)
            except (ConfigError, ReloadRejected) as exc:
                self.last_error = str(exc)
                log.error("config reload (%s) rejected, keeping the old config: %s", why, exc)
                return False
            old = self.holder.current
            runtime = build_runtime(config, old.tiers, self.holder.calibration)
            fresh = [t for name, t in runtime.tiers.items() if old.tiers.get(name) is not t]
            for tier in fresh:
                await tier.start()    # upstream tiers only: opening a client is instant
            self.holder.swap(runtime)
            self.last_error = None
            retired = [t for name, t in old.tiers.items() if runtime.tiers.get(name) is not t]
            if retired:
                task = asyncio.create_task(self._retire(retired))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            log.warning("config reloaded (%s): %d tiers, %d new", why, len(runtime.tiers), len(fresh))
            return True

    def _check(self, config: GatewayConfig) -> None:
        if not config.auth.enabled and not is_loopback(self.host):
            raise ReloadRejected(f"auth is off but the server listens on {self.host}, not loopback")
        old = self.holder.current.tiers
        for name, tier in old.items():
            new_cfg = config.tiers.get(name)
            if isinstance(tier, EmbeddedTier) and (new_cfg is None or not same_tier_config(tier.config, new_cfg)):
                raise ReloadRejected(f"embedded tier {name!r} was removed or changed: restart to apply")
        for name, cfg in config.tiers.items():
            if isinstance(cfg, EmbeddedTierConfig) and name not in old:
                raise ReloadRejected(f"embedded tier {name!r} is new: restart to load it")

    @staticmethod
    async def _retire(tiers) -> None:
        # Requests already routed to them may still be reading: close after the longest read timeout.
        grace = max((getattr(t.config, "read_timeout_s", 0) for t in tiers), default=0)
        await asyncio.sleep(min(grace, 300))
        for tier in tiers:
            await tier.close()
