"""An embedded tier's answers to one call, whole or streamed: every choice run on the engine,
the cascade's gate fed as tokens come, tool calls parsed out, an echoed prompt put first, usage
summed and charged (also for an answer that ends unfinished).

`EngineCall` holds what the tier hands over when the call starts: its engine at that moment (a
restart may replace the tier's engine meanwhile; this call keeps the one it began on), the
model's tokenizer pieces and the call's jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engines.async_engine import AsyncEngine
from engines.engine_process import ProcessEngine
from engines.errors import EngineFault
from engines.loaded_model import LoadedModel
from engines.request_output import RequestOutput
from engines.sampling_params import InvalidRequestError, SamplingParams
from gateway.context import Usage
from gateway.openai_format import (
    SSE_DONE,
    ChoiceResult,
    ChunkWriter,
    TokenIdPieces,
    TokenPieces,
    chat_body,
    completion_body,
    json_bytes,
)
from gateway.schema import ChatCompletionRequest
from gateway.tiers.base import TierAnswer, TierCall
from gateway.tiers.embedded_jobs import Job
from gateway.tiers.embedded_outputs import (
    choices_usage,
    finish_span,
    first_token,
    judge,
    merged_outputs,
    response_id,
    tier_error,
)
from gateway.tiers.embedded_tools import ToolChunks, apply_tool_calls
from gateway.tiers.engine_events import EngineEvents
from gateway.tiers.prompt_echo import PromptEcho
from gateway.tool_plan import tool_plan


@dataclass(frozen=True)
class EngineCall:
    engine: AsyncEngine | ProcessEngine
    loaded: LoadedModel
    pieces: TokenPieces                             # the answer's text pieces
    logprob_pieces: TokenPieces | TokenIdPieces     # how its logprobs name tokens
    jobs: list[Job]                                 # (choice index, prompt ids, sampling) per choice
    prompt_ids: list[list[int]]                     # the prompts as rendered, before truncation
    scope: str | None                               # the engine request's prefix scope
    priority: int                                   # and its priority, in the engine's order


async def complete_answer(call: TierCall, ec: EngineCall) -> TierAnswer:
    jobs, engine = ec.jobs, ec.engine
    rid = call.ctx.request_id
    results = [ChoiceResult(index) for index, _, _ in jobs]
    waiting_first = True
    gate = call.scoring
    prompt = PromptEcho.of(ec.loaded, call.body, ec.prompt_ids, [ids for _, ids, _ in jobs[::call.body.n]])

    async def run(slot: ChoiceResult, ids: list[int], params: SamplingParams) -> None:
        nonlocal waiting_first
        call.span.queued(queue_depth=engine.stats.queue_depth)
        events = EngineEvents(call.span)
        # Closed on the way out, also when the cascade's gate ends the call: the engine
        # request is aborted then, not when the generator is collected.
        async with contextlib.aclosing(engine.generate(f"{rid}-{slot.index}", ids, params, ec.scope,
                                                       ec.priority, slot.index)) as outputs:
            async for out in outputs:
                events.observe(out)
                if waiting_first:
                    waiting_first = False
                    first_token(call)
                slot.text += out.text
                prompt.observe(slot.index, out.prompt_logprobs)
                if out.logprobs:
                    slot.logprobs.extend(out.logprobs)
                slot.prompt_tokens, slot.completion_tokens = out.prompt_tokens, out.completion_tokens
                slot.cached_tokens = out.cached_tokens
                if out.finished:
                    slot.finish_reason, slot.stop_reason = out.finish_reason, out.stop_reason
                    if out.constraint_error is not None:    # what was generated is not a whole answer
                        raise out.constraint_error
                if gate is not None:
                    judge(gate, out)

    try:
        async with asyncio.TaskGroup() as group:  # one failure cancels (and aborts) the others
            for slot, (_, ids, params) in zip(results, jobs):
                group.create_task(run(slot, ids, params))
    except BaseException as exc:
        # Unfinished (a failure, the client gone, the deadline): what the engine generated is charged.
        call.ctx.usage.add(choices_usage(results, call.body.n))
        if isinstance(exc, BaseExceptionGroup):
            raise tier_error(exc.exceptions[0]) from None
        raise
    chat = isinstance(call.body, ChatCompletionRequest)
    if not chat and call.body.echo_only:
        for slot in results:
            _generated_nothing(slot)
    usage = choices_usage(results, call.body.n)
    finish_span(call, results, usage)
    plan = tool_plan(call.body) if chat else None
    if plan is not None:
        apply_tool_calls(results, plan)
    client_lp = call.body.logprobs if chat else call.body.logprobs is not None
    build = chat_body if chat else completion_body
    rid, created = response_id(call), int(time.time())

    def answer() -> bytes:
        for slot in results:
            slot.text = prompt.text(slot.index) + slot.text
            slot.logprobs = prompt.echoed_logprobs(slot.index) + slot.logprobs
            slot.prompt_logprobs = prompt.vllm(slot.index, ec.pieces)
        return json_bytes(build(rid, created, call.alias, results, usage.as_openai(),
                                ec.logprob_pieces if client_lp else None))

    # A prompt's scores can make a body of megabytes: built off the event loop then.
    return TierAnswer(await asyncio.to_thread(answer) if prompt.scored else answer(), usage)


async def stream_answer(call: TierCall, ec: EngineCall) -> AsyncIterator[bytes]:
    jobs, engine, body = ec.jobs, ec.engine, call.body
    chat = isinstance(body, ChatCompletionRequest)
    client_lp = body.logprobs if chat else body.logprobs is not None
    results = {i: ChoiceResult(i) for i, _, _ in jobs}
    prompt_len = {i: len(ids) for i, ids, _ in jobs}

    def usage_of(i: int) -> dict:     # vLLM's numbers: the choice's own prompt and its tokens so far
        return Usage(prompt_len[i], results[i].completion_tokens).as_openai()

    writer = ChunkWriter(chat, response_id(call), int(time.time()), call.alias, body.include_usage,
                         ec.logprob_pieces if client_lp else None,
                         usage_of if body.continuous_usage else None)
    rid = call.ctx.request_id
    for _ in jobs:   # submitted together when the stream is first read
        call.span.queued(queue_depth=engine.stats.queue_depth)
    outputs = merged_outputs(engine, [(f"{rid}-{i}", ids, p, i) for i, ids, p in jobs], ec.scope, ec.priority)
    prompt = PromptEcho.of(ec.loaded, body, ec.prompt_ids, [ids for _, ids, _ in jobs[::body.n]])
    held: dict[int, list] = {}      # a choice's outputs waiting for its prompt's scores
    first_seen = False
    started = set()
    keep_text = call.span.content_allowed   # texts are kept only for an opted-in span
    events = {i: EngineEvents(call.span) for i in results}
    gate = call.scoring
    plan = tool_plan(body) if chat else None
    tools = {i: ToolChunks(writer, i, plan) for i in results} if plan is not None else None
    echo_only = not chat and body.echo_only
    try:
        async for index, out in outputs:
            events[index].observe(out)
            slot = results[index]
            if echo_only:
                out = _nothing_generated(out)
            slot.prompt_tokens, slot.completion_tokens = out.prompt_tokens, out.completion_tokens
            slot.cached_tokens = out.cached_tokens
            if out.finished:
                slot.finish_reason, slot.stop_reason = out.finish_reason, out.stop_reason
                if out.constraint_error is not None:
                    raise out.constraint_error
            if keep_text:
                slot.text += out.text
            if gate is not None:
                judge(gate, out)    # counted, but before its chunk is made: it may end the call
            if not first_seen:
                first_seen = True
                first_token(call)
            prompt.observe(index, out.prompt_logprobs)
            if not prompt.ready(index):
                held.setdefault(index, []).append(out)
                continue
            ready = [(index, out)]
            if out.prompt_logprobs:         # the prompt's first choice: its siblings may go on
                group = index - index % body.n
                ready += [(i, o) for i in range(group + 1, group + body.n) for o in held.pop(i, [])]
            for i, o in ready:
                text, lps = o.text, o.logprobs
                if i not in started:
                    started.add(i)
                    if chat:
                        yield writer.role(i)
                    # an echoed prompt leads the choice's first chunk
                    text = prompt.text(i) + text
                    lps = prompt.echoed_logprobs(i) + (lps or []) or None
                if tools is not None:
                    for chunk in tools[i].chunks(o, client_lp):
                        yield chunk
                elif text or o.finished or (client_lp and lps):
                    yield writer.delta(i, text, lps, o.finish_reason if o.finished else None, o.stop_reason)
    except (EngineFault, InvalidRequestError) as exc:
        raise tier_error(exc) from None
    finally:
        await outputs.aclose()
        usage = choices_usage(list(results.values()), body.n)
        call.ctx.usage.add(usage)
        finish_span(call, list(results.values()), usage)
    if body.include_usage:
        yield writer.usage(usage.as_openai())
    yield SSE_DONE


def _generated_nothing(slot: ChoiceResult) -> None:
    """An echo without generation: the one token the engine made on the way leaves the answer."""
    slot.text, slot.logprobs, slot.completion_tokens, slot.finish_reason = "", [], 0, "length"


def _nothing_generated(out: RequestOutput) -> RequestOutput:
    """The same for a stream's output: its prompt scores stay, its token goes."""
    return dataclasses.replace(out, text="", logprobs=[] if out.logprobs is not None else None,
                               completion_tokens=0, finish_reason="length" if out.finished else out.finish_reason)
