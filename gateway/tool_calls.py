"""Tool calls out of a model's text, in the Hermes format (`<tool_call>\\n{"name": ..., "arguments":
...}\\n</tool_call>`, what Qwen's template asks for and engines/tool_prompt.py teaches the others).

One incremental parser serves both answers: a stream feeds it each delta as it comes and turns
its events into OpenAI's chunks (the call's index, id and name once, then argument fragments);
a whole answer feeds it everything at once. So a streamed answer and a whole one read the same.

Arguments are the model's own JSON text of the `arguments` value, cut out with a small scanner
(strings, escapes and bracket depth) so fragments can go out while the value is still growing
and their concatenation is exactly that text. Text outside calls is content; whitespace between
calls is dropped. A closing tag inside one of the call's JSON strings does not end it. With
parallel_tool_calls false only the first call is kept. An answer that starts with a bare call
object (no tags: just a name and arguments, naming one of the request's functions) counts as a
call too, as do bare calls right after it; text after them is content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

import pydantic_core

from engines.tool_prompt import CLOSE, OPEN

_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class Content:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class Arguments:
    index: int
    text: str


Event = Content | CallStart | Arguments


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class _ValueScanner:
    """Where a JSON value ends, found one character at a time."""

    def __init__(self):
        self.started = False
        self.kind = ""          # "{" / "[" (nested), '"' (a string), "p" (a number or literal)
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.ended = False

    def push(self, c: str) -> bool:
        """Consume c; True if it belongs to the value (False: the value ended before it)."""
        if not self.started:
            if c.isspace():
                return True
            self.started = True
            self.kind = c if c in "{[\"" else "p"
            self.depth, self.in_string = (1, False) if c in "{[" else (0, c == '"')
            return True
        if self.kind == "p":
            if c in ",}] \n\r\t":
                self.ended = True
                return False
            return True
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
                if self.kind == '"':
                    self.ended = True
            return True
        if c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            if self.depth == 0:
                self.ended = True
        return True


@dataclass
class ToolCallParser:
    parallel: bool = True
    # The request's function names. Given, an answer that is nothing but a call's JSON without the
    # tags (small Qwen models answer `{"name": "get_weather", "arguments": {...}}` bare) is a call
    # to one of them too; otherwise it stays content.
    names: frozenset[str] | None = None
    # The request forced a call (tool_choice required or a named function): its grammar admits
    # calls only, so a call cut short by max_tokens before its name is whole is nothing a client
    # can use, and never the model's words: dropped, not handed out as content.
    forced: bool = False
    calls: list[ToolCall] = field(default_factory=list)
    _buffer: str = ""
    _in_call: bool = False
    _call_text: str = ""          # the current call's text after OPEN
    _scanned: int = 0             # of _call_text, consumed by the arguments scanner
    _args_start: int | None = None
    _scanner: _ValueScanner | None = None
    _current: ToolCall | None = None
    _ignoring: bool = False       # a call past the first when parallel calls are off
    _body: _ValueScanner = field(default_factory=_ValueScanner)   # the current call's JSON object
    _bare: bool = False           # the current (or last) call came without its opening tag
    _held_space: str = ""         # whitespace after a call, not yet known to be content
    _said: bool = False           # some content went out: a bare call can no longer start

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self._buffer += text
        while self._buffer:
            if not self._in_call:
                if not self._text_part(events):
                    break
            elif not self._call_part(events):
                break
        return events

    def finish(self) -> list[Event]:
        """The end of the answer: held-back text goes out; an unclosed call is closed if it can be."""
        events: list[Event] = []
        if self._in_call:
            self._buffer = ""
            if self.forced and self._current is None:
                self._in_call = False
                return events
            self._end_call(events, self._call_text, closed=False)
        elif self._buffer:
            if not (self.forced and OPEN.startswith(self._buffer.strip())):   # not a cut opening tag
                self._content(events, self._buffer)
            self._buffer = ""
        return events

    # ---- outside a call ------------------------------------------------------------
    def _text_part(self, events: list[Event]) -> bool:
        if self.names and not self._said and (not self.calls or self._bare):   # bare calls, one after another
            head = self._buffer.lstrip()
            if not head:
                return False                  # only whitespace so far: wait for the first character
            if head.startswith("{"):
                self._start_call(bare=True)
                self._buffer = head
                return True
        at = self._buffer.find(OPEN)
        if at < 0:
            keep = _partial_suffix(self._buffer, OPEN)       # may be the start of a call's tag
            self._content(events, self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._content(events, self._buffer[:at])
        self._buffer = self._buffer[at + len(OPEN):]
        self._start_call(bare=False)
        return True

    def _start_call(self, bare: bool) -> None:
        self._in_call, self._bare, self._call_text, self._scanned = True, bare, "", 0
        self._body = _ValueScanner()
        self._held_space = ""
        self._args_start, self._scanner, self._current = None, None, None
        self._ignoring = bool(self.calls) and not self.parallel

    def _content(self, events: list[Event], text: str) -> None:
        if self.calls and not text.strip():
            # Whitespace after a call is held: dropped if another call or the end follows, the
            # words' own spacing if words do (a stream's deltas may be single spaces).
            self._held_space += text
            return
        text, self._held_space = self._held_space + text, ""
        if not text:
            return
        self._said = True
        if events and isinstance(events[-1], Content):
            events[-1].text += text
        else:
            events.append(Content(text))

    # ---- inside a call ---------------------------------------------------------------
    def _call_part(self, events: list[Event]) -> bool:
        end, cut, complete = self._call_end()
        self._call_text += self._buffer[:end]
        self._buffer = self._buffer[cut:]
        if not self._ignoring:
            self._advance(events)
            if not self._in_call:             # a bare "call" turned out to be content
                self._content(events, self._buffer)
                self._buffer = ""
                return False
        if not complete:
            return False
        self._end_call(events, self._call_text, closed=not self._bare)
        return True

    def _call_end(self) -> tuple[int, int, bool]:
        """How much of the buffer is the call's text, how much the call consumes (its text and the
        closing tag), and whether the call is complete. A tagged call ends at the closing tag, but
        not at one inside a JSON string (an argument may quote the tag); a bare one where its
        object closes, and what follows is the answer's again."""
        body, buffer = self._body, self._buffer
        for i, c in enumerate(buffer):
            if self._bare and body.ended:
                return i, i, True
            if not body.in_string:
                if buffer.startswith(CLOSE, i):
                    return i, i + len(CLOSE), True
                if len(buffer) - i < len(CLOSE) and CLOSE.startswith(buffer[i:]):
                    return i, i, False        # maybe the tag's start: wait for the rest
            if not body.ended:
                body.push(c)
        return len(buffer), len(buffer), self._bare and body.ended

    def _advance(self, events: list[Event]) -> None:
        """Name as soon as it is whole, then the arguments' text as far as it is known."""
        if self._current is None:
            match = _NAME.match(self._call_text)
            if match is None:
                return
            try:
                name = pydantic_core.from_json(f'"{match.group(1)}"')     # refuses lone surrogates
            except ValueError:
                return
            if self._bare and name not in self.names:
                self._bare = False            # JSON that names no tool: the answer, not a call
                self._in_call = False
                self._buffer = self._call_text + self._buffer
                self._call_text, self._said = "", True
                return
            self._current = ToolCall(_new_id(), name)
            self._args_start, self._scanned, self._scanner = match.end(), match.end(), _ValueScanner()
            events.append(CallStart(len(self.calls), self._current.id, name))
        scanner, text = self._scanner, self._call_text
        start = self._scanned
        while self._scanned < len(text) and not scanner.ended:
            if not scanner.push(text[self._scanned]):
                break
            self._scanned += 1
        # A number or literal is sent once whole; nested values and strings as they grow.
        if scanner.kind == "p" and not scanner.ended:
            self._scanned = start if start >= self._args_start else self._scanned
            return
        fragment = text[start:self._scanned]
        if start == self._args_start:
            fragment = fragment.lstrip()
        if fragment:
            self._current.arguments += fragment
            events.append(Arguments(len(self.calls), fragment))

    def _end_call(self, events: list[Event], body: str, closed: bool) -> None:
        self._in_call = False
        if self._ignoring:
            return
        if self._current is None:
            call = _whole_call(body, self._bare)
            if call is None or (self._bare and call.name not in self.names):
                # Not a call after all: the text stays the model's answer.
                self._content(events, ("" if self._bare else OPEN) + body + (CLOSE if closed else ""))
                return
            self._current = call
            events.append(CallStart(len(self.calls), call.id, call.name))
            events.append(Arguments(len(self.calls), call.arguments))
        elif self._scanner is not None and self._scanner.kind == "p":
            rest = self._call_text[self._scanned:]
            value = rest.strip().removesuffix("}").strip()
            if value:
                self._current.arguments += value
                events.append(Arguments(len(self.calls), value))
        self.calls.append(self._current)
        self._current = None


def _whole_call(body: str, bare: bool) -> ToolCall | None:
    """A call whose keys came in another order: parsed once it is complete. Without the tags only
    an object of exactly a name and arguments is a call: other JSON that happens to have a `name`
    is the answer."""
    try:
        value = pydantic_core.from_json(body)        # bounded nesting; no lone surrogates
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if bare and set(value) != {"name", "arguments"}:
        return None
    arguments = value.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(_new_id(), value["name"], text)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_whole(text: str, parallel: bool = True, names: frozenset[str] | None = None, forced: bool = False,
                ) -> tuple[str | None, list[ToolCall]]:
    """(content or None, tool calls) of a whole answer."""
    parser = ToolCallParser(parallel, names, forced)
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    if parser.calls:
        content = content.strip()
    return (content or None), parser.calls
