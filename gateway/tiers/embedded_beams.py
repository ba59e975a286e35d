"""Beam search on an embedded tier (the search itself: gateway/tiers/beam_search.py): the
answer comes whole, as one body or, streamed, as each beam's text in one chunk."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from gateway.context import Usage
from gateway.openai_format import SSE_DONE, ChoiceResult, ChunkWriter, chat_body, completion_body, json_bytes
from gateway.schema import ChatCompletionRequest
from gateway.tiers.base import TierCall
from gateway.tiers.beam_search import beam_choices
from gateway.tiers.embedded_outputs import finish_span, first_token, response_id, tier_error


async def beam_results(engine, call: TierCall, prompts: list[list[int]], scope: str | None,
                       priority: int) -> tuple[list[ChoiceResult], Usage]:
    spent = Usage()
    try:
        results = await beam_choices(engine, engine.front, call.body, f"{call.ctx.request_id}",
                                     prompts, scope, priority, spent)
    except BaseException as exc:
        call.ctx.usage.add(spent)      # what the engine generated before the failure is charged
        if isinstance(exc, BaseExceptionGroup):
            raise tier_error(exc.exceptions[0]) from None
        raise
    first_token(call)
    finish_span(call, results, spent)
    return results, spent


def beam_body(call: TierCall, results: list[ChoiceResult], usage: Usage) -> bytes:
    build = chat_body if isinstance(call.body, ChatCompletionRequest) else completion_body
    return json_bytes(build(response_id(call), int(time.time()), call.alias, results, usage.as_openai(), None))


async def beam_chunks(call: TierCall, results: list[ChoiceResult], usage: Usage) -> AsyncIterator[bytes]:
    body = call.body
    chat = isinstance(body, ChatCompletionRequest)
    writer = ChunkWriter(chat, response_id(call), int(time.time()), call.alias, body.include_usage, None,
                         (lambda i: usage.as_openai()) if body.continuous_usage else None)    # the search's
    for slot in results:
        if chat:
            yield writer.role(slot.index)
        yield writer.delta(slot.index, slot.text, None, slot.finish_reason)
    if body.include_usage:
        yield writer.usage(usage.as_openai())
    yield SSE_DONE
