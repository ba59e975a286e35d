"""Settings of one embedded engine (one tier)."""

from __future__ import annotations

from dataclasses import dataclass

from engines.spec.config import SpeculativeConfig


@dataclass
class EngineConfig:
    kv_cache_memory_bytes: int = 512 * 2**20
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None          # default: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    headroom_fraction: float = 0.01           # blocks kept free at admission for running sequences to grow
    kv_cache_dtype: str | None = None         # default: the model's dtype; or "int8" (per-token, per-head scales)
    seed: int | None = None                   # sampler seed for unseeded requests
    speculative: SpeculativeConfig | None = None   # None: plain decoding

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.kv_cache_memory_bytes <= 0:
            raise ValueError("kv_cache_memory_bytes must be positive")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # Otherwise decoding sequences beyond the budget would wait while older ones run.
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
