"""A steerable fake OpenAI upstream: the benchmark's instant server plus failures, delays and
slow streams, set at run time through /__control.

POST /__control {"fail_status": 503} makes every completion fail with that status until
{"fail_status": null}; {"delay_s": 0.5} delays each answer (a slow time to first token);
{"stream_interval_s": 0.2} sends stream events that far apart; GET returns the counts of
completions answered and failed.

    python -m tests.fakes.upstream --port 9000
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

from bench.serving import instant_upstream
from bench.serving.instant_upstream import ANSWER, http_response, route, stream_events

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

    async def handle(self, method: str, path: str, raw: bytes, writer: asyncio.StreamWriter) -> None:
        if path == "/__control":
            writer.write(self._control(method, raw))
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
            return http_response(self.fail_status, body)
        self.completions += 1
        return route(method, path, raw)


def _is_stream(path: str, raw: bytes) -> bool:
    if not path.endswith("completions"):
        return False
    try:
        return bool(json.loads(raw).get("stream"))
    except (ValueError, AttributeError):
        return False


async def serve(host: str, port: int, ready: asyncio.Event | None = None, behaviour: Behaviour | None = None) -> None:
    await instant_upstream.serve(host, port, ready, (behaviour or Behaviour()).handle)


if __name__ == "__main__":
    instant_upstream.main(Behaviour().handle)
