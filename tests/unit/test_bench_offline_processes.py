"""bench offline --engine-processes: every request runs to its exact length across the workers,
and the figures come from the outputs' arrival times here."""

from __future__ import annotations

from bench.datasets.sharegpt import BenchRequest
from bench.engine.offline_processes import run_in_engine_processes
from engines.engine_config import EngineConfig
from engines.loaded_model import load_model
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
