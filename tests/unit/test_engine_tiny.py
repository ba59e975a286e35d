"""The batching engine and its async face on a tiny random Llama in fp32 (the same code path as
the real model, in a fraction of a second): batched == alone, preemption keeps outputs, aborts
free blocks at once, prefix-cache hits, and the engine steps off the event loop. The real
model runs the same checks in tests/integration/test_engine.py and test_async_engine.py
(`make test-slow`)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from bench.routing.scoring import final_hidden
from engines.async_engine import AsyncEngine
from engines.engine_config import EngineConfig
from engines.kv_cache import KVPool
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.simple_generate import SimpleSampling, generate_tokens
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-engine")
    write_tiny_checkpoint(path, seed=7, initializer_range=0.2)
    return load_model(path, "float32")


def _prompts():
    rng = random.Random(3)
    lengths = [1, 3, 7, 15, 16, 17, 31, 40, 64, 90]          # around block edges; one is chunked
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def reference(tiny):
    """Each prompt generated alone by the single-sequence path (greedy)."""
    eos = tiny.tokenizer.eos_token_ids
    return [list(generate_tokens(tiny.model, p, SimpleSampling(max_tokens=MAX_TOKENS), eos)) for p in _prompts()]


def _engine(loaded, **overrides) -> LLMEngine:
    cfg = dict(kv_cache_memory_bytes=2**20, max_num_batched_tokens=64, max_num_seqs=16)
    cfg.update(overrides)
    return LLMEngine(loaded, EngineConfig(**cfg))


def _assert_no_leak(engine: LLMEngine) -> None:
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prompts_together_equal_each_alone(tiny, reference):
    engine = _engine(tiny)
    outputs = engine.generate(_prompts(), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert outputs == reference
    assert any(len(o) == MAX_TOKENS for o in outputs)
    assert engine.stats.preemptions == 0
    _assert_no_leak(engine)


def test_preemption_under_a_small_pool_keeps_outputs_identical(tiny, reference):
    per_block = KVPool.bytes_per_block(tiny.config, 16, torch.float32)
    engine = _engine(tiny, kv_cache_memory_bytes=per_block * 12, headroom_fraction=0.0)
    outputs = engine.generate(_prompts(), SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert engine.stats.preemptions > 0
    assert outputs == reference
    _assert_no_leak(engine)


def test_a_request_holding_every_seat_gives_one_to_a_newcomer_and_keeps_its_outputs(tiny):
    """Four choices of one request fill the engine's four seats with long answers; a second
    request's first choice takes the last choice's seat and finishes first, and every output
    is what it would have been alone (the preempted choice is recomputed)."""
    prompts = _prompts()
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    short = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine = _engine(tiny, max_num_seqs=4)
    for rank in range(4):
        engine.add_request(f"big-{rank}", prompts[rank + 1], long, rank=rank)
    finished: list[str] = []
    tokens: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        if steps == 4:
            engine.add_request("other", prompts[0], short)
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                finished.append(out.request_id)
    assert finished[0] == "other"
    assert engine.stats.preemptions >= 1
    alone = _engine(tiny)
    assert tokens["other"] == alone.generate([prompts[0]], short)[0]
    assert [tokens[f"big-{r}"] for r in range(4)] == alone.generate(prompts[1:5], long)
    _assert_no_leak(engine)


def test_aborts_free_blocks_at_once(tiny):
    engine = _engine(tiny)
    for i, p in enumerate(_prompts()[:6]):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=50, temperature=0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.block_manager.num_used_blocks > 0
    for i in range(0, 6, 2):
        out = engine.abort_request(f"r{i}")
        assert out.finished and out.finish_reason == "abort"
    engine.block_manager.check_invariants([engine._requests[f"r{i}"].seq for i in (1, 3, 5)])
    assert engine.abort_request("r0") is None
    while engine.has_unfinished():
        engine.step()
    _assert_no_leak(engine)


def test_a_shared_prefix_hits_the_cache_and_changes_nothing(tiny):
    rng = random.Random(8)
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(50)]
    first, second = shared + [5, 6], shared + [9, 10, 11]
    params = SamplingParams(max_tokens=6, temperature=0)
    engine = _engine(tiny)
    engine.generate([first], params)
    engine.add_request("second", second, params)
    outs = []
    while engine.has_unfinished():
        outs.extend(engine.step())
    assert outs[-1].cached_tokens == 48                       # every full block of the shared prefix
    cold = _engine(tiny, enable_prefix_caching=False).generate([second], params)[0]
    assert [t for o in outs for t in o.token_ids] == cold
    _assert_no_leak(engine)


def test_prompt_hidden_comes_with_the_first_token_only_chunked_cached_or_batched(tiny):
    """What a router reads from the prefill: the last prompt token's final hidden state, equal to
    a plain forward over the prompt, whether the prefill was chunked (90 tokens, 64 a step), ran
    beside other requests, or started from a cached prefix; later deltas and requests that did
    not ask carry none."""
    rng = random.Random(11)
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(50)]
    prompts = {"long": [rng.randrange(3, TINY_VOCAB) for _ in range(90)], "short": [7, 8, 9],
               "first": shared + [5, 6], "cached": shared + [9, 10, 11]}
    engine = _engine(tiny)
    asked = SamplingParams(max_tokens=4, temperature=0, prompt_hidden=True)
    engine.generate([prompts["first"]], SamplingParams(max_tokens=2, temperature=0))
    for name in ("long", "short", "cached"):
        engine.add_request(name, prompts[name], asked)
    engine.add_request("plain", [4, 5, 6], SamplingParams(max_tokens=4, temperature=0))
    deltas: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            deltas.setdefault(out.request_id, []).append(out)
    assert deltas["cached"][0].cached_tokens == 48
    for name in ("long", "short", "cached"):
        first, *rest = deltas[name]
        expected = final_hidden(tiny.model, prompts[name])[-1]
        assert first.prompt_hidden is not None and len(first.prompt_hidden) == tiny.config.hidden_size
        torch.testing.assert_close(torch.tensor(first.prompt_hidden), expected, atol=1e-4, rtol=1e-4)
        assert rest and all(d.prompt_hidden is None for d in rest)
    assert all(d.prompt_hidden is None for d in deltas["plain"])
    _assert_no_leak(engine)


def test_prompt_hidden_rows_back_from_the_last_token_survive_chunks_and_cached_prefixes(tiny):
    """Rows before the last prompt token (the end of the user's text in a chat template) come
    concatenated after it, equal to a plain forward: from an earlier prefill chunk (row 61 of a
    67-token prompt computed 64 a step), and from a prompt whose cached prefix would have covered
    that row (the hit stops a block short, so the row is computed again)."""
    rng = random.Random(12)
    shared = [rng.randrange(3, TINY_VOCAB) for _ in range(50)]
    prompts = {"long": [rng.randrange(3, TINY_VOCAB) for _ in range(67)], "short": [7, 8, 9],
               "cached": shared + [9, 10, 11]}
    engine = _engine(tiny)
    engine.generate([shared + [5, 6]], SamplingParams(max_tokens=2, temperature=0))
    asked = SamplingParams(max_tokens=3, temperature=0, prompt_hidden=True, prompt_hidden_rows=(0, 5))
    for name in prompts:
        engine.add_request(name, prompts[name], asked)
    firsts = {}
    while engine.has_unfinished():
        for out in engine.step():
            firsts.setdefault(out.request_id, out)
    # 53 tokens: row 47 (5 back) lies in the third cached block, so only two blocks are reused.
    assert firsts["cached"].cached_tokens == 32
    for name, ids in prompts.items():
        rows = final_hidden(tiny.model, ids)
        expected = torch.cat([rows[-1], rows[max(0, len(ids) - 6)]])
        torch.testing.assert_close(torch.tensor(firsts[name].prompt_hidden), expected, atol=1e-4, rtol=1e-4)
    _assert_no_leak(engine)


@pytest.mark.parametrize("rows", [(), (0, 0), (32,), (-1,), (0, 1, 2, 3, 4)])
def test_prompt_hidden_rows_are_bounded(rows):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(prompt_hidden=True, prompt_hidden_rows=rows).validate()
    assert err.value.param == "prompt_hidden_rows"


async def test_async_streams_equal_the_engine_and_step_off_the_loop(tiny, reference):
    """Concurrent streams give each prompt's tokens alone; during a step the event loop still
    runs (checked by a callback the step waits for, not by counting ticks in a time span)."""
    async_engine = AsyncEngine(_engine(tiny))
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()
    real_step = async_engine.engine.step
    seen = {"steps": 0, "on_loop_thread": 0, "loop_ran_mid_step": 0}

    def step():
        seen["steps"] += 1
        seen["on_loop_thread"] += threading.get_ident() == loop_thread
        if seen["steps"] <= 3:
            ran = threading.Event()
            loop.call_soon_threadsafe(ran.set)
            seen["loop_ran_mid_step"] += ran.wait(timeout=60)
        return real_step()

    async_engine.engine.step = step

    async def collect(rid, prompt):
        return [t async for out in async_engine.generate(rid, prompt, SamplingParams(max_tokens=MAX_TOKENS,
                                                                                     temperature=0))
                for t in out.token_ids]

    try:
        got = await asyncio.gather(*[collect(f"r{i}", p) for i, p in enumerate(_prompts())])
        assert got == reference
        assert seen["on_loop_thread"] == 0 and seen["loop_ran_mid_step"] == 3

        # Leaving a stream early aborts the request and frees its blocks.
        params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
        n = 0
        async for _ in async_engine.generate("long", _prompts()[3], params):
            n += 1
            if n == 3:
                break
        bm = async_engine.engine.block_manager
        deadline = time.monotonic() + 60
        while (bm.num_free_blocks != bm.num_blocks or async_engine.engine.has_unfinished()) \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert bm.num_free_blocks == bm.num_blocks and not async_engine.engine.has_unfinished()

        # A bad request fails alone, in the caller.
        with pytest.raises(InvalidRequestError):
            async for _ in async_engine.generate("bad", [], SamplingParams()):
                pass
        assert await collect("good", _prompts()[0])
    finally:
        async_engine.engine.step = real_step
        async_engine.shutdown()


async def test_an_engine_with_its_own_thread_count_keeps_outputs_and_leaves_others_alone(tiny, reference):
    """`threads=1`: the engine's ops run on one thread, the tokens are the same, and the thread
    count of the caller and of threads started later is untouched."""
    before = torch.get_num_threads()
    async_engine = AsyncEngine(_engine(tiny), threads=1)
    seen: list[int] = []
    real_step = async_engine.engine.step

    def step():
        seen.append(torch.get_num_threads())
        return real_step()

    async_engine.engine.step = step
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
        got = [t async for out in async_engine.generate("r0", _prompts()[3], params) for t in out.token_ids]
        assert got == reference[3]
        assert seen and set(seen) == {1} and async_engine.threads_in_use == 1
        assert torch.get_num_threads() == before
        # a thread that starts its first torch op afterwards (the next tier's loader) keeps the default
        fresh: list[int] = []
        worker = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
        worker.start()
        worker.join()
        assert fresh == [before]
    finally:
        async_engine.shutdown()
    with pytest.raises(ValueError, match="threads"):
        AsyncEngine(_engine(tiny), threads=0)


def test_the_thread_count_is_set_on_torchs_own_openmp_runtime_when_other_wheels_map_theirs():
    """scikit-learn's wheel maps a vendored libgomp of its own; its team size is not torch's."""
    import sklearn.linear_model  # noqa: F401 - maps scikit_learn.libs/libgomp-*.so into the process

    from engines.thread_count import _openmp_runtime, _torch_first, set_thread_count
    _openmp_runtime.cache_clear()        # found afresh, with both runtimes mapped
    torch_dir = str(Path(torch.__file__).resolve().parent)
    other = "/site-packages/scikit_learn.libs/libgomp-e985bcbb.so.1.0.0"
    assert _torch_first([other, torch_dir + "/lib/libgomp.so.1"]) == [torch_dir + "/lib/libgomp.so.1", other]
    done: list[int] = []

    def run() -> None:
        done.append(set_thread_count(1))
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert done == [1]
