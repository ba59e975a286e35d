"""A tier whose engine runs in worker processes (`engine_processes: N`): the same answers as the
in-process engine, requests spread over the workers, limits checked before anything is sent,
aborted requests' KV blocks freed in the worker, a worker that cannot build its engine fails the
start with its reason, a step that raises fails its own requests (and repeated ones make the
engine dead), and a worker that dies makes the engine dead and the tier rebuild it. Real processes (spawned) on a tiny random Llama."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from engines.engine_process import ProcessEngine
from engines.errors import ContextLengthError, EngineDeadError, ModelLoadError, StepFailedError
from engines.grammar import GrammarCompiler
from engines.sampling_params import SamplingParams
from gateway.context import RequestContext
from gateway.schema import CompletionRequest
from gateway.tiers.base import TierCall, TierFailure
from gateway.tiers.embedded import EmbeddedTier
from gateway.tiers.embedded_load import build_worker_engine
from gateway.tiers.engine_restart import RestartPolicy
from policies.tier_config import EmbeddedTierConfig
from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-processes")
    write_tiny_checkpoint(path, seed=11, initializer_range=0.2)
    return path


def _tier(tiny_dir, processes: int, **settings) -> EmbeddedTier:
    config = EmbeddedTierConfig(model=str(tiny_dir), dtype="float32", max_model_len=256, kv_cache_memory="1MiB",
                                max_num_seqs=4, max_num_batched_tokens=64, engine_processes=processes, threads=1,
                                **settings)
    return EmbeddedTier("tiny", config, restart_policy=RestartPolicy(backoff_s=(0.0,)))


def _call(name: str, prompt: list[int], max_tokens: int = 12, stream: bool = False,
          ignore_eos: bool = False) -> TierCall:
    body = CompletionRequest.model_validate({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                                             "temperature": 0, "stream": stream, "ignore_eos": ignore_eos})
    return TierCall(RequestContext(request_id=name, endpoint="completions"), body, "tiny")


async def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


PROMPTS = [[5 + i, 9, 3 * i + 1, 40 - i] for i in range(6)]


def _choice(body: bytes) -> dict:
    choice = json.loads(body)["choices"][0]
    return {"text": choice["text"], "finish_reason": choice["finish_reason"]}


async def test_worker_processes_answer_as_the_in_process_engine(tiny_dir):
    local = _tier(tiny_dir, 0)
    await local.start()
    try:
        want = [_choice((await local.complete(_call(f"l{i}", p))).body) for i, p in enumerate(PROMPTS)]
    finally:
        await local.close()
    tier = _tier(tiny_dir, 2)
    await tier.start()
    assert tier.ready, tier.error
    try:
        engine = tier.engine
        assert engine.workers == 2 and len(set(engine.pids)) == 2 and os.getpid() not in engine.pids
        assert tier.describe()["threads"] == 1
        answers = await asyncio.gather(*(tier.complete(_call(f"p{i}", p)) for i, p in enumerate(PROMPTS)))
        assert [_choice(a.body) for a in answers] == want
        # Both workers computed some of them, and every KV block came back.
        await _until(lambda: engine.stats.kv_blocks_used == 0, "blocks freed")
        assert all(w.stats.generated_tokens > 0 for w in engine._workers)
        assert engine.stats.generated_tokens == sum(w.stats.generated_tokens for w in engine._workers)
        # Streamed, the same text.
        chunks = [c async for c in tier.stream(_call("s0", PROMPTS[0], stream=True))]
        text = "".join(json.loads(c[len(b"data: "):])["choices"][0]["text"]
                       for c in chunks if c.startswith(b"data: {"))
        assert text == want[0]["text"]
    finally:
        await tier.close()
    assert all(not w.process.is_alive() for w in engine._workers)


async def test_a_shared_prefix_goes_back_to_the_worker_that_cached_it(tiny_dir):
    tier = _tier(tiny_dir, 2)
    await tier.start()
    try:
        head = [7 + (i % 50) for i in range(80)]        # five full KV blocks in common
        # Worker 0 busy: the first request goes to worker 1, whose cache then holds its head.
        blocker = asyncio.create_task(tier.complete(_call("busy", PROMPTS[0], max_tokens=150, ignore_eos=True)))
        await _until(lambda: tier.engine._sinks, "worker 0 busy")
        first = await tier.complete(_call("a", head + [3, 4]))
        assert first.usage.cached_tokens == 0
        await blocker
        # Both idle now: least-busy alone would pick worker 0 and miss the cache.
        second = await tier.complete(_call("b", head + [5, 6]))
        assert second.usage.cached_tokens == 80
    finally:
        await tier.close()


async def test_limits_are_checked_here_and_aborts_free_the_workers_blocks(tiny_dir):
    tier = _tier(tiny_dir, 1)
    await tier.start()
    try:
        engine = tier.engine
        with pytest.raises(ContextLengthError):
            async for _ in engine.generate("too-long", [5] * 200, SamplingParams(max_tokens=100)):
                pass
        call = _call("abort-me", PROMPTS[1], max_tokens=200, stream=True, ignore_eos=True)
        stream = tier.stream(call)
        await anext(stream)                           # the request runs in the worker
        await stream.aclose()                         # the client left
        await _until(lambda: engine.stats.kv_blocks_used == 0 and not engine._sinks, "abort applied")
        answer = await tier.complete(_call("after", PROMPTS[2]))   # the worker serves on
        assert _choice(answer.body)["finish_reason"] in ("stop", "length")
    finally:
        await tier.close()


async def test_solo_threads_follow_the_other_tiers_work_and_the_workers_spin(tiny_dir):
    from engines.engine_process import SOLO_SPIN_COUNT
    from gateway.tiers.core_sharing import CoreSharing

    local = _tier(tiny_dir, 0)
    await local.start()
    try:
        want = [_choice((await local.complete(_call(f"l{i}", p))).body) for i, p in enumerate(PROMPTS[:3])]
    finally:
        await local.close()
    tier, neighbour = _tier(tiny_dir, 1, solo_threads=2), _tier(tiny_dir, 1)
    sharing = CoreSharing([tier, neighbour])          # neither started: both told they are alone
    await tier.start()
    try:
        engine = tier.engine
        await _until(lambda: engine.threads_in_use == 2, "two threads while alone")
        environ = open(f"/proc/{engine.pids[0]}/environ", "rb").read().split(b"\0")
        assert f"GOMP_SPINCOUNT={SOLO_SPIN_COUNT}".encode() in environ
        assert os.environ.get("GOMP_SPINCOUNT") is None or os.environ["GOMP_SPINCOUNT"] != str(SOLO_SPIN_COUNT)
        # The answers do not depend on how many threads computed them.
        assert [_choice((await tier.complete(_call(f"a{i}", p))).body) for i, p in enumerate(PROMPTS[:3])] == want
        neighbour.in_flight += 1                      # another tier has work: back to one thread
        await _until(lambda: engine.threads_in_use == 1, "one thread beside a busy tier")
        assert _choice((await tier.complete(_call("beside", PROMPTS[0]))).body) == want[0]
        neighbour.in_flight -= 1
        await _until(lambda: engine.threads_in_use == 2, "two threads again")
        assert tier.describe()["threads"] == 2
    finally:
        sharing.detach()
        await tier.close()


def test_solo_threads_need_engine_processes_and_more_than_threads():
    with pytest.raises(ValueError, match="engine_processes"):
        EmbeddedTierConfig(model="default", threads=1, solo_threads=2)
    with pytest.raises(ValueError, match="above threads"):
        EmbeddedTierConfig(model="default", engine_processes=1, threads=2, solo_threads=2)


async def test_a_worker_that_dies_fails_its_requests_and_the_tier_rebuilds(tiny_dir):
    tier = _tier(tiny_dir, 1)
    await tier.start()
    try:
        engine = tier.engine
        expected = _choice((await tier.complete(_call("before", PROMPTS[3]))).body)
        os.kill(engine.pids[0], signal.SIGSTOP)      # frozen: the next request is surely in flight when it dies
        running = asyncio.create_task(tier.complete(_call("running", PROMPTS[4], max_tokens=240, ignore_eos=True)))
        await _until(lambda: engine._sinks, "request sent")
        released = asyncio.Event()

        async def held(_delay: float) -> None:       # the restart waits here until the test has looked
            await released.wait()

        tier.restarter.sleep = held
        os.kill(engine.pids[0], signal.SIGKILL)
        with pytest.raises(TierFailure) as caught:
            await running
        assert caught.value.error.status >= 500 and caught.value.error.code == "engine_unavailable"
        await _until(lambda: tier.state == "restarting", "restart begun")
        assert tier.unusable_reason() == "engine restarting: an engine process exited"
        released.set()
        await _until(lambda: tier.ready and tier.engine is not engine, "tier rebuilt", timeout=120)
        assert engine.dead and tier.restarter.restarts == 1
        assert _choice((await tier.complete(_call("after", PROMPTS[3]))).body) == expected
    finally:
        await tier.close()


# Recipes for a worker process: module-level, so that they pickle by name.
def _refusing_build():
    raise RuntimeError("no weights here\nsecond line")


def _failing_steps_build(source: str):
    """An engine whose model's forward always raises (a kernel fault, tests/fault_injection.py)."""
    from tests.fault_injection import ForwardFault

    engine = _worker_engine(source)
    ForwardFault(engine.loaded.model, engine).arm(forever=True)
    return engine


def _worker_engine(source: str):
    config = EmbeddedTierConfig(model=source, dtype="float32", max_model_len=256, kv_cache_memory="1MiB",
                                max_num_seqs=4, max_num_batched_tokens=64)
    return build_worker_engine("tiny", config, source, "float32")


def _grammars(tiny_dir) -> GrammarCompiler:
    from engines.loaded_model import load_model
    loaded = load_model(str(tiny_dir), "float32")
    return GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)


def test_a_worker_that_cannot_build_its_engine_fails_the_start_with_its_reason(tiny_dir):
    with pytest.raises(ModelLoadError, match=r"could not build its engine: RuntimeError: no weights here$"):
        ProcessEngine(_refusing_build, _grammars(tiny_dir), threads=1)


async def test_a_failing_step_fails_its_requests_and_repeated_failures_kill_the_engine(tiny_dir):
    import functools

    dead = []
    engine = ProcessEngine(functools.partial(_failing_steps_build, str(tiny_dir)), _grammars(tiny_dir), threads=1,
                           max_step_failures=2, on_dead=dead.append)
    try:
        params = SamplingParams(max_tokens=4, temperature=0)
        with pytest.raises(StepFailedError):
            async for _ in engine.generate("first", PROMPTS[0], params):
                pass
        assert engine.step_failures == 1 and not engine.dead
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("second", PROMPTS[1], params):
                pass
        await _until(lambda: engine.dead, "engine declared dead")
        assert dead == [engine]
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate("third", PROMPTS[2], params):
                pass
    finally:
        engine.shutdown()
