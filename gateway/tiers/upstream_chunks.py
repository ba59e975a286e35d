"""The shape of one chunk of an upstream's stream, checked before it is relayed.

The gateway relays an upstream's events byte for byte, so an event it did not check reaches the
client as the upstream wrote it: a choice index the request never asked for, a tool call delta
whose index is a string, content that is a number. The official openai client builds its objects
without validating them and breaks later, in the caller's code (an IndexError, a TypeError while
joining tool call arguments). The check is the fields a client reads, no deeper: what a chunk's
choices say (index, finish reason, the delta or text), not every optional extension.
"""

from __future__ import annotations

from gateway.tiers.upstream_errors import UpstreamFailure

_TEXT = (str, type(None))
# Delta fields a client joins as text; others (vLLM's extensions) are left to the client.
_DELTA_TEXT = ("role", "content", "refusal", "reasoning_content", "reasoning")


def _bad(what: str) -> UpstreamFailure:
    return UpstreamFailure("bad_chunk", what)


def _index(value) -> bool:
    return type(value) is int and value >= 0       # bool is not an index


def check_chunk(chunk: dict, chat: bool, choices: int) -> list[tuple[int, str | None]]:
    """The chunk's choices as (index, finish_reason); UpstreamFailure("bad_chunk") when a client
    could not read it. `choices`: how many the request asked for (n, times the prompts of a
    text completion): an index past them belongs to no choice the client knows."""
    items = chunk.get("choices")
    if not isinstance(items, list):
        raise _bad(f"choices is a {type(items).__name__}")
    out = []
    for choice in items:
        if not isinstance(choice, dict):
            raise _bad(f"a choice is a {type(choice).__name__}")
        index = choice.get("index")
        if not _index(index) or index >= choices:
            raise _bad(f"choice index {index!r:.40} outside the request's {choices}")
        reason = choice.get("finish_reason")
        if not isinstance(reason, _TEXT):
            raise _bad(f"finish_reason is a {type(reason).__name__}")
        if not isinstance(choice.get("logprobs"), (dict, type(None))):
            raise _bad("logprobs is not an object")
        if chat:
            _check_delta(choice.get("delta"))
        elif not isinstance(choice.get("text"), str):
            raise _bad("a completion choice without text")
        out.append((index, reason))
    return out


def _check_delta(delta) -> None:
    if not isinstance(delta, dict):
        raise _bad(f"delta is a {type(delta).__name__}")
    for name in _DELTA_TEXT:
        if not isinstance(delta.get(name), _TEXT):
            raise _bad(f"delta {name} is not text")
    calls = delta.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise _bad("tool_calls is not a list")
        for call in calls:
            # A client joins deltas by their index and concatenates the arguments' pieces.
            if not isinstance(call, dict) or not _index(call.get("index")):
                raise _bad("a tool call delta without an index")
            if not isinstance(call.get("id"), _TEXT) or not isinstance(call.get("type"), _TEXT):
                raise _bad("a tool call delta's id or type is not text")
            _check_function(call.get("function"))
    _check_function(delta.get("function_call"))


def _check_function(function) -> None:
    if function is None:
        return
    if not isinstance(function, dict) or not isinstance(function.get("name"), _TEXT) \
            or not isinstance(function.get("arguments"), _TEXT):
        raise _bad("a function delta whose name or arguments are not text")
