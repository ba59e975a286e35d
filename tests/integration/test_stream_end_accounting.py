"""How a relayed stream's end is accounted, over real HTTP against a trickling upstream (the fake
upstream sending its events 0.3 s apart, [DONE] included, then closing):
- a client that closes its connection as soon as it has read [DONE] (as the official openai
  client does) got the whole answer: the request is not logged or counted as a client that left;
- one that closes before [DONE] did leave;
- the gateway's overhead figure leaves out the time spent relaying (waiting on the tier's events
  and the client's reads): for a stream it is the gateway's own work, not the answer's length."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.gateway_harness import InstantUpstream, RunningGateway, logged_request

INTERVAL_S = 0.3
BODY = {"model": "direct", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    upstream = InstantUpstream()
    httpx.post(f"http://127.0.0.1:{upstream.port}/__control", json={"stream_interval_s": INTERVAL_S},
               timeout=10).raise_for_status()
    path = tmp_path_factory.mktemp("stream-end") / "gateway.yaml"
    path.write_text(f"""
server: {{reload_poll_s: 0}}
auth: {{enabled: false}}
tiers:
  up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}
models:
  direct: {{chain: [up]}}
""")
    server = RunningGateway(path)
    yield server
    server.stop()
    upstream.stop()


def _stream_until(gw, stop_after_done: bool) -> tuple[str, int]:
    """Read the stream's events, closing the connection right after [DONE] (or after the first
    event); the request id and the events read."""
    events = 0
    with httpx.stream("POST", f"{gw.base}/v1/chat/completions", json=BODY, timeout=60) as response:
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            events += 1
            if line.strip() == "data: [DONE]" or not stop_after_done:
                break
    return request_id, events


def test_a_client_closing_after_done_is_a_whole_answer_and_relaying_is_not_overhead(gw, caplog):
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    request_id, events = _stream_until(gw, stop_after_done=True)
    line = logged_request(caplog, request_id)
    assert line["status"] == 200 and line["error"] is None, line
    assert line["completion_tokens"] > 0
    # Every event after the first came at least INTERVAL_S after the one before it.
    relayed_ms = (events - 1) * INTERVAL_S * 1000
    assert events >= 4 and line["total_ms"] >= relayed_ms
    assert line["overhead_ms"] <= line["total_ms"] - relayed_ms, line


def test_a_client_closing_before_done_left(gw, caplog):
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    request_id, _ = _stream_until(gw, stop_after_done=False)
    line = logged_request(caplog, request_id)
    assert line["error"] == "client disconnected", line
