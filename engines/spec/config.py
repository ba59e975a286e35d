"""Settings of speculative decoding for one engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engines.quantization.methods import INT4_GROUP_SIZES


@dataclass
class SpeculativeConfig:
    method: Literal["ngram", "draft", "self"]
    num_tokens: int = 4                       # k: the most draft tokens proposed per step
    draft_model: str | None = None            # method "draft": a model sharing the target's tokenizer
    draft_quantization: str | None = "int4-rtn"   # method "self": weights of the self-draft
    draft_kv_cache_dtype: str | None = "int8"     # method "self": KV dtype of the self-draft
    ngram_max: int = 4                        # method "ngram": longest suffix matched in the context
    ngram_min: int = 1
    adaptive: bool = True                     # adapt k to the measured acceptance rate
    max_batch: int = 8                        # above this many running sequences, decode without speculation
    verify_cost: float = 0.05                 # adaptive k: cost of one more verified row, in target steps
    draft_group_size: int = 32                # method "self": INT4 group (the GGUF's own 4-bit grid is 32)

    def __post_init__(self) -> None:
        if self.num_tokens < 1:
            raise ValueError("num_tokens must be at least 1")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.max_batch < 1 or self.verify_cost < 0:
            raise ValueError("max_batch must be at least 1 and verify_cost at least 0")
        if self.draft_group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"draft_group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}")
