"""A steerable fake OpenAI upstream: the benchmark's instant server plus failures, delays and
slow streams, set at run time through /__control.

POST /__control {"fail_status": 503} makes every completion fail with that status (a 429 or 503
with `retry-after: 7`) until {"fail_status": null}; {"delay_s": 0.5} delays each answer (a slow time to first token);
{"stream_interval_s": 0.2} sends stream events that far apart; GET returns the counts of
completions answered and failed.

Hostile answers, for the gateway's defences: {"mode": M} answers every completion badly until
{"mode": null}: "garbage" (not JSON), "non_object" (JSON that is not an object), "bad_usage"
(usage that is not a count), "huge" (an answer, or one stream event, of `huge_bytes`), "crlf"
(a good stream with CRLF line ends), "reset" (a stream reset after its first event),
"error_event" (a stream whose second event is an error quoting internal details), "flood" (an
endless stream of big events, until the client hangs up: `hangups` counts those). Streams only
(a whole answer is the normal one): "running_usage" (usage so far in every chunk, asked for or
not, and the closing usage chunk), "truncated" (the body ends cleanly after two events: no
finish_reason, no [DONE]), "no_done" (every choice finished, no [DONE]), "bad_final_usage" (a
negative count in the closing usage chunk), and a malformed second event: "bad_json", "not_utf8",
"bad_index" (choice 7), "bad_tool_calls" (a tool call delta indexed "zero"). Both:
"redirect_json" (a 302 whose body is a good answer).
{"stall_next": N} holds the next N completions unanswered until {"release": true};
`last_body` is the last completion body received.

Real usage: {"usage_tokenizer": DIR} (a checkpoint directory with tokenizer.json and
tokenizer_config.json) answers completions with the usage a server running that model reports
(tests/fakes/real_usage.py) until {"usage_tokenizer": null}; `served_tokens` sums the usage
reported, per request model.

    python -m tests.fakes.upstream --port 9000
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from bench.serving import instant_upstream
from bench.serving.instant_upstream import ANSWER, chunked, http_response, route, stream_events
from tests.fakes.real_usage import RealUsage

__all__ = ["ANSWER", "Behaviour", "serve"]

_BAD_CONTROL = (b'{"error":{"message":"bad control body","type":"invalid_request_error",'
                b'"param":null,"code":null}}')


@dataclass
class Behaviour:
    """What /__control set, and what was answered since the start."""

    fail_status: int | None = None
    delay_s: float = 0.0
    stream_interval_s: float = 0.0
    completions: int = 0
    failed: int = 0
    mode: str | None = None
    huge_bytes: int = 4 << 20
    stall_next: int = 0
    stalling: int = 0
    released: int = 0
    hangups: int = 0
    last_body: dict | None = None
    usage_tokenizer: str | None = None
    served_tokens: dict[str, int] = field(default_factory=dict)
    _real: ClassVar[RealUsage | None] = None    # set per instance with usage_tokenizer

    async def handle(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> None:
        if path == "/__control":
            self._control_hostile(method, raw)
            self._control_usage(method, raw)
            writer.write(self._control(method, raw))
            return
        if method == "POST" and path.endswith("completions") and await self._hostile(path, raw, writer):
            return
        if self.delay_s and path.endswith("completions"):
            await asyncio.sleep(self.delay_s)
        if self.stream_interval_s and self.fail_status is None and _is_stream(path, raw):
            await self._trickle(writer, path, raw)
        else:
            writer.write(self._answer_or_fail(method, path, raw))

    def _control(self, method: str, raw: bytes) -> bytes:
        if method == "POST":
            try:
                update = json.loads(raw or b"{}")
                if "fail_status" in update:
                    self.fail_status = None if update["fail_status"] is None else int(update["fail_status"])
                if "delay_s" in update:
                    self.delay_s = float(update["delay_s"])
                if "stream_interval_s" in update:
                    self.stream_interval_s = float(update["stream_interval_s"])
            except (ValueError, TypeError):
                return http_response(400, _BAD_CONTROL)
        return http_response(200, json.dumps(asdict(self)).encode())

    async def _trickle(self, writer: asyncio.StreamWriter, path: str, raw: bytes) -> None:
        """A stream whose events leave `stream_interval_s` apart (a client may hang up midway)."""
        self.completions += 1
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for event in stream_events(json.loads(raw), path.endswith("chat/completions")):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(self.stream_interval_s)
        writer.write(b"0\r\n\r\n")

    def _answer_or_fail(self, method: str, path: str, raw: bytes) -> bytes:
        if method != "POST" or not path.endswith("completions"):
            return route(method, path, raw)
        if self.fail_status is not None:
            self.failed += 1
            body = json.dumps({"error": {"message": f"failing on purpose ({self.fail_status})",
                                         "type": "server_error" if self.fail_status >= 500 else
                                         "invalid_request_error", "param": None, "code": None}}).encode()
            overloaded = self.fail_status in (429, 503)      # as servers say when to come back
            return http_response(self.fail_status, body, headers={"retry-after": "7"} if overloaded else None)
        self.completions += 1
        if self._real is not None:
            return self._real_answer(path, raw)
        return route(method, path, raw)

    def _control_usage(self, method: str, raw: bytes) -> None:
        try:
            update = json.loads(raw or b"{}") if method == "POST" else {}
        except ValueError:
            return
        if isinstance(update, dict) and "usage_tokenizer" in update:
            self.usage_tokenizer = update["usage_tokenizer"]
            self._real = RealUsage(self.usage_tokenizer) if self.usage_tokenizer else None

    def _real_answer(self, path: str, raw: bytes) -> bytes:
        body = json.loads(raw)
        chat = path.endswith("chat/completions")
        answer = self._real.answer(body, chat)
        model = str(body.get("model"))
        self.served_tokens[model] = self.served_tokens.get(model, 0) + answer["usage"]["total_tokens"]
        if not body.get("stream"):
            return http_response(200, json.dumps(answer).encode())
        head = {k: answer[k] for k in ("id", "created", "model")}
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        events = []
        for choice in answer["choices"]:
            text = choice.pop("message", {}).get("content", "") if chat else choice.pop("text")
            delta = {"delta": {"role": "assistant", "content": text}} if chat else {"text": text}
            events.append({**head, "choices": [{**choice, **delta}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**head, "choices": [], "usage": answer["usage"]})
        return chunked([_event(e) for e in events] + [b"data: [DONE]\n\n"])

    def _control_hostile(self, method: str, raw: bytes) -> None:
        if method != "POST":
            return
        try:
            update = json.loads(raw or b"{}")
        except ValueError:
            return
        if not isinstance(update, dict):
            return
        if "mode" in update:
            self.mode = update["mode"]
        if "huge_bytes" in update:
            self.huge_bytes = int(update["huge_bytes"])
        if "stall_next" in update:
            self.stall_next = int(update["stall_next"])
        if update.get("release"):
            self.released += 1

    async def _hostile(self, path: str, raw: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answers a completion the hostile way, if one is set; False to answer it normally."""
        try:
            body = json.loads(raw)
        except ValueError:
            return False
        if isinstance(body, dict):
            self.last_body = body
        if self.stall_next > 0:
            self.stall_next -= 1
            self.stalling += 1
            released = self.released
            while self.released == released:      # held, with no byte of an answer, until released
                await asyncio.sleep(0.02)
            self.stalling -= 1
            return False
        if self.mode is None or not isinstance(body, dict):
            return False
        self.completions += 1
        chat = path.endswith("chat/completions")
        if body.get("stream"):
            await _hostile_stream(self, body, chat, writer)
        else:
            writer.write(_hostile_answer(self, body, chat))
        return True


def _is_stream(path: str, raw: bytes) -> bool:
    if not path.endswith("completions"):
        return False
    try:
        return bool(json.loads(raw).get("stream"))
    except (ValueError, AttributeError):
        return False


async def serve(host: str, port: int, ready: asyncio.Event | None = None, behaviour: Behaviour | None = None) -> None:
    await instant_upstream.serve(host, port, ready, (behaviour or Behaviour()).handle)


# ---- hostile answers ---------------------------------------------------------------------------
_INTERNAL = "internal detail: worker 7 at http://10.9.8.7:8000 ran out of blocks"


def _hostile_answer(self: Behaviour, body: dict, chat: bool) -> bytes:
    mode = self.mode
    if mode == "garbage":
        return http_response(200, b"<html>upstream proxy error</html>")
    if mode == "non_object":
        return http_response(200, b"[1, 2, 3]")
    if mode == "redirect_json":
        return route("POST", "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body).encode()) \
            .replace(b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:1/v1\r\n", 1)
    answer = json.loads(route("POST", "/v1/chat/completions" if chat else "/v1/completions",
                              json.dumps({**body, "stream": False}).encode()).split(b"\r\n\r\n", 1)[1])
    if mode == "bad_usage":
        answer["usage"] = {"prompt_tokens": "many", "completion_tokens": 3}
    elif mode == "huge":
        answer["padding"] = "x" * self.huge_bytes
    return http_response(200, json.dumps(answer).encode())


def _event(data: dict | str) -> bytes:
    return b"data: " + (data if isinstance(data, str) else json.dumps(data)).encode() + b"\n\n"


async def _hostile_stream(self: Behaviour, body: dict, chat: bool, writer: asyncio.StreamWriter) -> None:
    mode = self.mode
    events = stream_events({**body, "stream_options": {"include_usage": True}}, chat)
    if mode == "garbage":
        events = [b"<html>upstream proxy error</html>\n\n"]
    elif mode == "non_object":
        events = [b"data: [1, 2, 3]\n\n"]
    elif mode == "bad_usage":
        events = [_event({"id": "x", "object": "chat.completion.chunk", "choices": [],
                          "usage": {"prompt_tokens": -1, "completion_tokens": 2}})] + events
    elif mode == "huge":
        events = [b'data: {"padding": "' + b"x" * self.huge_bytes]     # never ends its event
    elif mode == "crlf":
        events = [e.replace(b"\n", b"\r\n") for e in events]
    elif mode == "error_event":
        events = events[:1] + [_event({"error": {"message": _INTERNAL, "type": "internal_error"}})]
    elif mode in _BAD_SECOND_EVENT:
        events = events[:1] + [_BAD_SECOND_EVENT[mode]] + events[1:]
    else:
        events = _cut_or_counted(mode, body, chat, events)
    status = b"302 Found\r\nlocation: http://127.0.0.1:1/v1" if mode == "redirect_json" else b"200 OK"
    writer.write(b"HTTP/1.1 %s\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" % status)
    if mode == "flood":
        await _flood(self, writer, chat)
        return
    if mode == "reset":
        writer.write(b"%x\r\n%s\r\n" % (len(events[0]), events[0]))
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with a RST
        writer.transport.abort()
        return
    for event in events:
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
    writer.write(b"0\r\n\r\n")


_BAD_SECOND_EVENT = {
    "bad_json": b"data: {not json at all\n\n",
    "not_utf8": b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "\xff\xfe"}, "finish_reason": null}]}\n\n',
    "bad_index": _event({"id": "x", "choices": [{"index": 7, "delta": {"content": "x"}, "finish_reason": None}]}),
    "bad_tool_calls": _event({"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": "zero", "function": {"arguments": 5}}]}, "finish_reason": None}]}),
}


def _cut_or_counted(mode: str, body: dict, chat: bool, events: list[bytes]) -> list[bytes]:
    """The stream modes that change how it ends or what usage it reports."""
    if mode == "running_usage":
        return stream_events({**body, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
                             chat)
    if mode == "truncated":
        return events[:2]
    if mode == "no_done":
        return events[:-1]
    if mode == "bad_final_usage":
        closing = json.loads(events[-2][6:])
        closing["usage"]["completion_tokens"] = -5
        return events[:-2] + [_event(closing), events[-1]]
    return events


async def _flood(self: Behaviour, writer: asyncio.StreamWriter, chat: bool) -> None:
    piece = "y" * 32768
    choice = {"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat else \
        {"index": 0, "text": piece, "finish_reason": None}
    event = _event({"id": "flood", "object": "chat.completion.chunk", "choices": [choice]})
    frame = b"%x\r\n%s\r\n" % (len(event), event)
    try:
        for _ in range(64 * 1024):            # 2 GiB at most: a client that reads it all is not stalled
            writer.write(frame)
            await writer.drain()
    except ConnectionError:
        self.hangups += 1
        raise


if __name__ == "__main__":
    instant_upstream.main(Behaviour().handle)
