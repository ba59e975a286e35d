"""An embedded tier restarts an engine that died: on the weights it already holds, else by loading
the tier again; bounded (backoff, at most `max_restarts` within a window), then it gives up.
Backoff and the clock are injected: nothing here waits on real time."""

from __future__ import annotations

import asyncio
import time

import pytest

import gateway.tiers.embedded as embedded
from gateway.context import RequestContext
from gateway.schema import CompletionRequest
from gateway.tiers.base import TierCall, TierFailure
from gateway.tiers.embedded import EmbeddedTier
from gateway.tiers.engine_restart import EngineRestarter, RestartPolicy
from policies.tier_config import EmbeddedTierConfig
from tests.fault_injection import FAULT_TEXT, ForwardFault
from tests.tiny_models import write_tiny_checkpoint

DEADLINE_S = 120       # generous: a loaded machine is slow, not stuck


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not true after {DEADLINE_S}s: {what}"
        await asyncio.sleep(0.01)


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_restarts_back_off_are_bounded_per_window_and_then_give_up():
    clock, delays, built, gave_up = _Clock(), [], [], []
    outcomes = iter([RuntimeError("device lost"), "engine-1", "engine-2", "engine-3"])

    def rebuild():
        result = next(outcomes)
        if isinstance(result, Exception):
            raise result
        return result

    async def sleep(delay: float) -> None:
        delays.append(delay)

    restarter = EngineRestarter("t", rebuild, built.append, gave_up.append,
                                RestartPolicy(backoff_s=(1.0, 5.0, 30.0), max_restarts=3, window_s=600),
                                clock=clock, sleep=sleep)
    restarter.start()                                  # a failed attempt, then a new engine
    await _until(lambda: not restarter.running, "first restart done")
    assert built == ["engine-1"] and delays == [1.0, 5.0] and restarter.restarts == 1
    restarter.start()                                  # the third attempt of the window
    await _until(lambda: not restarter.running, "second restart done")
    assert built == ["engine-1", "engine-2"] and delays == [1.0, 5.0, 30.0]
    restarter.start()                                  # past the limit: the tier gives up
    await _until(lambda: not restarter.running, "given up")
    assert built == ["engine-1", "engine-2"] and len(gave_up) == 1 and "3 restarts" in gave_up[0]
    clock.now += 601                                   # a new window: restarts are allowed again
    restarter.start()
    await _until(lambda: not restarter.running, "restart in a new window")
    assert built[-1] == "engine-3" and delays[-1] == 1.0 and restarter.restarts == 3


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-restart")
    write_tiny_checkpoint(path, seed=7, initializer_range=0.2)
    return path


async def _started_tier(tiny_dir) -> EmbeddedTier:
    tier = EmbeddedTier("tiny", EmbeddedTierConfig(model=str(tiny_dir), dtype="float32", max_model_len=256,
                                                  kv_cache_memory="1MiB", max_num_seqs=2, max_num_batched_tokens=64),
                        restart_policy=RestartPolicy(backoff_s=(0.0,)))
    await tier.start()
    assert tier.ready
    return tier


def _call(name: str) -> TierCall:
    body = CompletionRequest.model_validate({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0})
    return TierCall(RequestContext(request_id=name, endpoint="completions"), body, "tiny")


async def _kill(tier: EmbeddedTier) -> None:
    """Steps that keep failing, one request each: each request ends as a 500 tier failure."""
    fault = ForwardFault(tier.loaded.model)
    fault.arm(forever=True)
    engine = tier.engine
    try:
        for i in range(engine.max_step_failures):
            with pytest.raises(TierFailure) as caught:
                await tier.complete(_call(f"r{i}"))
            error = caught.value.error
            assert (error.status, error.type, error.code) == (500, "server_error", "engine_step_failed")
            assert FAULT_TEXT not in error.message and FAULT_TEXT not in str(caught.value)
        assert engine.dead and not tier.ready and "restart" in tier.unusable_reason()
    finally:
        fault.remove()


async def test_a_dead_engine_is_rebuilt_on_the_loaded_weights(tiny_dir):
    tier = await _started_tier(tiny_dir)
    try:
        loaded, dead = tier.loaded, tier.engine
        expected = (await tier.complete(_call("before"))).body
        await _kill(tier)
        await _until(lambda: tier.ready, "tier ready again")
        assert tier.engine is not dead and tier.loaded is loaded and tier.restarter.restarts == 1
        answer = await tier.complete(_call("after"))
        assert answer.body.split(b'"choices"')[1] == expected.split(b'"choices"')[1]
    finally:
        await tier.close()


async def test_when_the_loaded_weights_cannot_serve_the_tier_loads_again(tiny_dir, monkeypatch):
    tier = await _started_tier(tiny_dir)
    try:
        loaded = tier.loaded

        def no_engine(*_args, **_kwargs):
            raise RuntimeError("cannot allocate the KV pool")

        monkeypatch.setattr(embedded, "LLMEngine", no_engine)     # only the fast path uses it
        await _kill(tier)
        await _until(lambda: tier.ready, "tier ready again")
        assert tier.loaded is not loaded and tier.restarter.restarts == 1
        assert (await tier.complete(_call("after"))).usage.completion_tokens == 4
    finally:
        await tier.close()
