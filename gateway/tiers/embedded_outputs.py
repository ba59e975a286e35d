"""What an embedded tier's answer paths share: the engine's outputs of several choices merged
into one stream, the cascade's gate fed, the first token and the finished call put on the span,
engine faults turned into the gateway's errors, usage summed over choices, the response id."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from engines.async_engine import AsyncEngine
from engines.errors import EngineDeadError, GrammarCompilerBusyError, StepFailedError
from engines.sampling_params import InvalidRequestError
from gateway.context import Usage
from gateway.errors import GatewayError
from gateway.openai_format import ChoiceResult
from gateway.tiers.base import TierCall, TierFailure


async def merged_outputs(engine: AsyncEngine, jobs, scope, priority) -> AsyncIterator[tuple[int, object]]:
    """(choice index, engine output) of all jobs as they come. Closing it aborts every job."""
    if len(jobs) == 1:
        rid, ids, params, index = jobs[0]
        gen = engine.generate(rid, ids, params, scope, priority, index)
        try:
            async for out in gen:
                yield index, out
        finally:
            await gen.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(rid, ids, params, index):
        try:
            async for out in engine.generate(rid, ids, params, scope, priority, index):
                queue.put_nowait((index, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(*job)) for job in jobs]
    try:
        remaining = len(jobs)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def judge(gate, out) -> None:
    """Hand the cascade's gate this delta's token scores (it raises Escalate when unsure)."""
    if not gate.deciding:
        return
    lps = out.logprobs or ()
    gate.observe([lp.logprob for lp in lps], [lp.entropy for lp in lps], out.finished, out.prompt_hidden)


def first_token(call: TierCall) -> None:
    if call.ctx.first_token_at is None:
        call.ctx.first_token_at = time.perf_counter()
    call.span.first_token()


def finish_span(call: TierCall, results: list[ChoiceResult], usage: Usage) -> None:
    """Response attributes and usage (partial when the stream was cut short) on the tier span."""
    span = call.span
    if not span.recording:
        return
    reasons = [r.finish_reason or "error" for r in results]
    span.finish(response_id=response_id(call), response_model=call.alias, finish_reasons=reasons,
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                cache_read_tokens=usage.cached_tokens)
    span.record_output([r.text for r in results], reasons)


def tier_error(exc: BaseException) -> BaseException:
    # The engine's messages are written for clients (no exception text): the cause is in its log.
    if isinstance(exc, GrammarCompilerBusyError):
        # Other requests' load, not this tier's failure: no fallback, no breaker count.
        return GatewayError(503, str(exc), type_="server_error", code=exc.code.value, headers={"Retry-After": "1"})
    if isinstance(exc, StepFailedError):
        return TierFailure(str(exc), error=GatewayError(500, str(exc), type_="server_error", code=exc.code.value))
    if isinstance(exc, EngineDeadError):
        return TierFailure(str(exc), error=GatewayError(503, str(exc), type_="server_error", code=exc.code.value))
    if isinstance(exc, InvalidRequestError):  # refused in the engine thread (e.g. a duplicate id)
        return GatewayError(400, str(exc), param=exc.param)
    return exc


def choices_usage(results: list[ChoiceResult], n: int) -> Usage:
    # Every choice of one prompt shares that prompt: count it once per prompt.
    prompt = sum(r.prompt_tokens for r in results if r.index % n == 0)
    cached = sum(r.cached_tokens for r in results if r.index % n == 0)
    return Usage(prompt, sum(r.completion_tokens for r in results), cached)


def response_id(call: TierCall) -> str:
    prefix = "chatcmpl" if call.endpoint == "chat" else "cmpl"
    return f"{prefix}-{call.ctx.request_id}" if call.ctx.request_id else f"{prefix}-{uuid.uuid4().hex}"

