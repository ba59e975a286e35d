"""Reading an upstream's event stream: its events out of arbitrary byte pieces, each checked
before it is relayed, its usage, and whether it ended as a whole answer.

An upstream is another program on the network, so its events are input like a client's. Every
relayed event is parsed (UTF-8, JSON without NaN, an object) and its shape checked
(upstream_chunks.py): a relayed event the client cannot read breaks the client, the official
openai one included, and not the gateway. That is a json parse per event, a few microseconds,
within the ~1 ms per request overhead budget. A bad event is the tier's failure (UpstreamFailure):
before the first byte went out the chain falls back, after it the stream ends with an error event.

A stream is whole once the upstream sent `data: [DONE]`; a body that ended without it is
truncated (a dropped connection that looked like a clean close, a proxy's cut) unless every
choice had its finish_reason: that answer is complete, only its closing usage chunk may be
missing (charged as any stream without usage is), so it is accepted and given the [DONE] its
client waits for. Anything after [DONE] is not relayed.

Usage that is not a count (negative, not an integer, past MAX_REPORTED_TOKENS) is ignored, not a
failure: it would turn an answer the client already has into an error. The attempt then charges
what it charges a stream without usage.
"""

from __future__ import annotations

import json

from gateway.tiers.upstream_answers import AnswerFacts, ascii_json, hide_cached_tokens, read_usage
from gateway.tiers.upstream_chunks import check_chunk
from gateway.tiers.upstream_errors import UpstreamFailure
from gateway.tiers.upstream_stream_usage import StreamUsage

_FIELDS = (b"data", b"event", b"id", b"retry")
_DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")       # NaN, Infinity: Python's json reads them, clients may not


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _excerpt(raw: bytes) -> str:
    return repr(raw[:200])


class EventSplitter:
    """Server-sent events out of arbitrary byte pieces. Lines may end in LF, CRLF or CR (the SSE
    grammar allows all three); events come out LF-only, without their blank line. An event
    growing past `limit` bytes is a failure: a stream that never ends an event would otherwise
    be buffered without bound."""

    __slots__ = ("_buf", "_cr", "limit")

    def __init__(self, limit: int):
        self.limit = limit
        self._buf = bytearray()
        self._cr = False     # the last piece ended in CR, already read as a line end: a LF next completes it

    def feed(self, data: bytes) -> list[bytes]:
        if not data:
            return []
        if self._cr and data[:1] == b"\n":
            data = data[1:]
        self._cr = data.endswith(b"\r")
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        start = max(0, len(buf) - 1)     # what was buffered holds no blank line: search only the seam on
        buf += data
        events, taken = [], 0
        while (end := buf.find(b"\n\n", start)) >= 0:
            events.append(bytes(buf[taken:end]))
            taken = start = end + 2
        if taken:
            del buf[:taken]
        if len(buf) > self.limit or any(len(e) > self.limit for e in events):
            raise UpstreamFailure("event_too_large", f"an event of more than {self.limit} bytes")
        return events

    def end(self) -> list[bytes]:
        """The last event, if the stream ended without its blank line."""
        tail = bytes(self._buf)
        self._buf.clear()
        return [tail] if tail.strip() else []


def event_data(event: bytes) -> bytes | None:
    """The event's data (its data lines joined), None for an event without any (a comment, a
    retry hint). Text that is not SSE field syntax is a failure."""
    if b"\n" not in event:
        if event.startswith(b"data:"):
            value = event[5:]
            return value[1:] if value[:1] == b" " else value
        lines = [event]
    else:
        lines = event.split(b"\n")
    parts = []
    for line in lines:
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if name not in _FIELDS:
            raise UpstreamFailure("bad_event", f"not an SSE line: {_excerpt(line)}")
        if name == b"data":
            parts.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(parts) if parts else None


def _parse(data: bytes) -> dict:
    try:
        chunk = _DECODER.decode(data.decode("utf-8"))
    except (ValueError, RecursionError):    # UnicodeDecodeError is a ValueError; RecursionError: deep nesting
        raise UpstreamFailure("bad_event", f"event data is not JSON: {_excerpt(data)}") from None
    if not isinstance(chunk, dict):
        raise UpstreamFailure("bad_event", f"event data is not a JSON object: {_excerpt(data)}")
    return chunk


class StreamReader:
    """One upstream event stream: `feed` bytes as they arrive, `end` once the body ended. Each
    returns the events to relay as (bytes ready to send, whether it is the usage-only chunk
    (choices == [])); `usage` holds what the stream reported. Facts for the span are noted on
    `facts`. `chat`: chat chunks (a delta) or text completion ones (text); `choices`: how many the
    request asked for, `n` of them per prompt. `hide_cached`: events reporting cached tokens are
    relayed with the count zeroed (`usage` keeps it). `ignored_usage`: why a usage was ignored,
    for the operator's log."""

    __slots__ = ("_finished", "_splitter", "chat", "choices", "done", "facts", "hide_cached", "ignored_usage",
                 "usage")

    def __init__(self, limit: int, facts: AnswerFacts, *, chat: bool, choices: int, n: int = 1,
                 hide_cached: bool = False):
        self._splitter = EventSplitter(limit)
        self.facts = facts
        self.chat = chat
        self.choices = choices
        self.hide_cached = hide_cached
        self.usage = StreamUsage(n)
        self.done = False                  # data: [DONE] came: the rest is not relayed
        self._finished: set[int] = set()   # choices that had their finish_reason
        self.ignored_usage: str | None = None

    def feed(self, data: bytes) -> list[tuple[bytes, bool]]:
        return self._read(self._splitter.feed(data))

    def end(self) -> list[tuple[bytes, bool]]:
        """The last events, with a [DONE] when the upstream finished every choice but sent none;
        UpstreamFailure("truncated_stream") when it finished neither."""
        out = self._read(self._splitter.end())
        if self.done:
            return out
        if len(self._finished) < self.choices:
            raise UpstreamFailure("truncated_stream", f"the stream ended without [DONE], {len(self._finished)} of "
                                                      f"{self.choices} choices finished")
        self.done = True
        return out + [(DONE_EVENT, False)]

    def _read(self, events: list[bytes]) -> list[tuple[bytes, bool]]:
        out = []
        for event in events:
            if self.done:
                break
            event = event.strip(b"\n")
            if not event.strip():
                continue
            data = event_data(event)
            if data is None:
                continue            # comments and retry hints are the upstream's, not the client's
            if data.strip() == _DONE:
                self.done = True
                out.append((DONE_EVENT, False))
                continue
            relayed = self._inspect(data, event)
            if relayed is not None:
                out.append(relayed)
        return out

    def _inspect(self, data: bytes, event: bytes) -> tuple[bytes, bool] | None:
        """The event to relay for one chunk, None to relay nothing."""
        chunk = _parse(data)
        if "error" in chunk and "choices" not in chunk:
            raise UpstreamFailure("stream_error", f"the upstream sent an error event: {_excerpt(data)}")
        choices = check_chunk(chunk, self.chat, self.choices)
        for index, reason in choices:
            if reason is not None:
                self._finished.add(index)
        self.facts.read(chunk)
        # Relayed as it came when it is one data line; anything else (several data lines, id or
        # event fields, which the openai client reads as other kinds of event) is written anew.
        rewrite = b"\n" in event or not event.startswith(b"data:")
        usage_only = False
        if chunk.get("usage") is not None:
            try:
                usage = read_usage(chunk["usage"])
            except UpstreamFailure as exc:
                self.ignored_usage = exc.detail
                if not choices:
                    return None       # the closing usage chunk, with nothing a client can use
                chunk["usage"] = None
                rewrite = True
            else:
                usage_only = not choices
                self.usage.report(usage, [index for index, _ in choices])
                self.facts.usage = self.usage.total
                if self.hide_cached and hide_cached_tokens(chunk):
                    rewrite = True
        if rewrite:
            return b"data: " + ascii_json(chunk) + b"\n\n", usage_only
        return event + b"\n\n", usage_only
