"""The smallest KV pool an embedded tier's engine accepts: two blocks (engines/llm_engine.py
refuses fewer), each sized by the engine's own KVPool.bytes_per_block from the model's shape,
plus the draft model's block where the tier speculates with one (both pools get as many blocks,
from one budget).

Where the start-up leaves a choice open, the smallest block counts, so that only a pool no
choice can fit is refused: `dtype: auto` may pick bfloat16, and a quantized KV dtype is tried
before the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.kv_cache import KVPool, resolve_kv_dtype
from engines.loaded_model import parse_dtype
from engines.model_config import ModelConfig
from engines.loaders.model_shape import ShapeUnknown, model_shape
from policies.tier_config import EmbeddedTierConfig

# engines.dtype_choice.CANDIDATES: what `dtype: auto` chooses between
AUTO_DTYPES = ("float32", "bfloat16")
MIN_BLOCKS = 2


@dataclass(frozen=True)
class PoolNeed:
    bytes: int          # the smallest kv_cache_memory the engine starts with
    why: str            # what one block holds, for the error


def smallest_pool(tier: EmbeddedTierConfig) -> PoolNeed | None:
    """None when a model's shape cannot be read here (its load reports that)."""
    try:
        target = model_shape(tier.model)
        draft = _draft_shape(tier, target)
    except ShapeUnknown:
        return None
    dtypes = AUTO_DTYPES if tier.dtype == "auto" else (tier.dtype,)
    kv_names = [tier.kv_cache_dtype, *dtypes] if tier.kv_cache_dtype else list(dtypes)
    block, kv_name = min((_block_bytes(target, tier.block_size, name), name) for name in kv_names)
    why = f"{tier.block_size} tokens of {kv_name} KV"
    if draft is not None:
        spec = tier.speculative
        draft_names = [spec.draft_kv_cache_dtype] if spec.draft_kv_cache_dtype else list(dtypes)
        draft_block, draft_name = min((_block_bytes(draft, tier.block_size, name), name) for name in draft_names)
        block += draft_block
        why += f", and the draft model's in {draft_name}"
    return PoolNeed(MIN_BLOCKS * block, f"{MIN_BLOCKS} blocks of {block} bytes ({why})")


def _draft_shape(tier: EmbeddedTierConfig, target: ModelConfig) -> ModelConfig | None:
    spec = tier.speculative
    if spec is None or spec.method == "ngram":
        return None
    if spec.method == "self" and not spec.draft_model:
        return target                   # the target's own weights, quantized
    return model_shape(spec.draft_model)


def _block_bytes(cfg: ModelConfig, block_size: int, kv_name: str) -> int:
    # a KV dtype's name ("int8") or a model dtype's ("bfloat16"), read as the engine reads them;
    # the name is never empty, so the fallback dtype is never used
    return KVPool.bytes_per_block(cfg, block_size, resolve_kv_dtype(kv_name, parse_dtype(AUTO_DTYPES[0])))
