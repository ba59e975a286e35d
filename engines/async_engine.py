"""Async face of the engine for the gateway.

The engine steps in its own thread so the event loop never waits on the model. Requests
and aborts cross into that thread through a command queue applied before every step;
deltas come back to each request's asyncio.Queue via call_soon_threadsafe.

Faults: a step that raises fails the requests it was computing (StepFailedError, their KV
blocks freed) and the engine goes on with every other request. Only when steps keep failing
(`max_step_failures` in a row) is the engine declared dead: every waiter gets EngineDeadError,
new requests are refused, and `on_dead` tells the owner, who may build a new engine.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import torch

from engines.errors import EngineDeadError, StepFailedError
from engines.grammar import GrammarState
from engines.llm_engine import LLMEngine, RequestOutput
from engines.sampling_params import SamplingParams
from engines.thread_count import set_thread_count

__all__ = ["MAX_STEP_FAILURES", "AsyncEngine", "EngineDeadError", "StepFailedError"]

log = logging.getLogger(__name__)

# One failing step is contained: its requests are dropped and the rest go on. A transient fault
# (an allocation that failed once, a request-shaped input that trips a kernel) does not repeat
# with the next step's different batch. Three failures in a row, each dropping its batch, point
# at the engine itself (a kernel, the device): carrying on would fail every request one step at
# a time, so the engine stops and its owner rebuilds it.
MAX_STEP_FAILURES = 3

_STEP_FAILED = "the engine failed while computing this request"
_DEAD = "the engine stopped after repeated failures"
_SHUT_DOWN = "the engine was shut down"


@dataclass
class _Add:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    prefix_scope: str | None
    priority: int
    rank: int
    sink: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    grammar: GrammarState | None = None


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    def __init__(self, engine: LLMEngine, *, max_step_failures: int = MAX_STEP_FAILURES,
                 on_dead: Callable[[AsyncEngine], None] | None = None, threads: int | None = None):
        """`on_dead(self)` is called once, from the engine thread, when the engine is declared
        dead (not on shutdown). `threads`: the CPU threads this engine's ops use (its OpenMP
        team), set for the engine thread alone (engines/thread_count.py). None: torch's default."""
        if max_step_failures < 1:
            raise ValueError("max_step_failures must be at least 1")
        if threads is not None and threads < 1:
            raise ValueError("threads must be at least 1")
        self.engine = engine
        self.threads = threads
        self.threads_in_use: int | None = None   # as the engine thread sees it, once started
        self.max_step_failures = max_step_failures
        self.on_dead = on_dead
        self.step_failures = 0            # steps that raised, over the engine's life
        self._failures_in_a_row = 0
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        # Held while a request is queued and while the engine is declared stopped, so that no
        # request slips into the queue after the thread drained it for the last time.
        self._lock = threading.Lock()
        self._sinks: dict[str, tuple[asyncio.Queue, asyncio.AbstractEventLoop]] = {}
        self._stopping = False
        self._stopped: str | None = None  # why the engine takes no more requests
        self._dead = False                # stopped by failures, not by shutdown()
        self.dead_reason: str | None = None
        self._thread = threading.Thread(target=self._run, name="tiergate-engine", daemon=True)
        self._thread.start()

    @property
    def stats(self):
        return self.engine.stats

    @property
    def grammars(self):
        """The engine's grammar compiler (its worker thread outlives a dead engine thread)."""
        return self.engine.grammars

    @property
    def front(self) -> LLMEngine:
        """What the gateway reads before submitting (limits, tokenizer, request checks)."""
        return self.engine

    @property
    def dead(self) -> bool:
        """Declared dead after repeated step failures (or an error outside a step)."""
        return self._dead

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                       prefix_scope: str | None = None, priority: int = 0,
                       rank: int = 0) -> AsyncIterator[RequestOutput]:
        """Submit a request and iterate its deltas. Leaving the loop early aborts it.

        Raises InvalidRequestError (before anything runs), StepFailedError (a step computing it
        raised), EngineDeadError (the engine stopped)."""
        if self._stopped is not None:
            raise EngineDeadError(self._stopped)
        # Raise InvalidRequestError here, in the caller, not later in the engine thread.
        self.engine.check_request(prompt_ids, params)
        # A constraint is compiled (or found in the cache) in the compiler's worker, never on the
        # engine thread; a bad or too slow one raises GrammarError here.
        grammar = await self.engine.grammars.state_for(params.grammar) if params.grammar is not None else None
        sink: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self._stopped is not None:
                raise EngineDeadError(self._stopped)
            self._commands.put(_Add(request_id, prompt_ids, params, prefix_scope, priority, rank, sink,
                                    asyncio.get_running_loop(), grammar))
        self._wakeup.set()
        finished = False
        try:
            while not finished:
                item = await next_delta(sink)
                finished = item.finished
                yield item
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
        self.engine.shutdown()

    # ---- engine thread ---------------------------------------------------------------
    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Add):
                try:
                    self.engine.add_request(cmd.request_id, cmd.prompt_ids, cmd.params, cmd.prefix_scope, cmd.priority,
                                            cmd.grammar, cmd.rank)
                except Exception as exc:  # a bad request fails alone; accepted work goes on
                    _put(cmd.loop, cmd.sink, exc)
                    continue
                self._sinks[cmd.request_id] = (cmd.sink, cmd.loop)
            else:
                out = self.engine.abort_request(cmd.request_id)
                sink = self._sinks.pop(cmd.request_id, None)
                if out is not None and sink is not None:
                    _put(sink[1], sink[0], out)

    def _run(self) -> None:
        try:
            self.threads_in_use = (torch.get_num_threads() if self.threads is None
                                   else set_thread_count(self.threads))
            while not self._stopping:
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._wakeup.wait(timeout=0.5)
                    self._wakeup.clear()
                    continue
                try:
                    outputs = self.engine.step()
                except Exception:  # noqa: BLE001 - contained: only that step's requests fail
                    if self._step_failed():
                        return
                    continue
                self._failures_in_a_row = 0
                self._deliver(outputs)
        except BaseException:  # noqa: BLE001 - outside a step: the engine's state is unknown
            log.exception("engine thread failed")
            self._declare_dead()
            self._stop(_DEAD)
            return
        self._stop(_SHUT_DOWN)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """One hand-over per event loop per step, not one per request: each call_soon_threadsafe
        wakes the loop (a write to its self-pipe) and takes the GIL from the next step's Python."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            sink = self._sinks.get(out.request_id)
            if sink is None:
                continue
            if out.finished:
                del self._sinks[out.request_id]
            batches.setdefault(sink[1], []).append((sink[0], out))
        for loop, items in batches.items():
            _put_all(loop, items)

    def _step_failed(self) -> bool:
        """Drop the failed step's requests (freeing their blocks); True if the engine is now dead."""
        self.step_failures += 1
        self._failures_in_a_row += 1
        failed = self.engine.step_request_ids
        log.exception("engine step failed (%d in a row); dropping its %d request(s): %s",
                      self._failures_in_a_row, len(failed), ", ".join(failed))
        dead = self._failures_in_a_row >= self.max_step_failures
        if dead:
            log.error("engine declared dead after %d failed steps in a row", self._failures_in_a_row)
            self._declare_dead()
        for request_id in failed:
            self.engine.abort_request(request_id)
            self._fail(request_id, StepFailedError(_STEP_FAILED))
        if dead:
            self._stop(_DEAD)
        return dead

    def _declare_dead(self) -> None:
        """Refuse new requests and tell the owner before any waiter hears of the failure: a
        client told of it then finds the engine (and its tier) not ready already."""
        with self._lock:
            if self._dead:
                return
            self._stopped, self._dead = _DEAD, True
        self.dead_reason = _DEAD
        if self.on_dead is not None:
            try:
                self.on_dead(self)
            except Exception:  # noqa: BLE001 - the owner's hook must not hide the failure
                log.exception("on_dead hook failed")

    def _fail(self, request_id: str, error: BaseException) -> None:
        sink = self._sinks.pop(request_id, None)
        if sink is not None:
            _put(sink[1], sink[0], error)

    def _stop(self, reason: str) -> None:
        """No more requests: every waiter, and every request still queued, hears `reason`."""
        with self._lock:
            if self._stopped is None:
                self._stopped = reason
            pending = []
            while True:
                try:
                    pending.append(self._commands.get_nowait())
                except queue.Empty:
                    break
        for cmd in pending:
            if isinstance(cmd, _Add):
                _put(cmd.loop, cmd.sink, EngineDeadError(reason))
        for request_id in list(self._sinks):
            try:    # best effort: a dead engine's state may be what failed
                self.engine.abort_request(request_id)
            except Exception:  # noqa: BLE001
                pass
            self._fail(request_id, EngineDeadError(reason))


async def next_delta(sink: asyncio.Queue) -> RequestOutput:
    """A request's next delta from its queue; an error the engine put there instead is raised."""
    item = await sink.get()
    if isinstance(item, BaseException):
        raise item
    return item


def _put_all(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    """Hand a step's outputs to their waiters on one loop, in one callback."""
    def put_all() -> None:
        for sink, item in items:
            sink.put_nowait(item)
    try:
        loop.call_soon_threadsafe(put_all)
    except RuntimeError:
        pass


def _put(loop: asyncio.AbstractEventLoop, sink: asyncio.Queue, item) -> None:
    """Hand `item` to a waiter on its loop; a waiter whose loop has closed is gone already."""
    try:
        loop.call_soon_threadsafe(sink.put_nowait, item)
    except RuntimeError:
        pass
