"""The config poller against a file being written and against its own failures, on the real
reloader and runtime (an upstream tier that is never called: no HTTP at all)."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway import reload as reload_module
from gateway.reload import ConfigReloader
from gateway.runtime import RuntimeHolder, build_runtime
from policies.config import load_config

POLL_S = 0.05


def _text(models: list[str], settle_s: float) -> str:
    chains = "".join(f"  {m}: {{chain: [up]}}\n" for m in models)
    return (f"auth: {{enabled: false}}\nserver: {{reload_poll_s: {POLL_S}, reload_settle_s: {settle_s}}}\n"
            "tiers:\n  up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: x}\n"
            f"models:\n{chains}")


class Watched:
    """A holder whose swaps are recorded (the model aliases of each config swapped in)."""

    def __init__(self, path):
        self.holder = RuntimeHolder(build_runtime(load_config(path)), str(path))
        self.swapped: list[list[str]] = []
        swap = self.holder.swap

        def recording_swap(runtime):
            self.swapped.append(list(runtime.config.models))
            swap(runtime)
        self.holder.swap = recording_swap
        self.reloader = ConfigReloader(self.holder, path, "127.0.0.1")

    async def until(self, condition, timeout_s: float = 20) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"timed out; swapped so far: {self.swapped}"
            await asyncio.sleep(POLL_S)


def _polling(watched: Watched) -> asyncio.Task:
    return asyncio.create_task(watched.reloader._poll())    # what start() runs, without a SIGHUP handler


async def _stop(task: asyncio.Task, watched: Watched) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await watched.reloader.stop()
    await asyncio.gather(*(t.close() for t in watched.holder.current.tiers.values()), return_exceptions=True)


async def test_a_half_written_valid_yaml_is_never_swapped_in(tmp_path):
    settle_s = 2.0
    path = tmp_path / "gateway.yaml"
    path.write_text(_text(["alpha"], settle_s))
    watched = Watched(path)
    task = _polling(watched)
    try:
        full = _text(["full"], settle_s)
        # Cut before `models:`: the first part alone is a valid config (one model per tier: `up`).
        first, rest = full[:full.index("models:")], full[full.index("models:"):]
        with open(path, "w") as f:
            f.write(first)
            f.flush()
            await asyncio.sleep(0.5)      # several polls see the first part alone
            f.write(rest)
        await watched.until(lambda: watched.swapped)
        assert watched.swapped == [["full"]]
        assert list(watched.holder.current.config.models) == ["full"]
    finally:
        await _stop(task, watched)


async def test_an_unchanged_file_is_not_loaded_again(tmp_path):
    path = tmp_path / "gateway.yaml"
    path.write_text(_text(["alpha"], 0))
    watched = Watched(path)
    task = _polling(watched)
    try:
        path.write_text(_text(["beta"], 0))
        await watched.until(lambda: watched.swapped)
        await asyncio.sleep(20 * POLL_S)
        assert watched.swapped == [["beta"]]
    finally:
        await _stop(task, watched)


async def test_an_exception_in_a_reload_does_not_stop_the_polling(tmp_path, monkeypatch, caplog):
    path = tmp_path / "gateway.yaml"
    path.write_text(_text(["alpha"], 0))
    watched = Watched(path)
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("disk on fire")
        return build_runtime(*args, **kwargs)

    monkeypatch.setattr(reload_module, "build_runtime", failing_once)
    task = _polling(watched)
    try:
        with caplog.at_level(logging.ERROR, logger="gateway.reload"):
            path.write_text(_text(["beta"], 0))
            await watched.until(lambda: calls)
            await asyncio.sleep(5 * POLL_S)
            assert not task.done(), "the poll task died"
            assert list(watched.holder.current.config.models) == ["alpha"]     # the old config stays
            assert any("disk on fire" in (r.exc_text or r.getMessage()) for r in caplog.records)
        path.write_text(_text(["gamma"], 0))
        await watched.until(lambda: watched.swapped)
        assert watched.swapped == [["gamma"]]
    finally:
        await _stop(task, watched)
