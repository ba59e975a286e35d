"""Hermes-format tool calls: parsed whole or from a stream split anywhere (the same calls, the
argument fragments concatenating to the whole text), content around them, parallel calls off,
and the fallback prompt for chat templates without tools."""

from __future__ import annotations

import json
import random

import pytest

from engines.chat_template import CHATML_TEMPLATE, ChatTemplate
from gateway.tool_calls import Arguments, CallStart, Content, ToolCallParser, parse_whole

TWO = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris }", '
       '"days": [1, {"n": "]"}]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def _stream(text: str, seed: int, parallel: bool = True):
    rng, parser, events, i = random.Random(seed), ToolCallParser(parallel), [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += parser.feed(text[i:i + n])
        i += n
    return events + parser.finish()


def test_whole_answer():
    content, calls = parse_whole(TWO)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": 'Pa"ris }', "days": [1, {"n": "]"}]}), ("get_time", {})]
    assert len({c.id for c in calls}) == 2
    _, first_only = parse_whole(TWO, parallel=False)
    assert [c.name for c in first_only] == ["get_weather"]


def test_a_stream_split_anywhere_reads_the_same():
    _, whole = parse_whole(TWO)
    for seed in range(100):
        events = _stream(TWO, seed)
        starts = [e for e in events if isinstance(e, CallStart)]
        assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
        args = ["".join(e.text for e in events if isinstance(e, Arguments) and e.index == i) for i in (0, 1)]
        assert args == [c.arguments for c in whole]
        assert "".join(e.text for e in events if isinstance(e, Content)) == "Let me check.\n"
        # The name comes before any of its arguments.
        first_args = next(k for k, e in enumerate(events) if isinstance(e, Arguments))
        assert events.index(starts[0]) < first_args


def test_odd_shapes():
    assert parse_whole("no call here, <tool_ca") == ("no call here, <tool_ca", [])
    _, calls = parse_whole('<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>')   # keys swapped
    assert (calls[0].name, json.loads(calls[0].arguments)) == ("f", {"a": 1})
    _, calls = parse_whole('<tool_call>\n{"name": "f", "arguments": 7}')                       # never closed
    assert (calls[0].name, calls[0].arguments) == ("f", "7")
    content, calls = parse_whole("<tool_call>\nnot json\n</tool_call>")
    assert calls == [] and content == "<tool_call>\nnot json\n</tool_call>"


def test_fallback_prompt_for_a_template_without_tools():
    template = ChatTemplate(CHATML_TEMPLATE)
    assert not template.supports_tools
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "time?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
                {"role": "tool", "tool_call_id": "c2", "content": "13:00"}]
    text = template.render(messages, tools=tools)
    assert text.startswith("<|im_start|>system\n# Tools") and json.dumps(tools[0]) in text
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}" in text
    assert ("<|im_start|>user\n<tool_response>\n12:00\n</tool_response>\n<tool_response>\n13:00\n"
            "</tool_response><|im_end|>") in text
    assert text.endswith("<|im_start|>assistant\n")


def test_a_bare_call_object_naming_a_tool_is_a_call():
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    names = frozenset({"get_weather"})
    content, calls = parse_whole(bare, names=names)
    assert content is None and (calls[0].name, calls[0].arguments) == ("get_weather", '{"city": "Paris"}')
    for seed in range(20):
        parser, got, i = ToolCallParser(True, names), [], 0
        rng = random.Random(seed)
        while i < len(bare):
            n = rng.randint(1, 5)
            got += parser.feed(bare[i:i + n])
            i += n
        got += parser.finish()
        assert "".join(e.text for e in got if isinstance(e, Arguments)) == '{"city": "Paris"}'
        assert not [e for e in got if isinstance(e, Content)]
    assert parse_whole('{"name": "other", "arguments": {}}', names=names) == ('{"name": "other", "arguments": {}}', [])
    assert parse_whole('{"answer": 42}', names=names) == ('{"answer": 42}', [])
    assert parse_whole(bare) == (bare, [])                      # without the request's names: content


def test_a_forced_call_cut_short_never_leaks_its_markup_as_content():
    """tool_choice required or named: a call max_tokens cut before its name is whole is dropped;
    one cut in its arguments is kept with the arguments so far (OpenAI's finish_reason length)."""
    whole = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    for cut, calls in [("<tool_call>", 0), ("<tool_", 0), ('<tool_call>\n{"name', 0),
                       (whole + '\n<tool_call>\n{"name', 1), ('<tool_call>\n{"name": "now", "arguments": {"tz": "U', 1)]:
        content, parsed = parse_whole(cut, names=frozenset({"now"}), forced=True)
        assert content is None and len(parsed) == calls, cut
        for at in range(len(cut) + 1):      # streamed, split anywhere: no content either
            parser = ToolCallParser(True, frozenset({"now"}), forced=True)
            events = parser.feed(cut[:at]) + parser.feed(cut[at:]) + parser.finish()
            assert not [e for e in events if isinstance(e, Content)] and len(parser.calls) == calls, (cut, at)
    assert parse_whole('<tool_call>\n{"name', names=frozenset({"now"}))[0] == '<tool_call>\n{"name'   # not forced


def _streamed(text: str, step: int, names=None) -> tuple[str, list[tuple[str, str]]]:
    parser, events = ToolCallParser(True, names), []
    for i in range(0, len(text), step):
        events += parser.feed(text[i:i + step])
    events += parser.finish()
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            calls[e.index] = [e.name, ""]
        elif isinstance(e, Arguments):
            calls[e.index][1] += e.text
    return "".join(e.text for e in events if isinstance(e, Content)), [tuple(c) for c in calls.values()]


def _read_alike(text: str, names=None) -> tuple[str | None, list[tuple[str, str]]]:
    """The whole answer's content and calls, after checking that a stream in deltas of 1, 2, 3
    and 5 characters gives the same (its content before the strip a whole answer gets)."""
    content, calls = parse_whole(text, names=names)
    pairs = [(c.name, c.arguments) for c in calls]
    for step in (1, 2, 3, 5):
        streamed, streamed_calls = _streamed(text, step, names)
        assert streamed_calls == pairs, step
        assert (streamed.strip() if calls else streamed) == (content or ""), step
    return content, pairs


def test_a_closing_tag_quoted_inside_an_argument_does_not_end_the_call():
    text = ('<tool_call>\n{"name": "write", "arguments": {"s": "a</tool_call>b"}}\n</tool_call>\n'
            'Written.')
    content, calls = _read_alike(text)
    assert calls == [("write", '{"s": "a</tool_call>b"}')] and content == "Written."


def test_text_after_a_bare_call_is_content_and_bare_calls_may_follow_each_other():
    names = frozenset({"f"})
    content, calls = _read_alike('{"name": "f", "arguments": {"x": "}"}} and more text', names)
    assert calls == [("f", '{"x": "}"}')] and content == "and more text"
    content, calls = _read_alike('{"name": "f", "arguments": {"s": "1"}}\n{"name": "f", "arguments": {"s": "2"}}',
                                 names)
    assert calls == [("f", '{"s": "1"}'), ("f", '{"s": "2"}')] and content is None


def test_a_json_answer_naming_a_tool_without_arguments_is_the_answer():
    text = '{"name": "f", "age": 3}'
    assert _read_alike(text, frozenset({"f"})) == (text, [])


def test_words_after_a_call_keep_their_spaces_in_a_stream():
    content, _ = _read_alike('Sure! <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call> it is done now')
    assert content == "Sure!  it is done now"


def test_a_call_nested_past_the_json_parser_depth_is_content_not_a_crash():
    deep = "[" * 3000 + "]" * 3000
    text = f'<tool_call>\n{{"arguments": {deep}, "name": "f"}}\n</tool_call>'
    content, calls = parse_whole(text)
    assert calls == [] and content == text


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "\\ud800", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"arguments": {"a": "\\udfff"}, "name": "f"}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"a": "\\ud800"}}\n</tool_call>',
])
def test_a_lone_surrogate_escape_in_model_output_never_becomes_unencodable_text(text):
    """A model can write the six characters \\ud800: they stay those characters (in arguments'
    text or in the content), never a lone surrogate that the answer could not be encoded with."""
    for parallel in (True, False):
        content, calls = parse_whole(text, parallel, frozenset({"f"}))
        for value in [content or "", *(c.name for c in calls), *(c.arguments for c in calls)]:
            value.encode("utf-8")
