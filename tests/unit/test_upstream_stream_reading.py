"""How an upstream's event stream is read before it is relayed: usage reports are cumulative (the
last one is the total, per choice until the closing chunk, a prompt counted once for its n
choices), a body that ends before [DONE] and before every choice finished is a failure, every
relayed event is one a client can read (UTF-8 JSON, choices in the request's range, tool call
deltas of the right shape), and usage that is not a count is ignored."""

from __future__ import annotations

import json

import pytest

from gateway.context import Usage
from gateway.tiers.upstream_answers import AnswerFacts
from gateway.tiers.upstream_errors import UpstreamFailure
from gateway.tiers.upstream_stream import DONE_EVENT, StreamReader
from gateway.tiers.upstream_stream_usage import StreamUsage


def _chunk(index: int | None = 0, content: str | None = "x", finish: str | None = None, usage: dict | None = None,
           chat: bool = True) -> bytes:
    choice = {"index": index, "finish_reason": finish}
    choice.update({"delta": {"content": content}} if chat else {"text": content or ""})
    body = {"id": "c", "choices": [] if index is None else [choice]}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _reader(choices: int = 1, n: int = 1, chat: bool = True) -> StreamReader:
    return StreamReader(1 << 16, AnswerFacts(False), chat=chat, choices=choices, n=n)


def _read(reader: StreamReader, *events: bytes) -> list[tuple[bytes, bool]]:
    return reader.feed(b"".join(events)) + reader.end()


# ---- usage -----------------------------------------------------------------------------------
def test_usage_in_every_chunk_counts_as_its_last_report():
    reader = _reader()
    _read(reader, *[_chunk(usage=_usage(10, i + 1)) for i in range(10)],
          _chunk(content=None, finish="stop", usage=_usage(10, 10)), _chunk(None, usage=_usage(10, 10)), DONE_EVENT)
    assert reader.usage.total == Usage(10, 10)


def test_usage_on_the_last_content_chunk_and_the_closing_chunk_counts_once():
    reader = _reader()
    _read(reader, _chunk(), _chunk(content=None, finish="stop", usage=_usage(10, 5)),
          _chunk(None, usage=_usage(10, 5)), DONE_EVENT)
    assert reader.usage.total == Usage(10, 5)


def test_running_usage_of_several_choices_counts_each_prompt_once_and_every_choice():
    usage = StreamUsage(n=2)
    for done in (1, 2, 3):             # two prompts (text completion), two choices each
        for index in range(4):
            usage.report(Usage(7 + index // 2, done + index), [index])
    assert usage.total == Usage(7 + 8, 3 + 4 + 5 + 6)
    usage.report(Usage(15, 20), [])     # the closing chunk is the whole request's
    assert usage.total == Usage(15, 20)


def test_the_request_usage_follows_the_stream_total_without_summing_reports():
    request = Usage(3, 4)              # an earlier attempt's
    usage = StreamUsage(n=1)
    for done in (1, 2, 5):
        usage.report(Usage(10, done), [0])
        usage.settle_into(request)
    usage.report(Usage(10, 5, 2), [])
    usage.settle_into(request)
    usage.settle_into(request)
    assert request == Usage(13, 9, 2)


@pytest.mark.parametrize("bad", [-5, 1.5, 1e18, 1 << 31, "12", True])
def test_a_closing_chunk_whose_count_is_not_a_count_is_ignored_not_a_failure(bad):
    reader = _reader()
    events = _read(reader, _chunk(), _chunk(content=None, finish="stop"),
                   _chunk(None, usage={"prompt_tokens": 10, "completion_tokens": bad}), DONE_EVENT)
    assert [e for e, _ in events][-1] == DONE_EVENT and len(events) == 3     # the usage chunk is not relayed
    assert reader.usage.total is None and reader.ignored_usage      # charged as a stream without usage


def test_a_bad_count_on_a_content_chunk_is_relayed_without_it_and_a_good_report_stays():
    reader = _reader()
    events = _read(reader, _chunk(usage=_usage(10, 1)), _chunk(finish="stop", usage=_usage(10, -2)), DONE_EVENT)
    assert json.loads(events[1][0][6:])["usage"] is None
    assert reader.usage.total == Usage(10, 1)


# ---- a whole stream --------------------------------------------------------------------------
def test_a_body_that_ends_before_done_and_before_every_finish_is_a_failure():
    for events in ((_chunk(), _chunk()), (), (_chunk(0, finish="stop"),)):
        reader = _reader(choices=2, n=2)
        reader.feed(b"".join(events))
        with pytest.raises(UpstreamFailure) as caught:
            reader.end()
        assert caught.value.code == "truncated_stream"


def test_a_body_that_finished_every_choice_without_done_gets_one():
    reader = _reader(choices=2, n=2)
    events = _read(reader, _chunk(0), _chunk(1), _chunk(1, finish="length"), _chunk(0, finish="stop"))
    assert events[-1] == (DONE_EVENT, False) and len(events) == 5


def test_nothing_after_done_is_relayed():
    reader = _reader()
    events = _read(reader, _chunk(), DONE_EVENT, b"data: {not json\n\n", _chunk(5))
    assert [e for e, _ in events] == [_chunk(), DONE_EVENT]


def test_an_event_of_several_lines_or_fields_is_relayed_as_one_data_line():
    reader = _reader()
    events = _read(reader, b'event: thread.message\nid: 7\ndata: {"choices": [{"index": 0,\ndata: '
                           b'"delta": {"content": "x"}, "finish_reason": "stop"}]}\n\n', DONE_EVENT)
    assert events[0][0].startswith(b"data: {") and events[0][0].count(b"\n") == 2
    assert json.loads(events[0][0][6:])["choices"][0]["delta"] == {"content": "x"}


# ---- malformed events ------------------------------------------------------------------------
_TOOL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize("event,code", [
    (b"data: {not json\n\n", "bad_event"),
    (b'data: {"choices": [{"index": 0, "delta": {"content": "\xff\xfe"}}]}\n\n', "bad_event"),
    (b'data: {"choices": [{"index": 0, "delta": {"content": NaN}}]}\n\n', "bad_event"),
    (b"data: [1]\n\n", "bad_event"),
    (_chunk(1), "bad_chunk"), (_chunk(-1), "bad_chunk"), (_chunk(True), "bad_chunk"),
    (b'data: {"id": "c"}\n\n', "bad_chunk"),
    (b'data: {"choices": [{"index": 0, "delta": "x"}]}\n\n', "bad_chunk"),
    (b'data: {"choices": [{"index": 0, "delta": {"content": 5}}]}\n\n', "bad_chunk"),
    (b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": 1}]}\n\n', "bad_chunk"),
    *[(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]}).encode() + b"\n\n",
       "bad_chunk") for calls in ({"index": 0}, [{"index": "zero", "function": {"arguments": 5}}],
                                  [{**_TOOL, "index": None}], [{**_TOOL, "function": {"arguments": 5}}],
                                  [{**_TOOL, "function": "f"}], [{**_TOOL, "id": 3}])],
])
def test_an_event_a_client_cannot_read_is_a_failure(event, code):
    reader = _reader()
    reader.feed(_chunk())
    with pytest.raises(UpstreamFailure) as caught:
        reader.feed(event)
    assert caught.value.code == code


def test_good_tool_call_deltas_and_choices_in_range_are_relayed_as_sent():
    tool = b"data: " + json.dumps({"choices": [{"index": 1, "delta": {"tool_calls": [_TOOL]}}]}).encode() + b"\n\n"
    reader = _reader(choices=2, n=2)
    assert [e for e, _ in reader.feed(tool + _chunk(0))] == [tool, _chunk(0)]


def test_a_text_completion_choice_index_counts_prompts_times_n():
    reader = _reader(choices=4, n=2, chat=False)
    reader.feed(_chunk(3, chat=False))
    with pytest.raises(UpstreamFailure):
        reader.feed(_chunk(4, chat=False))
    with pytest.raises(UpstreamFailure):
        _reader(chat=False).feed(b'data: {"choices": [{"index": 0, "text": null}]}\n\n')
