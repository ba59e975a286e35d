"""The gateway's connections to an upstream tier under pressure, over real HTTP: a streaming
client that stops reading is cut off and its connection comes back; a pool with no free
connection is the gateway's own overload (a 503, no breaker count), and one tenant at its share
of the pool gets a 429 while another tenant still gets a connection."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from policies.config import hash_api_key
from tests.fakes.upstream import ANSWER
from tests.gateway_harness import InstantUpstream, RunningGateway

KEY_A, KEY_B = "sk-tenant-a-0001", "sk-tenant-b-0002"
MSG = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    slow, good = InstantUpstream(), InstantUpstream()
    url = slow.base_url
    path = tmp_path_factory.mktemp("gw-pool") / "gateway.yaml"
    path.write_text(f"""
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: a, sha256: {hash_api_key(KEY_A)}}}
    - {{tenant: b, sha256: {hash_api_key(KEY_B)}}}
tenants: {{a: {{}}, b: {{}}}}
tiers:
  shared: {{kind: upstream, base_url: "{url}", model: instant, max_connections: 4, tenant_share: 0.5,
            pool_timeout_s: 0.3}}
  small: {{kind: upstream, base_url: "{url}", model: instant, max_connections: 2, tenant_share: 1,
           pool_timeout_s: 0.3}}
  stall: {{kind: upstream, base_url: "{url}", model: instant, client_write_timeout_s: 0.5}}
  up: {{kind: upstream, base_url: "{good.base_url}", model: instant}}
models:
  shared: {{chain: [shared]}}
  small-only: {{chain: [small]}}
  small-first: {{chain: [small, up]}}
  stall: {{chain: [stall]}}
limits:
  breakers: {{default: {{min_calls: 2, failure_rate: 0.5, open_s: 60}}}}
  retry: {{min_retries_per_window: 1000}}
""")
    gw = RunningGateway(path)
    yield gw, slow
    gw.stop()
    slow.stop()
    good.stop()


def _control(upstream: InstantUpstream, **update) -> dict:
    base = upstream.base_url.removesuffix("/v1") + "/__control"
    return (httpx.post(base, json=update) if update else httpx.get(base)).json()


def _ask(gw, model: str, key: str = KEY_A, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{gw.base}/v1/chat/completions", json={"model": model, "messages": MSG, "max_tokens": 9},
                      headers={"authorization": f"Bearer {key}"}, timeout=timeout)


def _breaker(gw, name: str):
    return asyncio.run_coroutine_threadsafe(gw.runtime.limits.breakers.state(name), gw.server_loop()).result(5)


def _wait_for(check, what: str, timeout_s: float = 20) -> None:
    deadline = time.time() + timeout_s
    while not check():
        if time.time() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.02)


class _Held:
    """`count` requests the upstream holds unanswered (stall_next) until released."""

    def __init__(self, gw, upstream: InstantUpstream, model: str, count: int, key: str = KEY_A):
        self.upstream = upstream
        self.answers: list[httpx.Response] = []
        _control(upstream, stall_next=count)
        self.threads = [threading.Thread(target=lambda: self.answers.append(_ask(gw, model, key)), daemon=True)
                        for _ in range(count)]
        for thread in self.threads:
            thread.start()
        _wait_for(lambda: _control(upstream)["stalling"] == count, f"{count} calls held upstream")

    def release(self) -> list[httpx.Response]:
        _control(self.upstream, release=True)
        for thread in self.threads:
            thread.join(30)
        return self.answers


def _openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert resp.headers["retry-after"] == "1"


def test_an_exhausted_pool_is_the_gateways_overload_not_the_tiers_failure(setup):
    gw, slow = setup
    held = _Held(gw, slow, "small-only", 2)
    try:
        for _ in range(4):          # past the breaker's min_calls, had they counted
            _openai_error(_ask(gw, "small-only"), 503, "upstream_pool_exhausted")
        state = _breaker(gw, "small")
        assert state.state == "closed" and state.failures == 0
        moved = _ask(gw, "small-first")          # a next tier takes what the full pool cannot
        assert moved.status_code == 200 and moved.headers["x-tiergate-tier"] == "up"
        assert moved.headers["x-tiergate-fallbacks"] == "small: pool_exhausted"
    finally:
        answers = held.release()
    assert [r.status_code for r in answers] == [200, 200]
    assert _ask(gw, "small-only").json()["choices"][0]["message"]["content"] == ANSWER
    assert _breaker(gw, "small").state == "closed"


def test_a_tenant_at_its_share_is_refused_while_another_tenant_gets_a_connection(setup):
    gw, slow = setup
    tier = gw.runtime.tiers["shared"]
    held = _Held(gw, slow, "shared", 2, KEY_A)        # tenant a: 2 of 4 connections, its whole share
    try:
        _openai_error(_ask(gw, "shared", KEY_A), 429, "tenant_connection_share_exceeded")
        assert tier.shares.held("a") == 2 and tier.transport.in_use == 2
        other = _ask(gw, "shared", KEY_B)
        assert other.status_code == 200 and other.json()["choices"][0]["message"]["content"] == ANSWER
        assert _breaker(gw, "shared").failures == 0
    finally:
        answers = held.release()
    assert [r.status_code for r in answers] == [200, 200]
    _wait_for(lambda: tier.shares.held("a") == 0, "tenant a's connections back")
    assert _ask(gw, "shared", KEY_A).status_code == 200


def test_a_streaming_client_that_stops_reading_is_cut_off_and_its_connection_returns(setup):
    gw, slow = setup
    tier = gw.runtime.tiers["stall"]
    _control(slow, mode="flood")
    hangups = _control(slow)["hangups"]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # little room: the gateway's sends back up soon
    try:
        client.connect(("127.0.0.1", gw.port))
        body = (b'{"model": "stall", "stream": true, "messages": [{"role": "user", "content": "hi"}]}')
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                       b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s" % (KEY_A.encode(), len(body), body))
        assert client.recv(64).startswith(b"HTTP/1.1 200")
        # ...and the client reads no more: the gateway cuts it off and closes its upstream call.
        _wait_for(lambda: _control(slow)["hangups"] == hangups + 1, "the upstream call was closed")
        _wait_for(lambda: tier.transport.in_use == 0 and tier.in_flight == 0, "the connection slot returned")
        client.settimeout(30)
        tail = b""
        while chunk := client.recv(1 << 20):    # what was buffered, then the end: the stream never finished
            tail = (tail + chunk)[-64:]
        assert not tail.endswith(b"0\r\n\r\n")
    finally:
        client.close()
        _control(slow, mode=None)
    assert _ask(gw, "stall").status_code == 200
