"""Our Llama equals transformers' on tiny random checkpoints (same code path as the real model)."""

from __future__ import annotations

import pytest
import torch

from engines.attention.contiguous import ContiguousAttention
from engines.loaded_model import load_model
from tests.tiny_models import TINY_VOCAB, write_tiny_checkpoint

VARIANTS = {
    "untied": {},
    "tied": {"tie_word_embeddings": True},
    "mha": {"num_key_value_heads": 4},
    "llama3-rope": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
    "linear-rope": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    "bias": {"attention_bias": True, "mlp_bias": True},
}


def _ours_logits(model, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Run `ids` through our model in the given chunk sizes; return logits of every position."""
    attn = ContiguousAttention(model.config, ids.numel(), model.dtype)
    out, start = [], 0
    for size in chunks:
        attn.begin_step(start, size)
        hidden = model(ids[start:start + size], torch.arange(start, start + size), attn)
        out.append(model.compute_logits(hidden))
        start += size
    return torch.cat(out)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
    ref = write_tiny_checkpoint(tmp_path, **VARIANTS[variant])
    ours = load_model(tmp_path, "float32").model
    ids = torch.randint(0, TINY_VOCAB, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids.unsqueeze(0)).logits[0]
    got = _ours_logits(ours, ids, [40])
    assert (got - expected).abs().max() < 1e-4


def test_incremental_decode_and_chunked_prefill_match_full_prefill(tmp_path):
    write_tiny_checkpoint(tmp_path, num_key_value_heads=2)
    model = load_model(tmp_path, "float32").model
    ids = torch.randint(0, TINY_VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    full = _ours_logits(model, ids, [30])
    stepwise = _ours_logits(model, ids, [12, 7, 1, 1, 9])
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)


def test_sharded_checkpoint_loads_identically(tmp_path):
    write_tiny_checkpoint(tmp_path / "one", seed=3)
    write_tiny_checkpoint(tmp_path / "sharded", seed=3, max_shard_size="60KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    a = load_model(tmp_path / "one", "float32").model
    b = load_model(tmp_path / "sharded", "float32").model
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name


def test_bf16_close_to_fp32(tmp_path):
    write_tiny_checkpoint(tmp_path)
    fp32 = load_model(tmp_path, "float32").model
    bf16 = load_model(tmp_path, "bfloat16").model
    assert bf16.embed_tokens.weight.dtype == torch.bfloat16
    ids = torch.randint(0, TINY_VOCAB, (24,), generator=torch.Generator().manual_seed(4))
    diff = (_ours_logits(bf16, ids, [24]) - _ours_logits(fp32, ids, [24])).abs().max()
    assert diff < 0.1
