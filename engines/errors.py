"""Errors the engine raises for problems a user can fix (bad path, corrupt file, a request too
long for this engine). Each kind is its own class with a machine-readable code, so callers
decide by type and never by the message, which is written for people."""

from __future__ import annotations

from enum import StrEnum

from engines.sampling_params import InvalidRequestError


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line a user can act on."""


class ErrorCode(StrEnum):
    """Which of an engine's fixed limits a request exceeds."""

    CONTEXT_LENGTH = "context_length_exceeded"   # prompt + max_tokens beyond max_model_len
    KV_CAPACITY = "kv_capacity_exceeded"         # more KV blocks than the pool can ever free


class RequestTooLongError(InvalidRequestError):
    """The request can never run on this engine, however idle it is. A larger engine may take
    it, so a gateway treats it as "does not fit here" rather than as a bad request."""

    code: ErrorCode


class ContextLengthError(RequestTooLongError):
    code = ErrorCode.CONTEXT_LENGTH


class KVCapacityError(RequestTooLongError):
    code = ErrorCode.KV_CAPACITY


class EngineFaultCode(StrEnum):
    """How the engine failed on its own side while serving a request (never the request's fault)."""

    STEP_FAILED = "engine_step_failed"     # the step that computed the request raised
    ENGINE_DEAD = "engine_unavailable"     # the engine stopped: steps kept failing, or it shut down
    GRAMMAR_BUSY = "constraint_compiler_busy"   # other requests' constraints held this one's compile up


class EngineFault(RuntimeError):
    """The engine could not finish a request for a reason of its own. The message is safe to show
    a client (no exception text, no internals); the cause goes to the engine's log."""

    code: EngineFaultCode


class StepFailedError(EngineFault):
    """The step this request was part of raised; the request was dropped (its KV blocks freed)
    and the engine went on serving the others."""

    code = EngineFaultCode.STEP_FAILED


class EngineDeadError(EngineFault):
    """The engine stopped; no request can be served by it until its owner builds a new one."""

    code = EngineFaultCode.ENGINE_DEAD


class GrammarCompilerBusyError(EngineFault):
    """The request's constraint was still queued behind other requests' compiles when its time
    ran out. Nothing is wrong with the request or the engine: the client may retry."""

    code = EngineFaultCode.GRAMMAR_BUSY
