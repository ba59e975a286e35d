"""bench offline --engine-processes: every request runs to its exact length across the workers,
and the figures come from the outputs' arrival times here."""

from __future__ import annotations

import pytest

from bench.datasets.sharegpt import BenchRequest
from bench.engine.offline_processes import quantize_in_process, run_in_engine_processes
from engines.engine_config import EngineConfig
from engines.loaded_model import load_model
from engines.quantization.dense_prefill import block_linears
from tests.tiny_models import write_tiny_checkpoint


def test_requests_spread_over_engine_processes_run_to_their_lengths(tmp_path):
    write_tiny_checkpoint(tmp_path, seed=3)
    loaded = load_model(tmp_path, "float32")
    requests = [BenchRequest(f"r{i}", "", [5 + i, 6, 7, 8 + i], 3 + i) for i in range(6)]
    config = EngineConfig(kv_cache_memory_bytes=2**20, max_num_seqs=2, max_num_batched_tokens=64)
    result = run_in_engine_processes(loaded, requests, "float32", config, processes=2, threads=1)
    assert result["output_tokens"] == sum(3 + i for i in range(6))
    assert result["output_tokens_per_s"] > 0 and result["ttft_ms"]["p50"] > 0
    # The warm-up's 2 tokens per worker, then every request's own.
    assert result["engine_stats"]["generated_tokens"] == result["output_tokens"] + 2 * 2
    assert result["engine_stats"]["kv_blocks_used"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["auto", "off"])
def test_offline_engine_gets_a_tiers_dense_prefill(monkeypatch, setting):
    """The engine measured offline is the one a tier serves: with `auto`, block-quantized weights get
    the dense prefill copies from the row count the start-up probe finds (pinned here, since what
    it finds depends on the CPU); with `off`, none."""
    import engines.loaded_model as loaded_model

    monkeypatch.setattr(loaded_model, "measure_dense_rows", lambda model, dtype: (64, {64: 2.0}))
    loaded = load_model("default", "float32")
    quantize_in_process(loaded, "w4a8-gguf", setting)
    linears = block_linears(loaded.model)
    assert len(linears) == 4 * loaded.config.num_hidden_layers
    if setting == "auto":
        assert loaded.dense_prefill_rows == 64
        assert all(linear.dense is not None and linear.dense_min_rows == 64 for linear in linears)
    else:
        assert loaded.dense_prefill_rows is None
        assert all(linear.dense is None for linear in linears)
