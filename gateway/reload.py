"""Hot reload of the config file on SIGHUP or when the file changes (polled).

The new config is validated and its new tiers started before one reference assignment
swaps it in; requests in flight finish on the snapshot they began with. A bad file, or a
change that needs a restart (an embedded tier added, removed or changed: its engine owns
memory and threads; the address the server listens on; the interpreter's switch interval, set
once at start), is logged and the old config stays. Relative file names in the config are
looked up next to it, as at start.

A file being written can be valid YAML half-way (the first tiers, no auth section yet), so
polling loads a changed file only once it has stayed the same (size, mtime and content hash)
for `server.reload_settle_s`, seen so on two polls at least; a read that overlaps a write (the
file's size or mtime moved while it was read) is no read at all. SIGHUP is the operator saying
the file is complete: it loads at once, with the same overlap check. Whatever goes wrong in a
poll is logged and the polling goes on: a reload task that died would leave the gateway on its
old config with nobody told.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.runtime import RuntimeHolder, build_runtime, same_tier_config
from gateway.tiers.embedded import EmbeddedTier
from policies.config import ConfigError, GatewayConfig, decode_config, is_loopback, parse_config
from policies.tier_config import EmbeddedTierConfig

log = logging.getLogger(__name__)


class ReloadRejected(ValueError):
    pass


@dataclass(frozen=True)
class FileVersion:
    size: int
    mtime_ns: int
    sha256: str


# Server settings read once, when the server starts.
RESTART_ONLY_SERVER_FIELDS = ("host", "port", "gil_switch_interval_ms")


@dataclass(frozen=True)
class FileRead:
    version: FileVersion
    data: bytes


class ConfigReloader:
    def __init__(self, holder: RuntimeHolder, path: str | Path, host: str):
        self.holder = holder
        self.path = Path(path)
        self.host = host
        self._loaded = self._version_now()       # the version served (or last tried): not loaded again
        self._seen: tuple[FileVersion, float] | None = None   # a changed version, and when it was first seen
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._retiring: set[asyncio.Task] = set()
        self.last_error: str | None = None
        # For the operator console: what is served, when it was last swapped in, the last refusal.
        self.served_sha256: str | None = self._loaded.sha256 if self._loaded is not None else None
        self.reloaded_at: float | None = None
        self.rejected: dict | None = None     # {"at", "why", "error", "sha256"} of the last rejected file

    def _version_now(self) -> FileVersion | None:
        try:
            return self.read().version
        except ConfigError:
            return None

    def read(self) -> FileRead:
        """The file's text and version; ConfigError when it cannot be read or changed while read."""
        try:
            before = os.stat(self.path)
            data = self.path.read_bytes()
            after = os.stat(self.path)
        except FileNotFoundError:
            raise ConfigError(f"{self.path}: file not found") from None
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read ({exc.strerror})") from None
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or len(data) != after.st_size:
            raise ConfigError(f"{self.path}: the file changed while it was read")
        # Decoded when it is loaded, so that a settled file that is not UTF-8 is reported, not
        # taken for one still being written.
        return FileRead(FileVersion(after.st_size, after.st_mtime_ns, hashlib.sha256(data).hexdigest()), data)

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
            try:
                await self.poll_once()
            except Exception:
                log.exception("config file check failed; checking again in %gs", interval)

    async def poll_once(self) -> bool | None:
        """One look at the file. A changed file is loaded once it has stayed the same for
        reload_settle_s (on two looks at least); returns the reload's verdict, None when nothing
        was loaded."""
        try:
            read = await asyncio.to_thread(self.read)
        except ConfigError:
            self._seen = None       # gone, unreadable or being written: look again next time
            return None
        version = read.version
        if version == self._loaded:
            self._seen = None
            return None
        now = time.monotonic()
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, now)     # new since the last look: it may still be being written
            return None
        if now - self._seen[1] < self.holder.current.config.server.reload_settle_s:
            return None
        self._seen = None
        return await self.reload("file changed", read)

    async def reload(self, why: str, read: FileRead | None = None) -> bool:
        """Load, check and swap in the config file (`read`: its content as a poll saw it);
        False (old config kept) on any problem."""
        async with self._lock:
            try:
                read = read or await asyncio.to_thread(self.read)
                self._loaded = read.version     # a rejected file is not tried again until it changes
                text = decode_config(read.data, str(self.path))
                config = await asyncio.to_thread(parse_config, text, str(self.path), self.path.parent)
                self._check(config)
                swapped = await self._swap(config, why)
                self.served_sha256, self.reloaded_at = read.version.sha256, time.time()
                return swapped
            except (ConfigError, ReloadRejected) as exc:
                self.last_error = str(exc)
                self._rejected(why, read)
                log.error("config reload (%s) rejected, keeping the old config: %s", why, exc)
                return False
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._rejected(why, read)
                log.exception("config reload (%s) failed, keeping the old config", why)
                return False

    def _rejected(self, why: str, read: FileRead | None) -> None:
        self.rejected = {"at": time.time(), "why": why, "error": self.last_error,
                         "sha256": read.version.sha256 if read is not None else None}

    async def _swap(self, config: GatewayConfig, why: str) -> bool:
        old = self.holder.current
        runtime = build_runtime(config, old.tiers, self.holder.calibration)
        fresh = [t for name, t in runtime.tiers.items() if old.tiers.get(name) is not t]
        try:
            for tier in fresh:
                await tier.start()    # upstream tiers only: opening a client is instant
        except BaseException:
            await asyncio.gather(*(t.close() for t in fresh), return_exceptions=True)
            raise
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
        for field in RESTART_ONLY_SERVER_FIELDS:
            if getattr(config.server, field) != getattr(self.holder.current.config.server, field):
                raise ReloadRejected(f"server.{field} changed: restart to apply")
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
