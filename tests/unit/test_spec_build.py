"""Draft models are checked when the engine starts: one clear error, no engine."""

from __future__ import annotations

import pytest

from engines.engine_config import EngineConfig
from engines.errors import ModelLoadError
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.spec.config import SpeculativeConfig
from tests.tiny_models import write_tiny_checkpoint


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-build")
    write_tiny_checkpoint(root / "target", seed=0)
    write_tiny_checkpoint(root / "other-vocab", seed=1, vocab_size=96)
    write_tiny_checkpoint(root / "short", seed=2, max_position_embeddings=64)
    return root


def _start(paths, **spec):
    return LLMEngine(load_model(paths / "target", "float32"),
                     EngineConfig(kv_cache_memory_bytes=2**20, speculative=SpeculativeConfig(**spec)))


def test_a_draft_with_another_vocabulary_is_refused(paths):
    with pytest.raises(ModelLoadError, match="does not share the target's tokenizer"):
        _start(paths, method="draft", draft_model=str(paths / "other-vocab"))


def test_a_draft_with_a_shorter_context_is_refused(paths):
    with pytest.raises(ModelLoadError, match="positions"):
        _start(paths, method="draft", draft_model=str(paths / "short"))


def test_self_draft_quantization_must_be_built_in(paths):
    with pytest.raises(ModelLoadError, match="tiergate quantize"):
        _start(paths, method="self", draft_quantization="int4-awq")


def test_a_self_draft_of_an_already_quantized_target_is_refused(paths, tmp_path):
    from engines.quantization.build import quantize_to_dir

    artifact = quantize_to_dir(str(paths / "target"), "int4-rtn", 32, tmp_path / "int4")
    with pytest.raises(ModelLoadError, match="unquantized target"):
        LLMEngine(load_model(artifact, "float32"),
                  EngineConfig(kv_cache_memory_bytes=2**20, speculative=SpeculativeConfig(method="self")))


def test_the_draft_pool_shares_the_memory_budget(paths):
    plain = LLMEngine(load_model(paths / "target", "float32"), EngineConfig(kv_cache_memory_bytes=2**20))
    spec = _start(paths, method="draft", draft_model=str(paths / "target"), draft_kv_cache_dtype=None)
    assert spec.speculator.source.pool.num_blocks == spec.pool.num_blocks == plain.pool.num_blocks // 2
    assert spec.pool.nbytes + spec.speculator.source.pool.nbytes <= 2**20


def test_bad_settings_fail_at_config_time():
    with pytest.raises(ValueError, match="draft_group_size"):
        SpeculativeConfig(method="self", draft_group_size=48)
    with pytest.raises(ValueError, match="max_batch"):
        SpeculativeConfig(method="ngram", max_batch=0)
