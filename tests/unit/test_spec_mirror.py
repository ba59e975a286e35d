"""The self-draft's pool holds the target's own K/V for every position the target computed
(prefill chunks included), stored at the draft's KV precision."""

from __future__ import annotations

import pytest
import torch

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig
from engines.spec.kv_mirror import MirroredAttention
from tests.tiny_models import write_tiny_checkpoint

# head dim 64 (the int8 KV kernels' size), two KV heads
TINY = {"hidden_size": 128, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-mirror")
    write_tiny_checkpoint(path, seed=3, **TINY)
    return load_model(path, "float32")


def _prefill(loaded, kv_dtype):
    spec = SpeculativeConfig(method="self", draft_kv_cache_dtype=kv_dtype)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=2**20, max_num_batched_tokens=16,
                                            max_num_seqs=4, speculative=spec))
    assert isinstance(engine.runner.attn, MirroredAttention)
    engine.add_request("a", list(range(3, 40)), SamplingParams(max_tokens=8, temperature=0))
    seq = engine._requests["a"].seq
    while seq.num_computed_tokens < 37:            # three prefill chunks of at most 16 tokens
        engine.step()
    return engine, seq


def _tokens(pool, table, n):
    """[layers, kv_heads, n, head_dim] K of the first n positions, dequantized where needed."""
    bs = pool.block_size
    k = torch.cat([pool.k[:, :, b].reshape(pool.k.shape[0], pool.k.shape[1], -1, bs).transpose(-1, -2)
                   for b in table], dim=2)[:, :, :n].float()
    if pool.k_scale is not None:
        k = k * torch.cat([pool.k_scale[:, :, b] for b in table], dim=2)[:, :, :n, None].float()
    return k


def test_target_kv_is_mirrored_exactly_at_the_same_precision(tiny):
    engine, seq = _prefill(tiny, None)
    draft = engine.speculator.source.pool
    assert draft.dtype == engine.pool.dtype == torch.float32
    assert torch.equal(_tokens(draft, seq.block_table, 37), _tokens(engine.pool, seq.block_table, 37))


def test_target_kv_is_mirrored_at_int8(tiny):
    engine, seq = _prefill(tiny, "int8")
    draft = engine.speculator.source.pool
    assert draft.dtype == torch.int8
    ref = _tokens(engine.pool, seq.block_table, 37)
    got = _tokens(draft, seq.block_table, 37)
    err = (got - ref).abs().amax(dim=-1)                              # per (layer, head, token)
    assert bool((err <= ref.abs().amax(dim=-1) / 127 * 0.51 + 1e-6).all())   # half an int8 step
