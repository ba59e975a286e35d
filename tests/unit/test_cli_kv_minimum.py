"""A KV pool too small for the engine's two blocks is the config's error, found before any weight
is loaded: check-config and serve refuse it (exit 2, one line naming tiers.X.kv_cache_memory and
the minimum), generate refuses it before loading, and the engine's own refusal, should it come,
is exit 2 too, never a traceback. The minimum is the engine's: a pool of exactly that many bytes
starts, one byte less does not."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engines.engine_config import EngineConfig
from engines.kv_cache import KVPool
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.model_config import ModelConfig
from gateway.cli import main
from gateway.cli.kv_fit import smallest_pool
from engines.loaders.model_shape import gguf_shape
from policies.tier_config import EmbeddedTierConfig
from tests.tiny_models import tiny_hf_config, write_tiny_checkpoint

# tests/tiny_models.py: 2 layers, 2 KV heads of 64 / 4 = 16 values
TINY_FP32_BLOCK = 2 * 2 * 16 * 2 * 16 * 4        # K and V, layers, tokens, KV heads, head size, bytes


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-kv")
    write_tiny_checkpoint(path, seed=1)
    return path


def _config(tmp_path, model: str, kv: int, dtype: str = "float32", extra: str = "") -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(f"auth: {{enabled: false}}\ntiers:\n  small: {{model: '{model}', dtype: {dtype}, "
                    f"kv_cache_memory: {kv}{extra}}}\n")
    return str(path)


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, (captured.err or captured.out).strip()


def test_the_minimum_is_the_engines(tiny_dir):
    need = smallest_pool(EmbeddedTierConfig(model=str(tiny_dir), dtype="float32", kv_cache_memory=1))
    assert need.bytes == 2 * TINY_FP32_BLOCK
    loaded = load_model(str(tiny_dir), "float32")
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=need.bytes, max_num_seqs=1,
                                            max_num_batched_tokens=64))
    assert engine.pool.num_blocks == 2
    engine.shutdown()
    with pytest.raises(ValueError, match="fewer than 2 blocks"):
        LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=need.bytes - 1, max_num_seqs=1,
                                       max_num_batched_tokens=64))


def test_check_config_refuses_a_pool_below_two_blocks(tmp_path, capsys, tiny_dir):
    code, err = _run(capsys, ["check-config", _config(tmp_path, str(tiny_dir), 2 * TINY_FP32_BLOCK - 1)])
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "tiers.small.kv_cache_memory: " in err and f"minimum of {2 * TINY_FP32_BLOCK} bytes" in err
    code, out = _run(capsys, ["check-config", _config(tmp_path, str(tiny_dir), 2 * TINY_FP32_BLOCK)])
    assert code == 0, out


def test_only_what_no_start_up_choice_fits_is_refused(tiny_dir):
    """dtype auto may pick bfloat16 (half fp32's bytes); a quantized KV dtype is tried first; a
    draft model's blocks come out of the same budget."""
    def need(**settings) -> int:
        return smallest_pool(EmbeddedTierConfig(model=str(tiny_dir), kv_cache_memory=1, **settings)).bytes

    assert need(dtype="auto") == TINY_FP32_BLOCK                               # 2 bf16 blocks
    assert need(dtype="float32", kv_cache_dtype="int8") == 2 * 2 * 2 * 16 * 2 * (16 + 2)   # + fp16 scales
    assert need(dtype="float32", speculative={"method": "draft", "draft_model": str(tiny_dir),
                                              "draft_kv_cache_dtype": None}) == 4 * TINY_FP32_BLOCK
    assert need(dtype="float32", speculative={"method": "ngram"}) == 2 * TINY_FP32_BLOCK


def test_generate_refuses_before_loading(tmp_path, capsys, tiny_dir, monkeypatch):
    from gateway.tiers import embedded_load

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(embedded_load, "load_tier_model", no_load)
    code, err = _run(capsys, ["generate", "--config", _config(tmp_path, str(tiny_dir), 512), "w5"])
    assert code == 2 and len(err.splitlines()) == 1 and "tiers.small.kv_cache_memory: " in err, err


def test_generate_turns_the_engines_refusal_into_exit_2(tmp_path, capsys, tiny_dir, monkeypatch):
    from gateway.cli import start_checks

    # as if the start check had let it through (a dtype measured at start wider than assumed)
    monkeypatch.setattr(start_checks, "check_tier_can_start", lambda *args: None)
    code, err = _run(capsys, ["generate", "--config", _config(tmp_path, str(tiny_dir), 512), "w5"])
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "tier 'small' cannot start its engine" in err and "fewer than 2 blocks" in err


def test_a_gguf_header_gives_the_shape_without_the_weights(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(3)
    writer.add_embedding_length(96)
    writer.add_feed_forward_length(128)
    writer.add_head_count(6)
    writer.add_head_count_kv(2)
    writer.add_context_length(512)
    writer.add_token_list([f"tok{i}" for i in range(300)])       # arrays are skipped, not decoded
    writer.add_token_scores([0.0] * 300)
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_tensor("token_embd.weight", np.zeros((300, 96), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = gguf_shape(path)
    assert (shape.num_hidden_layers, shape.num_key_value_heads, shape.head_dim) == (3, 2, 16)
    assert (shape.architecture, shape.vocab_size, shape.hidden_size) == ("qwen2", 300, 96)


def test_an_hf_directory_is_read_from_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(tiny_hf_config(num_hidden_layers=5).to_dict()))
    need = smallest_pool(EmbeddedTierConfig(model=str(tmp_path), dtype="float32", block_size=8, kv_cache_memory=1))
    cfg = ModelConfig.from_hf(tiny_hf_config(num_hidden_layers=5).to_dict())
    assert need.bytes == 2 * KVPool.bytes_per_block(cfg, 8, torch.float32)
