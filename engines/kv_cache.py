"""The paged KV pool: one preallocated K and V buffer per layer, addressed by slot.

Slot s holds the token at offset s % block_size of block s // block_size. Both are
head-major; with P = 2 for 16-bit pools (1 for fp32 and the quantized ones):
  K: [layers, kv_heads, blocks, head_dim / P, block_size, P]  (each block transposed)
  V: [layers, kv_heads, blocks, block_size / P, head_dim, P]
so the attention kernel computes a block's scores and its weighted sum of values with
contiguous vector loops, as bf16 pair dot products where the CPU has them.

Quantized KV (`kv_cache_dtype`): values are quantized per (token, KV head) on write and
dequantized inside attention, with fp16 scales beside the pool:
  "int8"  int8, scale = amax / 127                       (D + 2 bytes per token-head)
  "fp8"   float8 e4m3fn, scale = amax / 448              (D + 2)
  "int4"  asymmetric 4-bit q * scale + zero, two values  (D / 2 + 4)
          per uint8 (head dims j and j + D/2), K [.., D/2, BS, 1], V [.., BS, D/2, 1],
          scales [layers, kv_heads, blocks, 2, BS] (scale, zero); torch.uint4 names it.
"""

from __future__ import annotations

import torch

from engines.model_config import ModelConfig

KV_CACHE_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "int4": torch.uint4}
# The dtype the pool tensors hold for each quantized KV dtype.
_STORAGE = {torch.int8: torch.int8, torch.float8_e4m3fn: torch.float8_e4m3fn, torch.uint4: torch.uint8}


def resolve_kv_dtype(name: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """`kv_cache_dtype` of a config -> the pool's dtype (None: the model's). The dtype is part of
    the engine identity, so prefix-cache hashes differ between KV dtypes."""
    if not name:
        return model_dtype
    if name in KV_CACHE_DTYPES:
        return KV_CACHE_DTYPES[name]
    # A float dtype by name ("bfloat16", ...); imported here to keep this module light.
    from engines.loaded_model import parse_dtype

    return parse_dtype(name)


def is_quantized_kv(dtype: torch.dtype) -> bool:
    return dtype in _STORAGE


class KVPool:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        layers, heads, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        self.k_scale = self.v_scale = None
        if is_quantized_kv(dtype):
            self.pack = 1
            storage = _STORAGE[dtype]
            if dtype == torch.uint4:
                if d % 2:
                    raise ValueError(f"int4 KV needs an even head size, not {d}")
                k_shape, v_shape = (d // 2, block_size, 1), (block_size, d // 2, 1)
                scale_shape = (layers, heads, num_blocks, 2, block_size)
            else:
                k_shape, v_shape = (d, block_size, 1), (block_size, d, 1)
                scale_shape = (layers, heads, num_blocks, block_size)
            self.k = torch.zeros((layers, heads, num_blocks, *k_shape), dtype=storage, device=device)
            self.v = torch.zeros((layers, heads, num_blocks, *v_shape), dtype=storage, device=device)
            # One fp16 scale (and, for int4, zero) per (layer, KV head, token slot), for K and for V.
            self.k_scale = torch.ones(scale_shape, dtype=torch.float16, device=device)
            self.v_scale = torch.ones_like(self.k_scale)
            return
        elem = torch.empty((), dtype=dtype).element_size()
        p = 2 if elem == 2 and d % 2 == 0 and block_size % 2 == 0 else 1
        self.pack = p
        self.k = torch.zeros((layers, heads, num_blocks, d // p, block_size, p), dtype=dtype, device=device)
        self.v = torch.zeros((layers, heads, num_blocks, block_size // p, d, p), dtype=dtype, device=device)

    def scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.k_scale is None else (self.k_scale[layer], self.v_scale[layer])

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        scales = 0 if self.k_scale is None else self.k_scale.nbytes + self.v_scale.nbytes
        return self.k.nbytes + self.v.nbytes + scales

    @staticmethod
    def bytes_per_token_head(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes of one token's K (or V) for one KV head, scales included."""
        if dtype == torch.uint4:
            return cfg.head_dim // 2 + 4                  # nibbles + fp16 scale + fp16 zero
        if is_quantized_kv(dtype):
            return cfg.head_dim + 2                       # + the fp16 scale
        return cfg.head_dim * torch.empty((), dtype=dtype).element_size()

    @classmethod
    def bytes_per_block(cls, cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        per_token_head = cls.bytes_per_token_head(cfg, dtype)
        return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * per_token_head

    @classmethod
    def blocks_for_budget(cls, cfg: ModelConfig, memory_bytes: int, block_size: int, dtype: torch.dtype) -> int:
        return memory_bytes // cls.bytes_per_block(cfg, block_size, dtype)
