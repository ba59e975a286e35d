"""The grammar that forces tool calls (`tool_choice` required or named), run token by token through
llguidance over a byte-level vocabulary: it takes the calls a model writes and lets the answer end
after the last call, also when the model closes that call's line with the newline it writes
between calls (Qwen does: a grammar needing another call after it made the model call until
max_tokens)."""

from __future__ import annotations

import pytest

from engines.grammar import GrammarCompiler
from engines.tokenizer import TextTokenizer
from gateway.tool_plan import ToolPlan

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = tmp_path_factory.mktemp("bytes")
    write_tiny_byte_checkpoint(path)
    return TextTokenizer.from_file(path / "tokenizer.json", {})


@pytest.fixture(scope="module")
def compiler(tok):
    compiler = GrammarCompiler(tok, tok.backend.get_vocab_size())
    yield compiler
    compiler.shutdown()


def _run(compiler, tok, plan: ToolPlan, text: str):
    """The grammar's state after `text`, or None when it refused one of its tokens."""
    state = compiler.new_state(plan.grammar(tok))
    for token in tok.encode(text, add_special_tokens=False):
        if not state.accept(token):
            return None
    return state


@pytest.mark.parametrize("forced", ["*", "get_weather"])
@pytest.mark.parametrize("parallel", [True, False])
def test_the_answer_may_end_after_the_last_call_and_its_newline(compiler, tok, forced, parallel):
    plan = ToolPlan([WEATHER], forced, parallel)
    for text in (CALL, CALL + "\n"):
        state = _run(compiler, tok, plan, text)
        assert state is not None and state.is_accepting, repr(text)
    assert _run(compiler, tok, plan, CALL + "\n\n") is None         # one newline, not any whitespace


def test_parallel_calls_follow_one_newline_each_and_only_when_allowed(compiler, tok):
    two = CALL + "\n" + CALL
    state = _run(compiler, tok, ToolPlan([WEATHER], "*", True), two + "\n")
    assert state is not None and state.is_accepting
    assert _run(compiler, tok, ToolPlan([WEATHER], "*", False), two) is None


def test_a_call_must_come_first_and_be_whole(compiler, tok):
    plan = ToolPlan([WEATHER], "*", True)
    assert _run(compiler, tok, plan, "Sure! " + CALL) is None
    assert not _run(compiler, tok, plan, CALL[:-3]).is_accepting
    assert _run(compiler, tok, plan, CALL.replace("get_weather", "get_time")) is None


# Parameters as pydantic writes them: definitions under their own $defs, referenced from the
# parameters' root; and a recursive one referring to its own root with "#".
LOCATED = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "$defs": {"Loc": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"}}, "required": ["loc"]}}}
TREE = {"type": "function", "function": {"name": "tree", "parameters": {
    "type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]}}}
SAME_NAME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "$defs": {"Loc": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}},
    "type": "object", "properties": {"loc": {"$ref": "#/$defs/Loc"}}, "required": ["loc"]}}}


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.mark.parametrize("forced", ["*", "get_weather"])
def test_parameters_keep_their_own_definitions_and_recursion(compiler, tok, forced):
    plan = ToolPlan([LOCATED, TREE, SAME_NAME], forced, True)
    weather = _call("get_weather", '{"loc": {"city": "Paris"}}')
    assert _run(compiler, tok, plan, weather).is_accepting
    assert _run(compiler, tok, plan, _call("get_weather", '{"loc": {"zone": "UTC"}}')) is None   # not its Loc
    if forced == "*":        # two functions defining a Loc of their own, each its own
        assert _run(compiler, tok, plan, _call("get_time", '{"loc": {"zone": "UTC"}}')).is_accepting
        assert _run(compiler, tok, plan, _call("get_time", '{"loc": {"city": "Paris"}}')) is None
        assert _run(compiler, tok, plan, _call("tree", '{"kids": [{"kids": []}, {"kids": [{"kids": []}]}]}')).is_accepting
        assert _run(compiler, tok, plan, _call("tree", '{"kids": [{"leaf": 1}]}')) is None
