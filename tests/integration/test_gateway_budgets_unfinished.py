"""Work started and not finished is charged, over real HTTP (in-memory budget store):

- an embedded tier's whole-answer request whose client leaves, or that hits its deadline, is
  charged the prompt and the tokens its engine generated so far (the engine is held after a few
  steps, so how far it got does not depend on the machine's speed);
- an upstream that answered and whose answer was then unreadable, and an upstream call cut by
  the deadline, are charged what was reserved (the upstream may have generated all of it; a
  stream cut before its first event: its prompt);
- a request without max_tokens to an upstream that does not state its context is sent the
  max_tokens its reservation assumed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from gateway.context import RequestContext
from gateway.schema import ChatCompletionRequest
from gateway.tiers.base import TierCall
from gateway.token_bounds import DEFAULT_OUTPUT_BOUND, prompt_bound
from tests.fakes.upstream import ANSWER
from tests.gateway_harness import InstantUpstream, RunningGateway
from tests.tiny_models import write_tiny_checkpoint

MSG = [{"role": "user", "content": "Say something."}]
ANSWER_WORDS = len(ANSWER.split())
SCOPE = "t:default"                 # the anonymous tenant (auth off)
LIMITS = "limits: {tenants: {by_id: {default: {tokens_per_day: 100000000}}}, retry: {deadline_s: %s}}"


def _on_gateway(gw: RunningGateway, coro):
    return asyncio.run_coroutine_threadsafe(coro, gw.server_loop()).result(timeout=30)


def _used(gw: RunningGateway) -> int:
    return _on_gateway(gw, gw.runtime.limits.budgets.usage(SCOPE)).used_tokens_day


def _settled(gw: RunningGateway) -> None:
    """Wait until no request is in flight, then check nothing stays reserved."""
    deadline = time.time() + 120
    while gw.runtime.limits.in_flight and time.time() < deadline:
        time.sleep(0.02)
    usage = _on_gateway(gw, gw.runtime.limits.budgets.usage(SCOPE))
    assert (gw.runtime.limits.in_flight, usage.reserved_tokens_day, usage.in_flight) == (0, 0, 0)


# ---- upstream tiers ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def upstream():
    server = InstantUpstream()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def up_gw(upstream, tmp_path_factory):
    path = tmp_path_factory.mktemp("gw-unfinished-up") / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers: {{up: {{kind: upstream, base_url: "{upstream.base_url}", model: instant}}}}
models: {{m: {{chain: [up]}}}}
{LIMITS % 2}
""")
    gw = RunningGateway(path)
    gw.http = httpx.Client(base_url=gw.base, timeout=60)
    yield gw
    gw.http.close()
    gw.stop()


def _control(upstream: InstantUpstream, **update) -> dict:
    url = upstream.base_url.removesuffix("/v1") + "/__control"
    return (httpx.post(url, json=update) if update else httpx.get(url)).json()


def _reserved_prompt(**body) -> int:
    return prompt_bound(ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **body}))


@pytest.mark.parametrize("mode", ["garbage", "bad_usage"])
def test_an_answer_lost_after_the_upstream_generated_it_is_charged_its_reservation(up_gw, upstream, mode):
    before = _used(up_gw)
    _control(upstream, mode=mode)
    try:
        resp = up_gw.http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 9})
    finally:
        _control(upstream, mode=None)
    assert resp.status_code >= 500
    _settled(up_gw)
    assert _used(up_gw) - before == _reserved_prompt() + 9


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_call_cut_by_the_deadline_is_charged(up_gw, upstream, stream):
    before = _used(up_gw)
    _control(upstream, delay_s=60)           # far past the 2 s deadline
    try:
        resp = up_gw.http.post("/v1/chat/completions",
                               json={"model": "m", "messages": MSG, "max_tokens": 9, "stream": stream})
    finally:
        _control(upstream, delay_s=0)
    assert resp.status_code == 504 and resp.json()["error"]["code"] == "deadline_exceeded"
    _settled(up_gw)
    # A whole answer may have been generated in full; a stream had sent no token yet.
    assert _used(up_gw) - before == _reserved_prompt() + (0 if stream else 9)


def test_without_max_tokens_the_upstream_is_sent_the_reserved_bound(up_gw, upstream):
    before = _used(up_gw)
    resp = up_gw.http.post("/v1/chat/completions", json={"model": "m", "messages": MSG})
    assert resp.status_code == 200
    assert _control(upstream)["last_body"]["max_tokens"] == DEFAULT_OUTPUT_BOUND
    _settled(up_gw)
    assert _used(up_gw) - before == 2 + ANSWER_WORDS        # what the upstream reported
    # The client's own body is what a later call of the same request would get: nothing leaks.
    resp = up_gw.http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 3})
    assert resp.status_code == 200 and _control(upstream)["last_body"]["max_tokens"] == 3


# ---- embedded tiers ---------------------------------------------------------------------------
class StepGate:
    """Holds an engine before its step number `steps + 1` until released: the engine has then
    generated at most `steps` tokens per request, however fast the machine is."""

    def __init__(self, llm, steps: int):
        self.llm, self.left = llm, steps
        self.reached, self.released = threading.Event(), threading.Event()
        self._step = llm.step
        llm.step = self._gated

    def _gated(self):
        if self.left <= 0:
            self.reached.set()
            self.released.wait(120)
        self.left -= 1
        return self._step()

    def close(self) -> None:
        self.released.set()
        del self.llm.step            # the class's own step again


@pytest.fixture(scope="module")
def tiny_gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("gw-unfinished-tiny")
    write_tiny_checkpoint(root / "tiny", max_position_embeddings=1024)
    path = root / "gateway.yaml"
    path.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  tiny: {{model: '{root / "tiny"}', dtype: float32, max_model_len: 1024, kv_cache_memory: 8MiB, max_num_seqs: 4,
          max_num_batched_tokens: 1024}}
models: {{tiny: {{chain: [tiny]}}}}
{LIMITS % 5}
""")
    gw = RunningGateway(path)
    yield gw
    gw.stop()


TINY_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "w5 w6 w7 w8"}], "max_tokens": 500,
             "temperature": 0, "ignore_eos": True}
STEPS = 3


def _tiny_prompt_tokens(gw: RunningGateway) -> int:
    body = ChatCompletionRequest.model_validate(TINY_BODY)
    return gw.runtime.tiers["tiny"].count_prompt_tokens(TierCall(RequestContext("count", "chat"), body, "tiny"))


def _charged_completion(gw: RunningGateway, before: int) -> int:
    _settled(gw)
    completion = _used(gw) - before - _tiny_prompt_tokens(gw)
    assert 1 <= completion <= STEPS, completion      # what the engine generated before it was held
    return completion


def test_an_embedded_answer_whose_client_left_is_charged_what_was_generated(tiny_gw):
    before = _used(tiny_gw)
    gate = StepGate(tiny_gw.runtime.tiers["tiny"].engine.engine, STEPS)
    try:
        payload = json.dumps(TINY_BODY).encode()
        with socket.create_connection(("127.0.0.1", tiny_gw.port), timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
            assert gate.reached.wait(120), "the engine never reached the held step"
        # The client is gone while the engine is held: the request ends without its answer.
        _charged_completion(tiny_gw, before)
    finally:
        gate.close()


def test_an_embedded_answer_cut_by_the_deadline_is_charged_what_was_generated(tiny_gw):
    before = _used(tiny_gw)
    gate = StepGate(tiny_gw.runtime.tiers["tiny"].engine.engine, STEPS)
    try:
        resp = httpx.post(f"{tiny_gw.base}/v1/chat/completions", json=TINY_BODY, timeout=60)
        assert resp.status_code == 504 and resp.json()["error"]["code"] == "deadline_exceeded"
        # The 5 s deadline leaves the engine ample time for its first steps (each takes ms).
        assert gate.reached.is_set(), "the deadline passed before the engine's first steps"
        _charged_completion(tiny_gw, before)
    finally:
        gate.close()
