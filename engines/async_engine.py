"""Async face of the engine for the gateway.

The engine steps in its own thread so the event loop never waits on the model. Requests
and aborts cross into that thread through a command queue applied before every step;
deltas come back to each request's asyncio.Queue via call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engines.llm_engine import LLMEngine, RequestOutput
from engines.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an unexpected error; requests cannot be served."""


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    prefix_scope: str | None
    priority: int
    sink: asyncio.Queue
    loop: asyncio.AbstractEventLoop


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._sinks: dict[str, tuple[asyncio.Queue, asyncio.AbstractEventLoop]] = {}
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="tiergate-engine", daemon=True)
        self._thread.start()

    @property
    def stats(self):
        return self.engine.stats

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                       prefix_scope: str | None = None, priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Submit a request and iterate its deltas. Leaving the loop early aborts it."""
        if self._error is not None:
            raise EngineDeadError(f"engine stopped: {self._error}")
        # Raise InvalidRequestError here, in the caller, not later in the engine thread.
        self.engine.check_request(prompt_ids, params)
        sink: asyncio.Queue = asyncio.Queue()
        self._commands.put(_Add(request_id, prompt_ids, params, prefix_scope, priority, sink,
                                asyncio.get_running_loop()))
        self._wakeup.set()
        finished = False
        try:
            while True:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))
        self._wakeup.set()

    def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        self._thread.join(timeout=30)

    # ---- engine thread ---------------------------------------------------------------
    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                try:
                    self.engine.add_request(cmd.request_id, cmd.prompt_ids, cmd.params, cmd.prefix_scope, cmd.priority)
                except Exception as exc:  # a bad request fails alone; accepted work goes on
                    cmd.loop.call_soon_threadsafe(cmd.sink.put_nowait, exc)
                    continue
                self._sinks[cmd.request_id] = (cmd.sink, cmd.loop)
            else:
                out = self.engine.abort_request(cmd.request_id)
                sink = self._sinks.pop(cmd.request_id, None)
                if out is not None and sink is not None:
                    sink[1].call_soon_threadsafe(sink[0].put_nowait, out)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._wakeup.wait(timeout=0.5)
                    self._wakeup.clear()
                    continue
                for out in self.engine.step():
                    sink = self._sinks.get(out.request_id)
                    if sink is None:
                        continue
                    if out.finished:
                        del self._sinks[out.request_id]
                    sink[1].call_soon_threadsafe(sink[0].put_nowait, out)
        except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
            log.exception("engine thread failed")
            self._error = exc
            for sink, loop in self._sinks.values():
                loop.call_soon_threadsafe(sink.put_nowait, EngineDeadError(f"engine stopped: {exc}"))
            self._sinks.clear()
