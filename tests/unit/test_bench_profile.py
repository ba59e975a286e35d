"""`bench profile`'s exclusive timers on a tiny Llama: every part of a decode step is counted
once (the parts add up to the step), the instrumented engine computes the same tokens, and the
wrappers are gone afterwards."""

from __future__ import annotations

import random

import pytest

from bench.engine.profile import CATEGORIES, ExclusiveTimers, instrumented, profile_batch
from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.model import llama as llama_module
from engines.sampling_params import SamplingParams
from kernels.fused import rope_split_qkv
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-profile")
    write_tiny_checkpoint(path, seed=5)
    return load_model(path, "float32")


def _prompts(n: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(5 + 3 * i)] for i in range(n)]


def test_nested_time_is_counted_once():
    timers = ExclusiveTimers()
    timers.on = True
    inner = timers.wrap(lambda: sum(range(20000)), "inner")
    outer = timers.wrap(lambda: [inner() for _ in range(3)], "outer")
    outer()
    assert timers.totals["inner"] > 0 and timers.totals["outer"] > 0
    timers.reset()
    timers.on = False
    outer()
    assert not timers.totals                 # off: nothing is timed


def test_parts_add_up_to_the_step_and_tokens_are_unchanged(tiny):
    def engine():
        return LLMEngine(tiny, EngineConfig(kv_cache_memory_bytes=8 * 2**20, max_num_seqs=4,
                                            max_num_batched_tokens=64))

    params = SamplingParams(max_tokens=6, temperature=0)
    expected = engine().generate(_prompts(4), params)
    eng, timers = engine(), ExclusiveTimers()
    with instrumented(eng, timers):
        assert eng.generate(_prompts(4), params) == expected
        result = profile_batch(eng, _prompts(4), 4, timers)
    assert result["batch"] == 4 and set(result["ms_per_step"]) == set(CATEGORIES)
    for part in ("gemm", "attention", "norm", "rope", "head", "sample", "emit", "schedule"):
        assert result["ms_per_step"][part] > 0, part
    # the step is the root: the parts cover it (the loop around it adds only perf_counter calls)
    assert sum(result["share"].values()) == pytest.approx(1.0, abs=0.1)
    assert not any(n in vars(eng) for n in ("step", "_schedule", "_emit")) and "apply" not in vars(eng.runner)
    assert llama_module.rope_split_qkv is rope_split_qkv              # the model's rope is its own again
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
