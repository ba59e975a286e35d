"""A tiny OpenAI-compatible server that answers at once, for `tiergate bench gateway`.

Raw asyncio HTTP/1.1 with keep-alive, so its own cost stays small next to the gateway's:
chat and text completions (JSON or SSE with usage), /v1/models and /healthz. It answers
with a fixed text and honest token counts (words of the prompt, words of the answer).

    python -m bench.serving.instant_upstream --port 9000

A `Handler` decides per request what is written back; tests/fakes/upstream.py builds its
steerable fake (failures, delays, slow streams) on the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable

ANSWER = "The quick brown fox jumps over the lazy dog."
_WORDS = ANSWER.split(" ")


def _usage(prompt_words: int, completion: int) -> dict:
    return {"prompt_tokens": prompt_words, "completion_tokens": completion, "total_tokens": prompt_words + completion}


def _prompt_words(body: dict) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return len(prompt.split()) if isinstance(prompt, str) else len(prompt)


def _answer(body: dict, chat: bool) -> bytes:
    n = int(body.get("n") or 1)
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or len(_WORDS)
    words = _WORDS[:limit]
    text = " ".join(words)
    reason = "length" if limit < len(_WORDS) else "stop"
    if chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": reason} for i in range(n)]
    else:
        choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason} for i in range(n)]
    return json.dumps({"id": "cmpl-instant", "object": "chat.completion" if chat else "text_completion",
                       "created": int(time.time()), "model": body.get("model", "instant"), "choices": choices,
                       "usage": _usage(_prompt_words(body), len(words) * n)}).encode()


def stream_events(body: dict, chat: bool) -> list[bytes]:
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or len(_WORDS)
    words = _WORDS[:limit]
    head = {"id": "cmpl-instant", "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()), "model": body.get("model", "instant")}
    options = body.get("stream_options") or {}
    # vLLM's continuous usage stats: every chunk carries the usage so far.
    running = bool(options.get("include_usage") and options.get("continuous_usage_stats"))
    events = []
    for i, word in enumerate(words):
        piece = word if i == 0 else " " + word
        choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                  else {"index": 0, "text": piece, "finish_reason": None})
        events.append({**head, "choices": [choice]} | ({"usage": _usage(_prompt_words(body), i + 1)} if running else {}))
    reason = "length" if limit < len(_WORDS) else "stop"
    last = ({"index": 0, "delta": {}, "finish_reason": reason} if chat
            else {"index": 0, "text": "", "finish_reason": reason})
    events.append({**head, "choices": [last]} | ({"usage": _usage(_prompt_words(body), len(words))} if running else {}))
    if options.get("include_usage"):
        events.append({**head, "choices": [], "usage": _usage(_prompt_words(body), len(words))})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def http_response(status: int, body: bytes, content_type: str = "application/json",
                  headers: dict[str, str] | None = None) -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            f"{extra}\r\n".encode() + body)


def chunked(events: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


Handler = Callable[[str, str, bytes, asyncio.StreamWriter], Awaitable[None]]


async def answer_at_once(method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> None:
    writer.write(route(method, path, raw))


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            length = 0
            for line in header_lines:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            raw = await reader.readexactly(length) if length else b""
            await handler(method, path, raw, writer)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def route(method: str, path: str, raw: bytes) -> bytes:
    if method == "GET" and path in ("/healthz", "/readyz"):
        return http_response(200, b'{"status":"ok"}')
    if method == "GET" and path == "/v1/models":
        return http_response(200, b'{"object":"list","data":[{"id":"instant","object":"model","created":0,'
                              b'"owned_by":"bench"}]}')
    if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
        try:
            body = json.loads(raw)
        except ValueError:
            return http_response(400, b'{"error":{"message":"bad json","type":"invalid_request_error",'
                                  b'"param":null,"code":null}}')
        chat = path.endswith("chat/completions")
        if body.get("stream"):
            return chunked(stream_events(body, chat))
        return http_response(200, _answer(body, chat))
    return http_response(404, b'{"error":{"message":"not found","type":"invalid_request_error","param":null,'
                          b'"code":null}}')


async def serve(host: str, port: int, ready: asyncio.Event | None = None, handler: Handler = answer_at_once) -> None:
    server = await asyncio.start_server(lambda r, w: _serve_connection(r, w, handler), host, port, backlog=1024)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main(handler: Handler = answer_at_once) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        run_loop(serve(args.host, args.port, handler=handler))
    except KeyboardInterrupt:
        pass


def run_loop(coro):
    try:
        import uvloop  # the gateway's own event loop: keep the upstream as light as it is
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    main()
