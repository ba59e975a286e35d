"""The async API: concurrent streams, aborts on early exit, a free event loop."""

from __future__ import annotations

import asyncio
import time

import pytest

from engines.async_engine import AsyncEngine
from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.sampling_params import InvalidRequestError, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture
def async_engine(real_fp32):
    engine = AsyncEngine(LLMEngine(real_fp32, EngineConfig(kv_cache_memory_bytes=64 * 2**20)))
    yield engine
    engine.shutdown()


def _prompt(loaded, text):
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": text}]))


async def _collect(engine, rid, prompt, params):
    text, outs = "", []
    async for out in engine.generate(rid, prompt, params):
        text += out.text
        outs.append(out)
    return text, outs


async def test_concurrent_streams_and_a_free_event_loop(async_engine, real_fp32):
    """The engine steps off the event loop: during a step the loop still runs its callbacks.

    No wall-clock rate is asserted (how many ticks fit in a step depends on the machine and its
    load). Instead each of the first steps waits, inside the engine thread, for a callback it
    schedules on the loop: were the step run on the loop (or the loop blocked for the step),
    that callback could not run until the step returned, and the wait would time out."""
    import threading

    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    engine = async_engine.engine
    real_step = engine.step
    seen = {"steps": 0, "loop_ran_mid_step": 0, "on_loop_thread": 0}

    def step():
        seen["steps"] += 1
        seen["on_loop_thread"] += threading.get_ident() == loop_thread
        if seen["steps"] <= 3:
            ran = threading.Event()
            loop.call_soon_threadsafe(ran.set)
            seen["loop_ran_mid_step"] += ran.wait(timeout=60)   # generous: a loaded machine is slow, not stuck
        return real_step()

    engine.step = step
    try:
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
        results = await asyncio.gather(*[
            _collect(async_engine, f"r{i}", _prompt(real_fp32, q), params)
            for i, q in enumerate(["What is the capital of France?", "Name a fruit.", "Count to five."])])
    finally:
        engine.step = real_step
    assert "Paris" in results[0][0]
    for _, outs in results:
        assert len(outs) == 16 and outs[-1].finished and outs[-1].finish_reason == "length"
    assert seen["steps"] >= 16 and seen["on_loop_thread"] == 0
    assert seen["loop_ran_mid_step"] == 3, "the event loop did not run while the engine was stepping"


async def test_leaving_the_stream_aborts_and_frees_blocks(async_engine, real_fp32):
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    got = 0
    async for _ in async_engine.generate("long", _prompt(real_fp32, "Tell me a long story."), params):
        got += 1
        if got == 3:
            break
    bm = async_engine.engine.block_manager
    deadline = time.monotonic() + 60         # the abort lands before the next step, however slow steps are
    while time.monotonic() < deadline:
        if bm.num_free_blocks == bm.num_blocks and not async_engine.engine.has_unfinished():
            break
        await asyncio.sleep(0.01)
    assert bm.num_free_blocks == bm.num_blocks
    assert not async_engine.engine.has_unfinished()


async def test_bad_request_fails_alone(async_engine, real_fp32):
    with pytest.raises(InvalidRequestError):
        async for _ in async_engine.generate("bad", [], SamplingParams()):
            pass
    text, outs = await _collect(async_engine, "good", _prompt(real_fp32, "Say hi."),
                                SamplingParams(max_tokens=4, temperature=0))
    assert outs[-1].finished
