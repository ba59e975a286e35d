"""`dtype: auto`: the faster candidate, measured on this machine, with its figures.

Which dtype wins depends on the CPU, so the tests assert the choice's consistency (the winner
is the candidate with the smaller measured time) and its plumbing, not a particular winner."""

from __future__ import annotations

import math

import torch

from engines.dtype_choice import CANDIDATES, choose_dtype
from engines.model_config import ModelConfig
from engines.quantization.methods import ARTIFACT_METHODS, LAYER_METHOD_OF, LAYER_METHODS

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)


def _geomean(times: dict[int, float]) -> float:
    return math.prod(times.values()) ** (1 / len(times))


def test_the_winner_is_the_faster_measured_candidate():
    choice = choose_dtype(TINY, torch.device("cpu"), max_batch=8)
    assert set(choice.step_ms) == set(CANDIDATES)
    assert all(set(times) == {1, 8} and all(t > 0 for t in times.values()) for times in choice.step_ms.values())
    assert choice.dtype == min(CANDIDATES, key=lambda name: _geomean(choice.step_ms[name]))
    assert choice.reason.startswith(choice.dtype)


def test_quantized_weights_are_timed_with_their_own_kernel():
    for method in ("int8", "int4-awq"):
        choice = choose_dtype(TINY, torch.device("cpu"), method, 32, max_batch=1)
        assert choice.dtype in CANDIDATES and set(choice.step_ms[choice.dtype]) == {1}


def test_a_gpu_takes_bf16_without_timing():
    choice = choose_dtype(TINY, torch.device("cuda"))
    assert choice.dtype == "bfloat16" and not choice.step_ms


def test_every_artifact_method_names_the_kernel_its_layers_run():
    assert set(LAYER_METHOD_OF) == set(ARTIFACT_METHODS)
    assert set(LAYER_METHOD_OF.values()) <= set(LAYER_METHODS)


def test_a_tier_with_dtype_auto_loads_in_the_measured_dtype(tmp_path, caplog):
    from gateway.tiers.embedded_load import build_engine
    from policies.tier_config import EmbeddedTierConfig
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "tiny")
    cfg = EmbeddedTierConfig(model=str(tmp_path / "tiny"), max_model_len=128, kv_cache_memory="2MiB",
                             max_num_seqs=4, max_num_batched_tokens=128)
    assert cfg.dtype == "auto"
    with caplog.at_level("WARNING", logger="gateway.tiers.embedded_load"):
        engine, notes = build_engine("tiny", cfg)
    chosen = [r.getMessage() for r in caplog.records if "dtype auto" in r.getMessage()]
    assert len(chosen) == 1 and not notes
    assert f"auto -> {str(engine.loaded.dtype).removeprefix('torch.')}" in chosen[0]
