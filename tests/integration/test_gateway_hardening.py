"""Hostile clients at the gateway's edge, over real HTTP (a gateway on loopback in front of the
fake upstream): huge prompt arrays, trickled bodies, strangers with big bodies, wrong keys in
the logs, and x-ratelimit-* headers that must describe only the caller's own scopes."""

from __future__ import annotations

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from policies.config import hash_api_key
from tests.gateway_harness import InstantUpstream, RunningGateway, shared

APP_KEY = "sk-hardening-app-0123"
BATCH_KEY = "sk-hardening-batch-4567"
WRONG_KEY = "sk-WRONGzzQQxxVVkkYY"
BODY_TIMEOUT_S = 3.0
MSG = [{"role": "user", "content": "Say something."}]


def _config(upstream: str) -> str:
    return f"""
server: {{reload_poll_s: 0, body_timeout_s: {BODY_TIMEOUT_S}, max_choices_per_request: 32}}
auth:
  keys:
    - {{tenant: app, sha256: {hash_api_key(APP_KEY)}}}
    - {{tenant: batch, sha256: {hash_api_key(BATCH_KEY)}}}
tenants:
  app: {{}}
  batch: {{}}
tiers:
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
  metered: {{kind: upstream, base_url: "{upstream}", model: instant}}
models:
  direct: {{chain: [up]}}
  metered: {{chain: [metered]}}
limits:
  tenants:
    by_id:
      app: {{rpm: 1000}}
  tiers:
    by_id:
      metered: {{rpm: 500}}
"""


@pytest.fixture(scope="module")
def gw(request, tmp_path_factory):
    upstream = shared(request, "instant-upstream", InstantUpstream)
    path = tmp_path_factory.mktemp("gw-hardening") / "gateway.yaml"
    path.write_text(_config(upstream.base_url))
    server = RunningGateway(path)
    yield server
    server.stop()


def _post(gw, path: str, body: dict, key: str = APP_KEY, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{gw.base}{path}", json=body, headers={"authorization": f"Bearer {key}"}, timeout=timeout)


def _chat(gw, key: str = APP_KEY, model: str = "direct") -> httpx.Response:
    return _post(gw, "/v1/chat/completions", {"model": model, "messages": MSG, "max_tokens": 4}, key)


def _error(resp: httpx.Response) -> dict:
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# ---- prompts x n -------------------------------------------------------------------------

def test_20000_prompts_x16_is_a_400_at_once_while_another_request_is_answered(gw):
    big = {"model": "direct", "prompt": ["hi"] * 20_000, "n": 16, "max_tokens": 1}
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        huge = pool.submit(_post, gw, "/v1/completions", big)
        small = pool.submit(_chat, gw)
        huge, small = huge.result(timeout=60), small.result(timeout=60)
        elapsed = time.monotonic() - started
    assert huge.status_code == 400 and _error(huge)["param"] == "prompt"
    assert small.status_code == 200
    assert elapsed < 15          # generous: the refusal needs no per-prompt work at all


@pytest.mark.parametrize("prompts,n,best_of,param", [
    (3, 16, None, "n"),           # 48 choices > 32
    (40, 1, None, "prompt"),      # 40 prompts alone are past the cap
    (3, 1, 16, "best_of"),
])
def test_prompts_times_choices_past_the_configured_cap_is_a_400(gw, prompts, n, best_of, param):
    body = {"model": "direct", "prompt": ["a"] * prompts, "n": n, "max_tokens": 1}
    if best_of is not None:
        body["best_of"] = best_of
    resp = _post(gw, "/v1/completions", body)
    assert resp.status_code == 400
    error = _error(resp)
    assert (error["param"], error["type"]) == (param, "invalid_request_error") and "32" in error["message"]


def test_choices_at_the_cap_are_served(gw):
    assert _post(gw, "/v1/completions", {"model": "direct", "prompt": ["a"] * 2, "n": 16, "max_tokens": 1}
                 ).status_code == 200


def test_too_many_chat_messages_is_a_400(gw):
    resp = _post(gw, "/v1/chat/completions", {"model": "direct", "messages": MSG * 2049, "max_tokens": 1})
    assert resp.status_code == 400 and _error(resp)["param"] == "messages"


# ---- the body: after auth, within a deadline -------------------------------------------------

def _head(length: int, key: str | None) -> bytes:
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    return (f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n{auth}\r\n").encode()


def _response(sock: socket.socket, deadline: float) -> tuple[int, dict[str, str], bytes] | None:
    """One HTTP response read from `sock`, or None if none came before `deadline`."""
    data = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, min(0.3, deadline - time.monotonic())))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            if len(body) >= int(headers.get("content-length", 0)):
                return int(lines[0].split()[1]), headers, body
    return None


def _closed_by_server(sock: socket.socket, within_s: float = 5) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(65536) == b""
    except (TimeoutError, ConnectionResetError):
        return False


def test_trickled_body_is_a_408_and_a_concurrent_request_is_unaffected(gw):
    body = json.dumps({"model": "direct", "messages": MSG, "max_tokens": 4}).encode()
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(_head(len(body), APP_KEY))
        started = time.monotonic()
        answer, other, sent = None, None, 0
        while answer is None and time.monotonic() - started < 30:
            if sent < len(body) - 1:       # one byte at a time, and never the last one
                sock.sendall(body[sent:sent + 1])
                sent += 1
            if other is None and time.monotonic() - started > BODY_TIMEOUT_S / 4:
                t0 = time.monotonic()
                other = _chat(gw)              # while the trickle holds its request open
                other_s = time.monotonic() - t0
            answer = _response(sock, time.monotonic() + 0.2)
        assert answer is not None, "no answer to a trickled body within 30 s"
        status, headers, raw = answer
        assert status == 408 and json.loads(raw)["error"]["code"] == "request_timeout"
        assert headers.get("connection") == "close" and _closed_by_server(sock)
    assert other is not None and other.status_code == 200 and other_s < 10


@pytest.mark.parametrize("key", [None, WRONG_KEY])
def test_a_stranger_is_401_before_its_body_is_read(gw, key):
    # Headers announce a megabyte that never comes: the answer cannot have waited for it.
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(_head(1_000_000, key))
        answer = _response(sock, time.monotonic() + 10)
        assert answer is not None, "the gateway waited for the body of an unauthenticated request"
        status, headers, raw = answer
        assert status == 401 and json.loads(raw)["error"]["type"] == "invalid_request_error"
        assert headers.get("connection") == "close" and _closed_by_server(sock)


def test_a_stranger_with_a_body_past_the_size_cap_is_401_not_413(gw):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(_head(100 * 2**20, WRONG_KEY))
        answer = _response(sock, time.monotonic() + 10)
    assert answer is not None and answer[0] == 401


def test_a_body_past_the_size_cap_is_413_for_a_known_key(gw):
    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        sock.sendall(_head(100 * 2**20, APP_KEY))
        answer = _response(sock, time.monotonic() + 10)
    assert answer is not None and answer[0] == 413


# ---- what a wrong key leaves behind -----------------------------------------------------------

def _fragments(secret: str, size: int = 4) -> set[str]:
    return {secret[i:i + size] for i in range(len(secret) - size + 1)}


def test_a_wrong_key_never_appears_in_the_logs_not_even_in_part(gw, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="tiergate.requests")
    ids = []
    for path, body in (("/v1/chat/completions", {"model": "direct", "messages": MSG}),
                       ("/v1/completions", {"model": "direct", "prompt": "x"})):
        resp = _post(gw, path, body, key=WRONG_KEY)
        assert resp.status_code == 401 and _error(resp)["code"] == "invalid_api_key"
        assert not any(f in resp.text for f in _fragments(WRONG_KEY))
        ids.append(resp.headers["x-request-id"])
    models = httpx.get(f"{gw.base}/v1/models", headers={"authorization": f"Bearer {WRONG_KEY}"})
    assert models.status_code == 401 and not any(f in models.text for f in _fragments(WRONG_KEY))
    deadline = time.time() + 10          # the request's log line is written after its response
    while not all(any(i in r.getMessage() for r in caplog.records) for i in ids):
        assert time.time() < deadline, "no log line for the refused requests"
        time.sleep(0.05)
    text = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    leaked = sorted(f for f in _fragments(WRONG_KEY) if f in text)
    assert not leaked, f"fragments of the wrong key in the logs: {leaked}"


# ---- x-ratelimit-* -------------------------------------------------------------------------

def test_ratelimit_headers_describe_only_the_callers_own_scopes(gw):
    # The tier allows 500/min for everyone, the tenant 1000/min for itself: the tier's figures
    # (how much every other tenant is using it) are not this caller's to see.
    resp = _chat(gw, model="metered")
    assert resp.status_code == 200
    assert resp.headers["x-ratelimit-limit-requests"] == "1000"
    assert int(resp.headers["x-ratelimit-remaining-requests"]) >= 900
    # A tenant without limits of its own gets no x-ratelimit-* at all, tier limit or not.
    other = _chat(gw, key=BATCH_KEY, model="metered")
    assert other.status_code == 200
    assert not [h for h in other.headers if h.startswith("x-ratelimit")]
