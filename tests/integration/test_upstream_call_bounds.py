"""What bounds one upstream call, over real HTTP: the tokens it is charged (never more than its
reservation, whatever the upstream reports), the time a stream may run (the request's deadline,
not only its first byte), and a non-streamed call whose client left (the upstream connection is
closed at once, its slot given back, and the client's 499 is recorded)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from gateway.schema import ChatCompletionRequest
from gateway.token_bounds import prompt_bound
from policies.config import hash_api_key
from tests.fakes.raw_http import read_request
from tests.gateway_harness import RunningGateway, free_port

KEY = "sk-bounds-000001"
MSG = [{"role": "user", "content": "Say something."}]
MAX_TOKENS = 8
PROMPT_ESTIMATE = prompt_bound(ChatCompletionRequest.model_validate({"model": "m", "messages": MSG}))
DEADLINE_S = 2.0


_STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def _chunk(text: str) -> bytes:
    """One SSE event of a streamed answer, as one HTTP chunk."""
    event = b"data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "up",
                                    "choices": [{"index": 0, "delta": {"content": text},
                                                 "finish_reason": None}]}).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


class ScriptedUpstream:
    """An OpenAI-compatible upstream whose answer the test picks per call: `mode` is one of
    "overreport" (an answer claiming 2**31 - 1 completion tokens), "slow_stream" (an event every
    0.2 s for 60 s), "quiet_stream" (one event, then silence for 60 s) or "slow_answer" (a whole
    answer after 30 s); the last two count in `abandoned` a gateway that hangs up first."""

    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.mode = "overreport"
        self.abandoned = 0       # slow answers the gateway hung up on
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        started = threading.Event()

        async def main():
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            started.set()
            await self._server.serve_forever()

        self._thread = threading.Thread(target=lambda: self._loop.run_until_complete(main()), daemon=True)
        self._thread.start()
        assert started.wait(10)

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                json.loads((await read_request(reader))[1])
                self.requests += 1
                await getattr(self, "_" + self.mode)(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _answer(usage: dict) -> bytes:
        body = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "up",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                        "finish_reason": "stop"}], "usage": usage}).encode()
        return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            len(body), body)

    async def _overreport(self, reader, writer) -> None:
        writer.write(self._answer({"prompt_tokens": 2**31 - 1, "completion_tokens": 2**31 - 1,
                                   "total_tokens": 2**31 - 1}))
        await writer.drain()

    async def _slow_answer(self, reader, writer) -> None:
        try:    # the request was read whole: the next read ends only if the gateway hangs up
            if await asyncio.wait_for(reader.read(1), 30) == b"":
                self.abandoned += 1
                raise ConnectionResetError("the gateway hung up")
        except TimeoutError:
            pass
        writer.write(self._answer({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}))
        await writer.drain()

    async def _quiet_stream(self, reader, writer) -> None:
        """One event, then nothing for 60 s unless the gateway hangs up (counted in `abandoned`)."""
        writer.write(_STREAM_HEAD + _chunk("w"))
        await writer.drain()
        try:
            if await asyncio.wait_for(reader.read(1), 60) == b"":
                self.abandoned += 1
                raise ConnectionResetError("the gateway hung up")
        except TimeoutError:
            pass

    async def _slow_stream(self, reader, writer) -> None:
        writer.write(_STREAM_HEAD)
        for i in range(300):
            writer.write(_chunk(f"w{i} "))
            await writer.drain()
            await asyncio.sleep(0.2)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)


@pytest.fixture(scope="module")
def upstream():
    server = ScriptedUpstream()
    yield server
    server.stop()


def _config(upstream: ScriptedUpstream, deadline_s: float) -> str:
    return f"""
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(KEY)}, name: app-key}}
tenants: {{app: {{}}}}
tiers:
  up: {{kind: upstream, base_url: "{upstream.base_url}", model: up}}
models:
  m: {{chain: [up]}}
limits:
  store: {{reservation_ttl_s: 60}}
  retry: {{deadline_s: {deadline_s}}}
  tenants:
    by_id:
      app: {{tokens_per_day: 100000, max_concurrent: 1}}
"""


@pytest.fixture(scope="module")
def gw(upstream, tmp_path_factory):
    path = tmp_path_factory.mktemp("gw-bounds") / "gateway.yaml"
    path.write_text(_config(upstream, DEADLINE_S))
    server = RunningGateway(path)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gw_patient(upstream, tmp_path_factory):
    """The same with a deadline far past the test: only the client's leaving can end a call."""
    path = tmp_path_factory.mktemp("gw-bounds-patient") / "gateway.yaml"
    path.write_text(_config(upstream, 50))
    server = RunningGateway(path)
    yield server
    server.stop()


def _usage(gw):
    budgets = gw.runtime.limits.budgets
    return asyncio.run_coroutine_threadsafe(budgets.usage("t:app"), gw.server_loop()).result(timeout=10)


def _stream_events(gw) -> list[str]:
    """The data of every event of a streamed chat answer."""
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions", timeout=90,
                      headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "m", "messages": MSG, "max_tokens": MAX_TOKENS, "stream": True}) as resp:
        assert resp.status_code == 200
        return [line.removeprefix("data: ") for line in resp.iter_lines() if line.startswith("data: ")]


def _hung_up(upstream: ScriptedUpstream, before: int, timeout_s: float = 25) -> bool:
    """Whether the upstream saw the gateway hang up on a call (within `timeout_s`)."""
    deadline = time.time() + timeout_s
    while upstream.abandoned == before and time.time() < deadline:
        time.sleep(0.02)
    return upstream.abandoned > before


def _wait_idle(gw, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while gw.runtime.limits.in_flight and time.time() < deadline:
        time.sleep(0.02)
    assert gw.runtime.limits.in_flight == 0


def _post(gw, **body) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {KEY}"},
                      json={"model": "m", "messages": MSG, "max_tokens": MAX_TOKENS, **body})


def test_an_upstream_overreporting_usage_is_charged_its_reservation_at_most(gw, upstream):
    upstream.mode = "overreport"
    before = _usage(gw).used_tokens_day
    assert _post(gw).status_code == 200
    _wait_idle(gw)
    charged = _usage(gw).used_tokens_day - before
    assert 0 < charged <= PROMPT_ESTIMATE + MAX_TOKENS
    assert _post(gw).status_code == 200          # one lying answer did not take the day's budget


def test_a_stream_ends_at_the_request_deadline(gw, upstream):
    upstream.mode = "slow_stream"
    started = time.monotonic()
    events = _stream_events(gw)
    took = time.monotonic() - started
    assert took < DEADLINE_S + 5                 # not the upstream's 60 s
    error = json.loads(events[-1])["error"]
    assert error["code"] == "deadline_exceeded"
    assert len(events) > 2                       # tokens went out before the cut
    _wait_idle(gw)
    assert _usage(gw).in_flight == 0             # the concurrency slot is given back
    upstream.mode = "overreport"
    assert _post(gw).status_code == 200          # and another request is admitted


def test_a_stream_whose_tier_went_quiet_ends_at_the_request_deadline(gw, upstream):
    """The deadline is not only checked as chunks arrive: a tier that stops sending (a stalled
    engine, an upstream holding the connection open) does not hold the stream past it."""
    upstream.mode = "quiet_stream"
    abandoned = upstream.abandoned
    started = time.monotonic()
    events = _stream_events(gw)
    assert time.monotonic() - started < 45              # not the upstream's 60 s of silence
    assert json.loads(events[-1])["error"]["code"] == "deadline_exceeded"
    _wait_idle(gw)
    assert _hung_up(upstream, abandoned)                # the upstream call was closed
    upstream.mode = "overreport"
    assert _post(gw).status_code == 200


def test_a_stream_whose_client_left_before_its_first_chunk_is_hung_up(gw_patient, upstream):
    """Queued or still before its first token, a stream is watched as a whole answer is: the
    client's leaving ends the tier call at once."""
    upstream.mode = "slow_answer"
    abandoned = upstream.abandoned
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", f"{gw_patient.base}/v1/chat/completions", timeout=0.5,
                          headers={"authorization": f"Bearer {KEY}"},
                          json={"model": "m", "messages": MSG, "max_tokens": MAX_TOKENS, "stream": True}) as resp:
            resp.read()
    assert _hung_up(upstream, abandoned)         # the upstream saw the gateway hang up (it answers after 30 s)
    _wait_idle(gw_patient)
    assert _usage(gw_patient).in_flight == 0


def test_a_non_streamed_call_whose_client_left_is_hung_up(gw_patient, upstream):
    upstream.mode = "slow_answer"
    abandoned = upstream.abandoned
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw_patient.base}/v1/chat/completions", timeout=0.5,
                   headers={"authorization": f"Bearer {KEY}"},
                   json={"model": "m", "messages": MSG, "max_tokens": MAX_TOKENS})
    assert _hung_up(upstream, abandoned)         # the upstream saw the gateway hang up (it answers after 30 s)
    _wait_idle(gw_patient)
    assert _usage(gw_patient).in_flight == 0
