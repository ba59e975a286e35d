"""An engine step that raises: its requests fail alone, the engine serves on, no KV block leaks;
steps that keep failing declare the engine dead; through the gateway (real HTTP) a step failure
is a 500 in OpenAI form that the breaker counts and a fallback tier answers, and a dead engine
turns /readyz 503 until the tier has restarted it.

The fault is injected by making the model's forward raise (tests/fault_injection.py): it stands
in for a kernel fault (a CUDA error, a C++ kernel's exception), which reaches the engine the
same way, from inside `LLMEngine.step`.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import httpx
import openai
import pytest

from engines.async_engine import AsyncEngine
from engines.engine_config import EngineConfig
from engines.errors import EngineDeadError, StepFailedError
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from gateway.tiers.engine_restart import RestartPolicy
from tests.fault_injection import ForwardFault
from tests.gateway_harness import RunningGateway
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
DEADLINE_S = 120       # generous: a loaded machine is slow, not stuck


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-faults")
    write_tiny_checkpoint(path, seed=7, initializer_range=0.2)
    return path


@pytest.fixture
def tiny(tiny_dir):
    """Its own copy of the weights per test: a test patches its model's forward."""
    return load_model(tiny_dir, "float32")


def _prompts(n: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(4, 40))] for _ in range(n)]


def _engine(loaded, **overrides) -> LLMEngine:
    cfg = dict(kv_cache_memory_bytes=2**20, max_num_batched_tokens=64, max_num_seqs=2)
    cfg.update(overrides)
    return LLMEngine(loaded, EngineConfig(**cfg))


def _reference(loaded, prompts) -> list[list[int]]:
    return _engine(loaded, max_num_seqs=16).generate(prompts, GREEDY)


async def _tokens(engine: AsyncEngine, rid: str, prompt: list[int]) -> list[int] | BaseException:
    try:
        return [t async for out in engine.generate(rid, prompt, GREEDY) for t in out.token_ids]
    except (StepFailedError, EngineDeadError) as exc:
        return exc


async def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {DEADLINE_S}s: {what}")
        await asyncio.sleep(0.01)


def _assert_no_leak(llm: LLMEngine) -> None:
    bm = llm.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


# ---- the engine -----------------------------------------------------------------------------

async def test_a_failed_step_fails_only_its_requests_and_the_engine_serves_on(tiny):
    prompts = _prompts(7)
    reference = _reference(tiny, prompts)
    llm = _engine(tiny)
    fault = ForwardFault(tiny.model, llm)
    engine = AsyncEngine(llm, max_step_failures=3)
    try:
        # Two steps in a row fail, after two that run: the failing steps hold requests that have
        # KV blocks and tokens already (at most two of them: max_num_seqs=2).
        fault.arm(count=2, after=2)
        got = await asyncio.gather(*[_tokens(engine, f"r{i}", p) for i, p in enumerate(prompts[:5])])
        failed = {f"r{i}" for i, g in enumerate(got) if isinstance(g, BaseException)}
        assert len(fault.failed_steps) == 2 and all(fault.failed_steps)
        assert failed == {rid for step in fault.failed_steps for rid in step}
        assert all(isinstance(g, StepFailedError) for g in got if isinstance(g, BaseException))
        assert all(str(g) and "0xdeadbeef" not in str(g) for g in got if isinstance(g, BaseException))
        survivors = [i for i in range(5) if f"r{i}" not in failed]
        assert survivors, "every request was in a failed step"
        assert [got[i] for i in survivors] == [reference[i] for i in survivors]
        assert not engine.dead and engine.step_failures == 2

        # A request submitted after the failure is answered as if nothing had happened.
        assert await _tokens(engine, "after", prompts[5]) == reference[5]
        await _wait_for(lambda: llm.num_requests == 0, "engine idle")
        _assert_no_leak(llm)

        # The count of failures in a row restarted with that success: two more do not kill it.
        fault.arm(count=2)
        got = await asyncio.gather(*[_tokens(engine, f"s{i}", p) for i, p in enumerate(prompts[:4])])
        assert sum(isinstance(g, StepFailedError) for g in got) >= 2
        assert not engine.dead
        assert await _tokens(engine, "last", prompts[6]) == reference[6]
        await _wait_for(lambda: llm.num_requests == 0, "engine idle")
        _assert_no_leak(llm)
    finally:
        engine.shutdown()
        fault.remove()


async def test_steps_that_keep_failing_declare_the_engine_dead(tiny):
    llm = _engine(tiny, max_num_seqs=1)      # one request per step: each failure takes one
    fault = ForwardFault(tiny.model, llm)
    fault.arm(forever=True)
    died = []
    engine = AsyncEngine(llm, max_step_failures=3, on_dead=died.append)
    try:
        got = await asyncio.gather(*[_tokens(engine, f"r{i}", p) for i, p in enumerate(_prompts(5))])
        kinds = [type(g).__name__ for g in got]
        assert kinds.count("StepFailedError") == 3, kinds      # the three steps' own requests
        assert kinds.count("EngineDeadError") == 2, kinds      # the ones still waiting
        assert engine.dead and died == [engine]
        with pytest.raises(EngineDeadError):
            await anext(engine.generate("late", [5, 6, 7], GREEDY))
    finally:
        engine.shutdown()
        fault.remove()


# ---- through the gateway ----------------------------------------------------------------------

def _gateway_config(tiny_dir) -> str:
    tiny = (f"{{model: '{tiny_dir}', dtype: float32, max_model_len: 256, kv_cache_memory: 2MiB, "
            "max_num_seqs: 4, max_num_batched_tokens: 128}")
    return f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  tiny-a: {tiny}
  tiny-b: {tiny}
  tiny-c: {tiny}
models:
  solo: {{chain: [tiny-c]}}
  pair: {{chain: [tiny-a, tiny-b]}}
limits:
  breakers:
    by_name:
      tiny-a: {{min_calls: 1, failure_rate: 0.5, open_s: 3600}}   # one failure opens it
"""


@pytest.fixture(scope="module")
def gw(tiny_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("faults-gw") / "gateway.yaml"
    path.write_text(_gateway_config(tiny_dir))
    gateway = RunningGateway(path)
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def reference_text(tiny_dir):
    """Greedy text of a prompt straight from an engine on the same weights (same detokenizer)."""
    loaded = load_model(tiny_dir, "float32")

    def answer(prompt: list[int]) -> str:
        llm = _engine(loaded)
        llm.add_request("ref", prompt, GREEDY)
        text = ""
        while llm.has_unfinished():
            text += "".join(out.text for out in llm.step())
        return text
    return answer


def _wait_ready(gw, want: int) -> httpx.Response:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resp = httpx.get(gw.base + "/readyz", timeout=10)
        if resp.status_code == want or time.monotonic() > deadline:
            return resp
        time.sleep(0.05)


def _complete(gw, model: str, prompt: list[int]) -> httpx.Response:
    return httpx.post(gw.base + "/v1/completions", timeout=DEADLINE_S,
                      json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})


def _assert_openai_error(resp: httpx.Response, status: int, code: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error" and error["code"] == code and error["message"]
    for internal in ("0xdeadbeef", "Traceback", "RuntimeError", "injected"):
        assert internal not in resp.text


def _breaker_state(gw, tier: str) -> str:
    coro = gw.runtime.limits.breakers.state(tier)
    return asyncio.run_coroutine_threadsafe(coro, gw.server_loop()).result(timeout=30).state


def test_a_step_failure_is_a_500_the_breaker_counts_and_a_fallback_answers(gw, reference_text):
    assert _wait_ready(gw, 200).status_code == 200
    prompt = _prompts(1, seed=11)[0]
    expected = reference_text(prompt)
    tier = gw.runtime.tiers["tiny-c"]
    fault = ForwardFault(tier.engine.engine.runner.model)
    try:
        fault.arm(1)
        _assert_openai_error(_complete(gw, "solo", prompt), 500, "engine_step_failed")
        fault.arm(1)       # streamed: the failure comes before the first byte, so still a 500
        client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            list(client.completions.create(model="solo", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           stream=True))
        assert caught.value.status_code == 500 and caught.value.body["code"] == "engine_step_failed"
    finally:
        fault.remove()
    resp = _complete(gw, "solo", prompt)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == expected
    llm = tier.engine.engine
    deadline = time.monotonic() + DEADLINE_S
    while llm.block_manager.num_free_blocks != llm.block_manager.num_blocks and time.monotonic() < deadline:
        time.sleep(0.01)
    _assert_no_leak(llm)
    assert tier.ready and httpx.get(gw.base + "/readyz", timeout=10).status_code == 200

    # On a chain, the failed tier is passed for the next one, and its breaker counted it.
    first = gw.runtime.tiers["tiny-a"]
    fault = ForwardFault(first.engine.engine.runner.model)
    try:
        fault.arm(1)
        resp = _complete(gw, "pair", prompt)
    finally:
        fault.remove()
    assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "tiny-b"
    assert resp.json()["choices"][0]["text"] == expected
    assert _breaker_state(gw, "tiny-a") == "open"
    assert _complete(gw, "pair", prompt).headers["x-tiergate-tier"] == "tiny-b"   # skipped: open


def test_a_step_failure_after_tokens_went_out_ends_the_stream_with_its_own_code(gw):
    """Nothing can fall back once bytes were sent: the stream's last event is the error, with
    the code a whole answer would have had (engine_step_failed), not a generic one."""
    assert _wait_ready(gw, 200).status_code == 200
    tier = gw.runtime.tiers["tiny-c"]
    fault = ForwardFault(tier.engine.engine.runner.model)
    try:
        fault.arm(1, after=3)          # the prefill and two decode steps answer, the next one fails
        body = {"model": "solo", "prompt": [5, 6, 7], "max_tokens": 40, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", gw.base + "/v1/completions", json=body, timeout=DEADLINE_S) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    finally:
        fault.remove()
    assert any("choices" in event for event in events[:-1])
    error = json.loads(events[-1])["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_step_failed"), error
    assert "0xdeadbeef" not in events[-1]
    assert _complete(gw, "solo", [5, 6, 7]).status_code == 200     # and the engine serves on


def test_a_dead_engine_is_not_ready_until_its_tier_restarts_it(gw, reference_text):
    assert _wait_ready(gw, 200).status_code == 200
    prompt = _prompts(1, seed=12)[0]
    expected = reference_text(prompt)
    tier = gw.runtime.tiers["tiny-c"]
    dead_engine = tier.engine
    released = threading.Event()

    async def held(_delay: float) -> None:     # the restart waits here until the test has looked
        await asyncio.to_thread(released.wait, DEADLINE_S)

    tier.restarter.policy = RestartPolicy(backoff_s=(0.0,), max_restarts=3)
    tier.restarter.sleep = held
    fault = ForwardFault(tier.engine.engine.runner.model)
    try:
        fault.arm(forever=True)
        for _ in range(dead_engine.max_step_failures):
            _assert_openai_error(_complete(gw, "solo", prompt), 500, "engine_step_failed")
        assert dead_engine.dead
        resp = httpx.get(gw.base + "/readyz", timeout=10)
        assert resp.status_code == 503 and list(resp.json()["not_ready"]) == ["tiny-c"]
        assert "repeated failures" in resp.json()["not_ready"]["tiny-c"]       # the engine's own reason
        assert resp.json()["tiers"]["tiny-c"]["state"] == "restarting"
        restarting = _complete(gw, "solo", prompt)      # skipped: not ready, but on its way back
        _assert_openai_error(restarting, 503, "no_tier_available")
        assert restarting.headers["retry-after"] == "2" and restarting.headers["retry-after-ms"] == "2000"
        assert "tiny-c still starting" in restarting.json()["error"]["message"]
    finally:
        fault.remove()
        released.set()
    resp = _wait_ready(gw, 200)
    assert resp.status_code == 200, resp.text
    assert tier.engine is not dead_engine and resp.json()["tiers"]["tiny-c"]["restarts"] == 1
    resp = _complete(gw, "solo", prompt)
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == expected
