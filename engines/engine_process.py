"""Engine cores in processes of their own, with the AsyncEngine's face for the gateway.

In one process the gateway's event loop and an engine thread share one GIL, and an engine that
uses both cores of a small machine pays OpenMP's wake-ups on every op of a step (its workers
sleep between ops, since spinning ones starve the event loop). Several engine processes of one
thread each avoid both: no GIL shared with the gateway, no team to wake, and the requests of a
tier spread over them (measured in docs/BENCHMARKS.md). This is vLLM V1's and SGLang's shape:
the HTTP side validates and streams, the engine core only steps.

Each worker process builds its engine from a picklable recipe (`build`, a module-level callable)
and steps it (engines/engine_worker.py); the two sides talk in engines/engine_messages.py's
typed messages. The parent validates every request
against the limits the workers reported before sending it, routes it to the worker with the
fewest requests in flight, and hands each worker's per-step outputs to the waiting event loops
in one callback per loop, as AsyncEngine does.

Faults: a step that raises fails its own requests (StepFailedError) and the worker goes on;
`max_step_failures` in a row, or a worker process that exits, makes the whole engine dead:
every waiter gets EngineDeadError, and `on_dead` tells the owner, who may build a new one.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import fields

from engines.async_engine import next_delta
from engines.engine_messages import (
    AbortRequest,
    AddRequest,
    BuildFailed,
    RequestFailed,
    SetThreads,
    Shutdown,
    StepFailed,
    StepOutputs,
    ThreadsSet,
    WorkerReady,
)
from engines.engine_worker import worker_main
from engines.errors import EngineDeadError, ModelLoadError, StepFailedError
from engines.grammar import GrammarCompiler
from engines.request_limits import RequestLimits
from engines.request_output import RequestOutput
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.stats import EngineStats

log = logging.getLogger(__name__)

MAX_STEP_FAILURES = 3
# A prompt whose first tokens a worker saw lately goes back to that worker (its prefix cache holds
# them) unless it has this many more requests in flight than the least busy worker.
AFFINITY_SLACK = 4
AFFINITY_TOKENS = 64            # the prompt's head that names its prefix
AFFINITY_ENTRIES = 4096         # prefixes remembered (oldest forgotten first)
SHUTDOWN_WAIT_S = 30.0                # for the workers to leave on their own after Shutdown
START_TIMEOUT_S = 600.0
# libgomp spin iterations before a waiting worker sleeps, for the workers of an engine that may
# run more threads while it is alone on the machine (`solo_threads`): long enough to span the
# Python between a step's ops, short enough that a worker left waiting soon stops using its core.
SOLO_SPIN_COUNT = 100_000
_SPAWN_ENV_LOCK = threading.Lock()
_STEP_FAILED = "the engine failed while computing this request"
_DEAD = "the engine stopped after repeated failures"
_EXITED = "an engine process exited"
_SHUT_DOWN = "the engine was shut down"


class _Worker:
    def __init__(self, index: int, process, commands, outputs):
        self.index = index
        self.process = process
        self.commands = commands
        self.outputs = outputs
        self.in_flight = 0
        self.threads = 0                 # its OpenMP team size, as it reported
        self.stats = EngineStats()
        # Commands leave through a thread of their own: a pipe write blocks while the worker's
        # reader is busy (compiling a grammar) and the pipe is full, and the event loop must not.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._send_loop, name=f"tiergate-engine-sender-{index}", daemon=True).start()

    def send(self, message) -> None:
        self._outbox.put(message)

    def close(self) -> None:
        self._outbox.put(None)

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                self.commands.send(message)
            except (OSError, ValueError):   # the worker is gone: its reader sees EOF and says so
                return


class ProcessEngine:
    """`workers` engine processes, each built by `build()` and running `threads` CPU threads."""

    def __init__(self, build: Callable[[], object], grammars: GrammarCompiler, *, tokenizer=None, workers: int = 1,
                 threads: int | None = None, solo_threads: int | None = None,
                 max_step_failures: int = MAX_STEP_FAILURES,
                 on_dead: Callable[[ProcessEngine], None] | None = None, start_timeout_s: float = START_TIMEOUT_S):
        """solo_threads: the thread count while `set_alone(True)` holds (the workers then spin
        briefly between ops); `threads` otherwise."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        if solo_threads is not None and threads is None:
            raise ValueError("solo_threads needs threads")
        self._threads, self._solo_threads = threads, solo_threads
        self._alone = False
        self.grammars = grammars         # the parent's compiler: refuses a bad grammar before it is sent
        self.tokenizer = tokenizer       # the model's, for the gateway's own use (rendering, grammars)
        self.on_dead = on_dead
        self.step_failures = 0
        self._lock = threading.Lock()
        self._sinks: dict[str, tuple[asyncio.Queue, asyncio.AbstractEventLoop, _Worker]] = {}
        self._affinity: dict[tuple, _Worker] = {}
        self._stopped: str | None = None
        self._dead = False
        self.dead_reason: str | None = None      # why it died, for the owner's readiness reason
        context = multiprocessing.get_context("spawn")   # never fork a process holding torch's threads
        self._workers: list[_Worker] = []
        for index in range(workers):
            cmd_read, cmd_write = context.Pipe(duplex=False)
            out_read, out_write = context.Pipe(duplex=False)
            process = context.Process(target=worker_main, name=f"tiergate-engine-{index}", daemon=True,
                                      args=(build, threads, cmd_read, out_write, max_step_failures))
            self._start(process, spin=solo_threads is not None)
            cmd_read.close()
            out_write.close()
            self._workers.append(_Worker(index, process, cmd_write, out_read))
        try:
            readies = [self._await_ready(w, start_timeout_s) for w in self._workers]
        except BaseException:
            self._terminate()
            raise
        self.limits: RequestLimits = readies[0].limits
        for worker, ready in zip(self._workers, readies, strict=True):
            worker.threads = ready.threads
        self.pids = [r.pid for r in readies]
        for worker in self._workers:
            threading.Thread(target=self._read, args=(worker,), name=f"tiergate-engine-reader-{worker.index}",
                             daemon=True).start()

    @staticmethod
    def _start(process, spin: bool) -> None:
        """Start a worker; with `spin`, its OpenMP runtime reads SOLO_SPIN_COUNT when torch loads
        there (a spawned process takes this process's environment, and libgomp reads it once)."""
        if not spin:
            process.start()
            return
        with _SPAWN_ENV_LOCK:
            before = os.environ.get("GOMP_SPINCOUNT")
            os.environ["GOMP_SPINCOUNT"] = str(SOLO_SPIN_COUNT)
            try:
                process.start()
            finally:
                if before is None:
                    del os.environ["GOMP_SPINCOUNT"]
                else:
                    os.environ["GOMP_SPINCOUNT"] = before

    def set_alone(self, alone: bool) -> None:
        """Whether this engine is the only one with work on the machine: with `solo_threads`,
        the workers switch to that many threads (or back to `threads`) before their next step.
        `threads_in_use` follows once they have."""
        if self._solo_threads is None or alone == self._alone:
            return
        self._alone = alone
        count = self._solo_threads if alone else self._threads
        for worker in self._workers:
            worker.send(SetThreads(count))

    @staticmethod
    def _await_ready(worker: _Worker, timeout_s: float) -> WorkerReady:
        deadline = time.monotonic() + timeout_s
        while not worker.outputs.poll(0.5):
            if not worker.process.is_alive():
                raise ModelLoadError(f"engine process {worker.index} exited while loading "
                                     f"(exit code {worker.process.exitcode})")
            if time.monotonic() > deadline:
                raise ModelLoadError(f"engine process {worker.index} did not load within {timeout_s:.0f} s")
        message = worker.outputs.recv()
        if isinstance(message, BuildFailed):
            raise ModelLoadError(f"engine process {worker.index} could not build its engine: {message.reason}")
        worker.stats = message.stats
        return message

    # ---- the AsyncEngine face ----------------------------------------------------------------
    @property
    def front(self) -> ProcessEngine:
        """What the gateway reads before submitting: these limits, checked here, in this process."""
        return self

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.limits.check(prompt_ids, params)

    @property
    def workers(self) -> int:
        return len(self._workers)

    @property
    def threads_in_use(self) -> int:
        """Threads per worker, as the workers last reported (the fewest, while they switch)."""
        return min(w.threads for w in self._workers)

    @property
    def dead(self) -> bool:
        return self._dead

    @property
    def stats(self) -> EngineStats:
        """The workers' counters summed (the last step's time: the slowest worker's)."""
        snapshots = [w.stats for w in self._workers]
        if len(snapshots) == 1:
            return snapshots[0]
        total = EngineStats()
        for f in fields(EngineStats):
            if f.name == "spec":
                continue
            values = [getattr(s, f.name) for s in snapshots]
            setattr(total, f.name, max(values) if f.name == "last_step_ms" else sum(values))
        for s in snapshots:
            for name, spec in s.spec.items():
                mine = total.spec_source(name, spec.max_drafts)
                for f in fields(spec):
                    if f.name in ("source", "max_drafts"):
                        continue
                    value = getattr(spec, f.name)
                    if f.name == "accepted_length_hist":
                        hist = mine.accepted_length_hist
                        hist.extend([0] * (len(value) - len(hist)))
                        for i, count in enumerate(value):
                            hist[i] += count
                    else:
                        setattr(mine, f.name, getattr(mine, f.name) + value)
        return total

    async def generate(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                       prefix_scope: str | None = None, priority: int = 0,
                       rank: int = 0) -> AsyncIterator[RequestOutput]:
        """As AsyncEngine.generate: deltas of one request; leaving the loop early aborts it."""
        if self._stopped is not None:
            raise EngineDeadError(self._stopped)
        self.check_request(prompt_ids, params)
        if params.grammar is not None:       # a bad or too slow grammar fails here, before it is sent
            await self.grammars.state_for(params.grammar)
        sink: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self._stopped is not None:
                raise EngineDeadError(self._stopped)
            if request_id in self._sinks:
                raise InvalidRequestError(f"request id {request_id!r} is already in flight")
            worker = self._choose(prefix_scope, prompt_ids)
            worker.in_flight += 1
            self._sinks[request_id] = (sink, asyncio.get_running_loop(), worker)
        worker.send(AddRequest(request_id, list(prompt_ids), params, prefix_scope, priority, rank))
        finished = False
        try:
            while not finished:
                item = await next_delta(sink)
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def _choose(self, prefix_scope: str | None, prompt_ids: list[int]) -> _Worker:
        """The least busy worker, unless a worker that served this prompt's head lately (and
        so holds its KV blocks) is no more than AFFINITY_SLACK requests busier. Under the lock."""
        least = min(self._workers, key=lambda w: (w.in_flight, w.index))
        if len(self._workers) == 1:
            return least
        key = (prefix_scope, tuple(prompt_ids[:AFFINITY_TOKENS]))
        cached = self._affinity.pop(key, None)
        worker = cached if cached is not None and cached.in_flight <= least.in_flight + AFFINITY_SLACK else least
        self._affinity[key] = worker            # most recent last
        if len(self._affinity) > AFFINITY_ENTRIES:
            del self._affinity[next(iter(self._affinity))]
        return worker

    def abort(self, request_id: str) -> None:
        with self._lock:
            entry = self._sinks.get(request_id)
        if entry is not None:
            entry[2].send(AbortRequest(request_id))

    def shutdown(self) -> None:
        self._stop(_SHUT_DOWN)
        for worker in self._workers:
            worker.send(Shutdown())
            worker.close()
        # One wait for all of them: workers that hang (stopped, or stuck in a step) each cost it
        # once, not once per worker; those still alive then are terminated.
        ends = time.monotonic() + SHUTDOWN_WAIT_S
        for worker in self._workers:
            worker.process.join(timeout=max(0.0, ends - time.monotonic()))
        self._terminate()
        self.grammars.shutdown()

    # ---- reader threads ----------------------------------------------------------------------
    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                message = worker.outputs.recv()
            except (EOFError, OSError):
                if self._stopped is None:
                    log.error("engine process %d exited (exit code %s)", worker.index, worker.process.exitcode)
                    self._declare_dead(_EXITED)
                return
            except Exception:  # noqa: BLE001 - an unreadable message: the worker's state is unknown
                log.exception("engine process %d sent an unreadable message", worker.index)
                self._declare_dead(_DEAD)
                return
            if isinstance(message, StepOutputs):
                worker.stats = message.stats
                self._deliver(message.outputs)
            elif isinstance(message, RequestFailed):
                self._fail(message.request_id, message.error)
            elif isinstance(message, ThreadsSet):
                worker.threads = message.count
            elif isinstance(message, StepFailed):
                worker.stats = message.stats
                self.step_failures += 1
                if message.dead:
                    self._declare_dead(_DEAD)
                    return
                for request_id in message.request_ids:
                    self._fail(request_id, StepFailedError(_STEP_FAILED))

    def _release(self, request_id: str):
        with self._lock:
            entry = self._sinks.pop(request_id, None)
            if entry is not None:
                entry[2].in_flight -= 1
        return entry

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        with self._lock:        # once per step's message, not per output
            for out in outputs:
                entry = self._sinks.pop(out.request_id, None) if out.finished else self._sinks.get(out.request_id)
                if entry is None:
                    continue
                if out.finished:
                    entry[2].in_flight -= 1
                batches.setdefault(entry[1], []).append((entry[0], out))
        for loop, items in batches.items():
            _put_all(loop, items)

    def _fail(self, request_id: str, error: BaseException) -> None:
        entry = self._release(request_id)
        if entry is not None:
            _put_all(entry[1], [(entry[0], error)])

    def _declare_dead(self, reason: str) -> None:
        with self._lock:
            if self._dead or self._stopped is not None:
                return
            self._dead, self.dead_reason = True, reason
        log.error("engine declared dead: %s", reason)
        if self.on_dead is not None:
            try:
                self.on_dead(self)
            except Exception:  # noqa: BLE001 - the owner's hook must not hide the failure
                log.exception("on_dead hook failed")
        self._stop(reason)
        self._terminate()

    def _stop(self, reason: str) -> None:
        with self._lock:
            if self._stopped is None:
                self._stopped = reason
            pending = list(self._sinks)
        for request_id in pending:
            self._fail(request_id, EngineDeadError(reason))

    def _terminate(self) -> None:
        for worker in self._workers:
            worker.close()
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=10)


def _put_all(loop: asyncio.AbstractEventLoop, items: list) -> None:
    def put_all() -> None:
        for sink, item in items:
            sink.put_nowait(item)
    try:
        loop.call_soon_threadsafe(put_all)
    except RuntimeError:        # the waiter's loop has closed: it is gone already
        pass
