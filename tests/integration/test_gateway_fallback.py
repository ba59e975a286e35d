"""Tier failures over real HTTP: 5xx fallback, 4xx pass-through, an upstream stream closed when
the client leaves, and config hot reload (good file swapped in, bad file rejected)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from tests.fakes.raw_http import read_request
from tests.fakes.upstream import ANSWER
from tests.gateway_harness import InstantUpstream, RunningGateway, free_port, shared


class ScriptedUpstream:
    """Answers by the model name in the body: fail500, bad400, or slow (an endless SSE stream,
    one event per 20 ms, that records when the gateway hangs up)."""

    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.hangups: list[int] = []       # events sent before each slow stream's client left
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(started,), daemon=True).start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", self.port))
        started.set()
        try:
            self._loop.run_until_complete(server.serve_forever())
        except asyncio.CancelledError:
            pass

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                body = json.loads((await read_request(reader))[1])
                self.requests.append(body)
                if body["model"] == "slow":
                    await self._slow_stream(reader, writer)
                    return
                status, payload = (500, {"error": "boom"}) if body["model"] == "fail500" else (
                    400, {"error": {"message": "upstream says no", "type": "invalid_request_error",
                                    "param": "stop", "code": None}})
                data = json.dumps(payload).encode()
                writer.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(data), data))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _slow_stream(self, reader, writer) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        gone = asyncio.ensure_future(reader.read(1))    # b"" once the gateway closes the connection
        sent = 0
        while not gone.done() and sent < 10_000:
            event = b'data: {"id":"s","object":"chat.completion.chunk","created":0,"model":"slow","choices":' \
                    b'[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            sent += 1
            await asyncio.sleep(0.02)
        self.hangups.append(sent)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(self._loop)])


def _config(scripted: str, instant: str, extra_model: str = "") -> str:
    return f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  flaky: {{kind: upstream, base_url: "{scripted}", model: fail500}}
  picky: {{kind: upstream, base_url: "{scripted}", model: bad400}}
  slow: {{kind: upstream, base_url: "{scripted}", model: slow, read_timeout_s: 5}}
  up: {{kind: upstream, base_url: "{instant}", model: instant}}
  capped: {{kind: upstream, base_url: "{scripted}", model: slow, read_timeout_s: 5, max_in_flight: 1}}
models:
  flaky-first: {{chain: [flaky, up]}}
  picky-first: {{chain: [picky, up]}}
  slow: {{chain: [slow]}}
  capped-first: {{chain: [capped, up]}}
  capped-only: {{chain: [capped]}}
{extra_model}
"""


@pytest.fixture(scope="module")
def setup(request, tmp_path_factory):
    scripted = ScriptedUpstream()
    instant = shared(request, "instant-upstream", InstantUpstream)
    path = tmp_path_factory.mktemp("gw-fb") / "gateway.yaml"
    path.write_text(_config(scripted.base_url, instant.base_url))
    gw = RunningGateway(path)
    yield gw, scripted, instant, path
    gw.stop()
    scripted.stop()


def _client(gw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)


MSG = [{"role": "user", "content": "hi"}]


def test_server_error_falls_back_before_any_byte(setup):
    gw, scripted, _, _ = setup
    raw = _client(gw).chat.completions.with_raw_response.create(model="flaky-first", messages=MSG)
    assert raw.parse().choices[0].message.content == ANSWER
    assert raw.headers["x-tiergate-tier"] == "up"
    assert raw.headers["x-tiergate-fallbacks"] == "flaky: tier_failure"
    chunks = list(_client(gw).chat.completions.create(model="flaky-first", messages=MSG, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER
    assert scripted.requests[-1]["stream"] is True and scripted.requests[-1]["model"] == "fail500"


class _HeldStream:
    """A streamed request kept open after its first chunk (the scripted `slow` stream never ends)."""

    def __init__(self, gw, model: str):
        self._ctx = httpx.stream("POST", f"{gw.base}/v1/chat/completions", timeout=10,
                                 json={"model": model, "messages": MSG, "stream": True})
        self.response = self._ctx.__enter__()
        assert self.response.status_code == 200
        self._chunks = self.response.iter_raw()      # kept: dropping the iterator closes the stream
        next(self._chunks)
        self.tier = self.response.headers["x-tiergate-tier"]

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)


def test_a_tier_at_its_max_in_flight_overflows_to_the_next_one(setup):
    gw, *_ = setup
    capped = gw.runtime.tiers["capped"]
    held = _HeldStream(gw, "capped-first")
    try:
        assert held.tier == "capped" and capped.in_flight == 1
        resp = _client(gw).chat.completions.with_raw_response.create(model="capped-first", messages=MSG)
        assert resp.headers["x-tiergate-tier"] == "up"
        assert resp.headers["x-tiergate-fallbacks"] == "capped: tier_busy"
        # Every tier of the chain busy: the request waits its turn on the first, it is not refused.
        queued = _HeldStream(gw, "capped-only")
        assert queued.tier == "capped" and capped.in_flight == 2
        queued.close()
    finally:
        held.close()
    deadline = time.time() + 120                 # the closed streams leave the tier's in-flight count
    while capped.in_flight and time.time() < deadline:
        time.sleep(0.02)
    again = _HeldStream(gw, "capped-first")
    assert again.tier == "capped"
    again.close()


def test_client_error_from_upstream_is_passed_through_not_retried(setup):
    gw, scripted, _, _ = setup
    before = len(scripted.requests)
    with pytest.raises(openai.BadRequestError) as info:
        _client(gw).chat.completions.create(model="picky-first", messages=MSG)
    assert info.value.body["message"] == "upstream says no" and info.value.body["param"] == "stop"
    assert len(scripted.requests) == before + 1   # one try: a bad request is bad on every tier


def test_client_leaving_mid_stream_closes_the_upstream_request(setup):
    gw, scripted, _, _ = setup
    before = len(scripted.hangups)
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions",
                      json={"model": "slow", "messages": MSG, "stream": True}) as resp:
        assert resp.status_code == 200
        events = 0
        for line in resp.iter_lines():
            events += line.startswith("data: ")
            if events == 3:
                break
    deadline = time.time() + 120
    while len(scripted.hangups) == before and time.time() < deadline:
        time.sleep(0.02)
    assert len(scripted.hangups) == before + 1, "the upstream stream was not closed"
    assert scripted.hangups[-1] < 200     # it stopped within a few events, not at the end


def test_hot_reload_swaps_config_and_rejects_a_bad_file(setup):
    gw, scripted, instant, path = setup
    client = _client(gw)
    assert "fresh" not in [m.id for m in client.models.list().data]
    path.write_text(_config(scripted.base_url, instant.base_url, "  fresh: {chain: [up]}"))
    assert gw.reload() is True
    answer = client.chat.completions.create(model="fresh", messages=MSG)
    assert answer.choices[0].message.content == ANSWER
    generation = gw.holder.generation
    path.write_text("tiers:\n  up:\n    kind: upstream\n    base_url: nope\n")
    assert gw.reload() is False
    assert gw.holder.generation == generation and "tiers.up." in gw.reloader.last_error
    assert client.chat.completions.create(model="fresh", messages=MSG).choices[0].message.content == ANSWER
    path.write_text(_config(scripted.base_url, instant.base_url))   # back as it was for other tests
    assert gw.reload() is True


def test_a_changed_file_is_picked_up_by_polling(request, tmp_path):
    instant = shared(request, "instant-upstream", InstantUpstream)
    path = tmp_path / "gateway.yaml"
    base = f"auth: {{enabled: false}}\nserver: {{reload_poll_s: 0.1}}\n" \
           f"tiers:\n  up: {{kind: upstream, base_url: '{instant.base_url}', model: instant}}\n"
    path.write_text(base)
    gw = RunningGateway(path)
    try:
        time.sleep(0.05)
        path.write_text(base + "models:\n  up: {chain: [up]}\n  polled: {chain: [up]}\n")
        deadline = time.time() + 120
        while gw.holder.generation == 1 and time.time() < deadline:
            time.sleep(0.05)
        ids = [m["id"] for m in httpx.get(f"{gw.base}/v1/models").json()["data"]]
        assert ids == ["up", "polled"]
    finally:
        gw.stop()
