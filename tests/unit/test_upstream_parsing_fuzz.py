"""Byte-level fuzzing of how the gateway reads upstream answers: the event-stream splitter and
reader, the whole-answer reader (JSON shape, usage, logprobs, span facts) and the HTTP/1.1
response parser. Whatever the bytes, the only exception allowed out is the tier-failure type:
anything else would end the request with a 500 and count nothing against the tier."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from gateway.tiers.base import TierFailure
from gateway.tiers.http_conn import HTTPConnection
from gateway.tiers.upstream_answers import AnswerFacts, answer_logprobs, read_answer, read_usage, strip_logprobs
from gateway.tiers.upstream_errors import UpstreamFailure
from gateway.tiers.upstream_stream import EventSplitter, StreamReader

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_TOKENS = [b"data: ", b"data:", b"event: x", b"id: 1", b"retry: 5", b": ping", b"\n", b"\r\n", b"\r", b"\n\n",
           b"\r\n\r\n", b"{", b"}", b"[", b"]", b'"usage"', b'"error"', b'"choices"', b"[DONE]", b"null",
           b'"finish_reason": "stop"', b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}}',
           b'{"choices": [], "usage": null}', b'{"choices": [{"index": 0, "delta": {"content": "x"}}]}',
           b'{"error": {"message": "boom"}}', b"\xff\xfe", b"NaN", b"1e999", b"-1", b'"', b":", b","]
_KEYS = ["usage", "choices", "prompt_tokens", "completion_tokens", "prompt_tokens_details", "cached_tokens",
         "logprobs", "content", "token_logprobs", "logprob", "index", "finish_reason", "delta", "message",
         "text", "id", "model", "error", "object"]

sse_bytes = st.lists(st.one_of(st.sampled_from(_TOKENS), st.binary(max_size=24)), max_size=40).map(b"".join)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=4),
                                                                inner, max_size=5),
    max_leaves=30)


class _Span:
    recording = True

    def finish(self, **_) -> None:
        pass

    def record_output(self, *_) -> None:
        pass


def _pieces(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    out, last = [], 0
    for p in points + [len(raw)]:
        out.append(raw[last:p])
        last = p
    return out


def _read_stream(pieces: list[bytes], keep_text: bool, chat: bool = True, limit: int = 1 << 16) -> list:
    facts = AnswerFacts(keep_text)
    reader = StreamReader(limit, facts, chat=chat, choices=2, n=2)
    events = []
    try:
        for piece in pieces:
            events.extend(reader.feed(piece))
        events.extend(reader.end())
    except UpstreamFailure:
        pass
    usage = reader.usage.total
    assert usage is None or min(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) >= 0
    facts.finish(_Span())
    return events


def _read_whole(raw: bytes) -> None:
    """What UpstreamTier.complete does with an answer's bytes."""
    try:
        data = read_answer(raw)
        usage = read_usage(data.get("usage"))
    except UpstreamFailure:
        return
    facts = AnswerFacts(True)
    facts.read(data)
    facts.usage = usage
    facts.finish(_Span())
    answer_logprobs(data)
    strip_logprobs(data)
    to_json(data)


@FUZZ
@given(raw=sse_bytes, cuts=st.lists(st.integers(min_value=0), max_size=6), keep_text=st.booleans(),
       chat=st.booleans())
def test_any_stream_bytes_give_events_or_a_tier_failure(raw, cuts, keep_text, chat):
    for event, usage_only in _read_stream(_pieces(raw, cuts), keep_text, chat):
        assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
        assert isinstance(usage_only, bool)


@FUZZ
@given(value=json_values, keep_text=st.booleans(), chat=st.booleans())
def test_any_json_event_gives_events_or_a_tier_failure(value, keep_text, chat):
    raw = json.dumps(value).encode()
    _read_stream([b"data: " + raw + b"\n\n", b"data: " + raw + b"\n\ndata: [DONE]\n\n"], keep_text, chat)
    if isinstance(value, dict):      # as a choice of a chunk, where the shape checks look
        chunk = json.dumps({"choices": [{**value, "index": 0}], "usage": value.get("usage")}).encode()
        for event, _ in _read_stream([b"data: " + chunk + b"\n\n"], keep_text, chat):
            json.loads(event[6:])


@FUZZ
@given(raw=st.one_of(st.binary(max_size=200), sse_bytes))
def test_any_answer_bytes_give_an_answer_or_a_tier_failure(raw):
    _read_whole(raw)


@FUZZ
@given(value=json_values)
def test_any_json_answer_gives_an_answer_or_a_tier_failure(value):
    _read_whole(json.dumps(value).encode())
    if isinstance(value, dict):
        _read_whole(json.dumps({**value, "choices": [value], "usage": value.get("usage")}).encode())


@FUZZ
@given(raw=sse_bytes, cuts=st.lists(st.integers(min_value=0), max_size=6))
def test_line_ends_do_not_change_the_events(raw, cuts):
    """CRLF, CR and LF line ends give the same events, however the bytes are cut."""
    lf = raw.replace(b"\r", b"")
    expected = _read_stream([lf], False)
    assert _read_stream(_pieces(lf.replace(b"\n", b"\r\n"), cuts), False) == expected
    assert _read_stream(_pieces(lf.replace(b"\n", b"\r"), cuts), False) == expected


class _Transport:
    def __init__(self):
        self.closed = self.paused = False

    def write(self, _): pass
    def close(self): self.closed = True
    def pause_reading(self): self.paused = True
    def resume_reading(self): self.paused = False
    def get_extra_info(self, _): return None


_HEADS = [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
          b"HTTP/1.0 200 OK\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n", b""]


@FUZZ
@given(head=st.sampled_from(_HEADS), raw=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=6))
def test_any_response_bytes_leave_the_http_parser_consistent(head, raw, cuts):
    """data_received never raises: bad bytes become the connection's ProtocolError."""
    conn = HTTPConnection()
    conn.connection_made(_Transport())
    conn.send(b"POST / HTTP/1.1\r\n\r\n")
    for piece in _pieces(head + raw, cuts):
        conn.data_received(piece)
    conn.eof_received()
    conn.connection_lost(None)
    assert all(isinstance(c, bytes) for c in conn.chunks)


def test_tier_failure_is_what_callers_catch():
    assert issubclass(UpstreamFailure, TierFailure)


def test_an_event_past_the_limit_is_a_failure_not_a_buffer():
    splitter = EventSplitter(1024)
    splitter.feed(b"data: " + b"x" * 1000)
    try:
        splitter.feed(b"x" * 100)
    except UpstreamFailure as exc:
        assert exc.code == "event_too_large"
    else:
        raise AssertionError("an unbounded event was buffered")


def test_deep_nesting_and_bad_counts_are_failures():
    for raw, code in ((b"[" * 100_000, "invalid_json"), (b"[1]", "not_an_object"), (b'{"choices": 3}', "bad_choices"),
                      (b'{"choices": [], "usage": {"prompt_tokens": "12"}}', "bad_usage"),
                      (b'{"choices": [], "usage": {"prompt_tokens": true}}', "bad_usage"),
                      (b'{"choices": [], "usage": {"completion_tokens": -3}}', "bad_usage"),
                      (b'{"choices": [], "usage": {"prompt_tokens_details": []}}', "bad_usage")):
        try:
            read_answer(raw) and read_usage(json.loads(raw).get("usage"))
        except UpstreamFailure as exc:
            assert exc.code == code, (raw[:40], exc.code)
        else:
            raise AssertionError(f"{raw[:40]!r} was accepted")


def test_crlf_stream_is_read_event_by_event_with_its_usage():
    events = [b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}',
              b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}', b"data: [DONE]"]
    raw = b"".join(e + b"\r\n\r\n" for e in events)
    reader = StreamReader(1 << 16, AnswerFacts(False), chat=True, choices=1)
    out = [e for i in range(0, len(raw), 7) for e in reader.feed(raw[i:i + 7])] + reader.end()
    assert [e for e, _ in out] == [e + b"\n\n" for e in events]
    assert reader.usage.total.prompt_tokens == 3 and out[1][1] is True


def test_an_error_event_and_non_sse_text_are_failures():
    for raw, code in ((b'data: {"error": {"message": "at http://10.0.0.1"}}\n\n', "stream_error"),
                      (b"<html>bad gateway</html>\n\n", "bad_event"), (b"data: [1, 2]\n\n", "bad_event")):
        reader = StreamReader(1 << 16, AnswerFacts(False), chat=True, choices=1)
        try:
            reader.feed(raw)
        except UpstreamFailure as exc:
            assert exc.code == code and "10.0.0.1" not in str(exc)
        else:
            raise AssertionError(f"{raw!r} was relayed")
