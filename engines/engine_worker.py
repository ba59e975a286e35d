"""The engine process's side of engines/engine_process.py: build the engine from its picklable
recipe, then loop: apply the commands that came in (add, abort, set threads, shut down), step,
send the step's outputs and the engine's counters in one message. Constrained requests' grammars
are compiled while the reader thread waits (on the grammar compiler's worker), never in the
stepping one."""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Callable

from engines.engine_messages import (
    AbortRequest,
    AddRequest,
    BuildFailed,
    Command,
    RequestFailed,
    SetThreads,
    Shutdown,
    StepFailed,
    StepOutputs,
    ThreadsSet,
    WorkerMessage,
    WorkerReady,
)
from engines.request_output import RequestOutput

log = logging.getLogger(__name__)


def worker_main(build: Callable[[], object], threads: int | None, commands, outputs,
                max_step_failures: int) -> None:
    """The worker process: build the engine, then step until told to stop or the parent goes."""
    import torch

    if threads is not None:
        # On this thread, the stepping one: OpenMP keeps the team size per calling thread.
        torch.set_num_threads(threads)
    send_lock = threading.Lock()

    def send(message: WorkerMessage) -> None:
        with send_lock:
            outputs.send(message)

    try:
        engine = build()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the tier
        send(BuildFailed(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
        return
    send(WorkerReady(engine.limits, torch.get_num_threads(), os.getpid(), engine.stats))
    inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
    wake = threading.Event()

    def read() -> None:
        while True:
            try:
                message = commands.recv()
            except (EOFError, OSError):            # the parent is gone
                message = Shutdown()
            if isinstance(message, AddRequest) and message.params.grammar is not None:
                try:        # compiled here, off the stepping thread (cached by digest)
                    message = dataclasses.replace(message,
                                                  grammar_state=engine.grammars.new_state(message.params.grammar))
                except Exception as exc:  # noqa: BLE001 - the request fails alone
                    send(RequestFailed(message.request_id, exc))
                    continue
            inbox.put(message)
            wake.set()
            if isinstance(message, Shutdown):
                return

    threading.Thread(target=read, name="tiergate-engine-commands", daemon=True).start()
    failures_in_a_row = 0
    while True:
        aborted: list[RequestOutput] = []
        while True:
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(message, Shutdown):
                engine.shutdown()
                return
            if isinstance(message, AbortRequest):
                out = engine.abort_request(message.request_id)
                if out is not None:
                    aborted.append(out)
            elif isinstance(message, SetThreads):
                torch.set_num_threads(message.count)       # from the next step's first op
                send(ThreadsSet(torch.get_num_threads()))
            else:
                try:
                    engine.add_request(message.request_id, message.prompt_ids, message.params, message.prefix_scope,
                                       message.priority, message.grammar_state, message.rank)
                except Exception as exc:  # noqa: BLE001 - a bad request fails alone
                    send(RequestFailed(message.request_id, exc))
        if aborted:
            send(StepOutputs(aborted, engine.stats))
        if not engine.has_unfinished():
            wake.wait(timeout=0.5)
            wake.clear()
            continue
        try:
            step_outputs = engine.step()
        except Exception:  # noqa: BLE001 - contained: only that step's requests fail
            failures_in_a_row += 1
            failed = engine.step_request_ids
            log.exception("engine step failed (%d in a row); dropping %d request(s)", failures_in_a_row, len(failed))
            for request_id in failed:
                engine.abort_request(request_id)
            dead = failures_in_a_row >= max_step_failures
            send(StepFailed(list(failed), dead, engine.stats))
            if dead:
                return
            continue
        failures_in_a_row = 0
        send(StepOutputs(step_outputs, engine.stats))
