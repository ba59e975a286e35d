"""What an engine process and its parent (engines/engine_process.py, engines/engine_worker.py)
send each other through their pipes: one frozen dataclass per kind of message, matched by type."""

from __future__ import annotations

from dataclasses import dataclass

from engines.request_limits import RequestLimits
from engines.request_output import RequestOutput
from engines.sampling_params import SamplingParams
from engines.stats import EngineStats


# ---- parent -> worker -------------------------------------------------------------------------
@dataclass(frozen=True)
class AddRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    prefix_scope: str | None
    priority: int
    rank: int
    grammar_state: object | None = None     # set in the worker, once its reader has compiled the grammar


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class SetThreads:
    count: int


@dataclass(frozen=True)
class Shutdown:
    pass


Command = AddRequest | AbortRequest | SetThreads | Shutdown


# ---- worker -> parent -------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerReady:
    limits: RequestLimits
    threads: int
    pid: int
    stats: EngineStats


@dataclass(frozen=True)
class BuildFailed:
    reason: str


@dataclass(frozen=True)
class StepOutputs:
    """A step's outputs (or the outputs of aborts), and the engine's counters after it."""
    outputs: list[RequestOutput]
    stats: EngineStats


@dataclass(frozen=True)
class RequestFailed:
    """One request refused or failed alone (a bad grammar, a duplicate id)."""
    request_id: str
    error: BaseException


@dataclass(frozen=True)
class ThreadsSet:
    count: int


@dataclass(frozen=True)
class StepFailed:
    """A step raised: its requests are dropped; `dead` once too many failed in a row."""
    request_ids: list[str]
    dead: bool
    stats: EngineStats


WorkerMessage = WorkerReady | BuildFailed | StepOutputs | RequestFailed | ThreadsSet | StepFailed
