"""The fused decoder (every layer in one C++ call) computes what the Python layers compute, bit
for bit: same tokens and logits with bf16 or int8 KV, fp32 or bf16 activations, Q4 and Q8
block linears; it leaves the steps of a dense prefill copy's size to the Python layers, and a
model that is not block-quantized has none. A tiny random Llama with SmolLM2's head size."""

from __future__ import annotations

import pytest
import torch

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.model.fused_decoder import attach_fused_decoder
from engines.quantization.build import quantize_loaded
from engines.quantization.dense_prefill import attach_dense_prefill
from engines.quantization.w4a8 import BlockQ8Linear
from engines.sampling_params import SamplingParams
from tests.tiny_models import write_tiny_checkpoint

PROMPTS = [[5, 9, 13, 40, 7, 7, 21], [3, 4], [11 + i for i in range(37)]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-fused")
    # head dim 64, 2 query heads per KV head: a shape the C++ quantized-KV attention takes
    write_tiny_checkpoint(path, seed=8, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=96, initializer_range=0.1)
    return path


def _block_model(tiny_dir, dtype: str):
    loaded = load_model(tiny_dir, dtype)
    quantize_loaded(loaded, "w4a8", 32)
    # One Q8 block linear among the Q4 ones, as some GGUF tensors come.
    attn = loaded.model.layers[1].self_attn
    attn.o_proj = BlockQ8Linear.from_weight(attn.o_proj.dequantized(), attn.o_proj.bias)
    attach_fused_decoder(loaded.model)
    return loaded


def _generate(loaded, kv_dtype: str | None, fused: bool):
    model = loaded.model
    saved = model.fused_decoder
    if not fused:
        model.fused_decoder = None
    try:
        engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=4 * 2**20, max_num_seqs=4,
                                                max_num_batched_tokens=32, kv_cache_dtype=kv_dtype))
        tokens = engine.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks       # nothing leaked
        return tokens, engine
    finally:
        model.fused_decoder = saved


@pytest.mark.parametrize("kv_dtype", [None, "int8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layers_compute_the_python_layers_tokens(tiny_dir, dtype, kv_dtype):
    loaded = _block_model(tiny_dir, dtype)
    fused = loaded.model.fused_decoder
    assert fused is not None and [kinds[1] for _, kinds, *_ in fused.layers] == [4, 8]
    want, unfused = _generate(loaded, kv_dtype, fused=False)
    got, engine = _generate(loaded, kv_dtype, fused=True)
    assert fused.takes(engine.runner.attn, 32)        # chunks and decode steps both took it
    assert got == want
    # Every layer's K and V of every token, as the pool holds them: the same bits.
    assert torch.equal(engine.pool.k, unfused.pool.k) and torch.equal(engine.pool.v, unfused.pool.v)


def test_steps_a_dense_copy_serves_take_the_python_layers(tiny_dir):
    loaded = _block_model(tiny_dir, "bfloat16")
    attach_dense_prefill(loaded.model, torch.bfloat16, 8)
    fused = loaded.model.fused_decoder
    assert fused is not None and fused.dense_from == 8
    got, engine = _generate(loaded, None, fused=True)
    assert fused.takes(engine.runner.attn, 7) and not fused.takes(engine.runner.attn, 8)
    unfused, _ = _generate(loaded, None, fused=False)
    assert got == unfused                          # the 8-row-and-more steps went dense in both


def test_a_model_that_is_not_block_quantized_has_no_fused_decoder(tiny_dir):
    assert load_model(tiny_dir, "float32").model.fused_decoder is None
    loaded = load_model(tiny_dir, "float32")
    quantize_loaded(loaded, "int8", 32)                 # torch int8 linears: the Python layers
    assert loaded.model.fused_decoder is None
