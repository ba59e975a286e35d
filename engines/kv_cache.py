"""The paged KV pool: one preallocated K and V buffer per layer, addressed by slot.

Slot s holds the token at offset s % block_size of block s // block_size. Both are
head-major; with P = 2 for 16-bit pools (1 for fp32):
  K: [layers, kv_heads, blocks, head_dim / P, block_size, P]  (each block transposed)
  V: [layers, kv_heads, blocks, block_size / P, head_dim, P]
so the attention kernel computes a block's scores and its weighted sum of values with
contiguous vector loops, as bf16 pair dot products where the CPU has them.
"""

from __future__ import annotations

import torch

from engines.model_config import ModelConfig


class KVPool:
    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu"):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        layers, heads, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        elem = torch.empty((), dtype=dtype).element_size()
        p = 2 if elem == 2 and d % 2 == 0 and block_size % 2 == 0 else 1
        self.pack = p
        self.k = torch.zeros((layers, heads, num_blocks, d // p, block_size, p), dtype=dtype, device=device)
        self.v = torch.zeros((layers, heads, num_blocks, block_size // p, d, p), dtype=dtype, device=device)
        # int8 KV: one fp16 scale per (layer, KV head, token slot) for K and for V.
        self.k_scale = self.v_scale = None
        if dtype == torch.int8:
            self.k_scale = torch.ones((layers, heads, num_blocks, block_size), dtype=torch.float16, device=device)
            self.v_scale = torch.ones_like(self.k_scale)

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
    def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        per_token_head = cfg.head_dim * elem + (2 if dtype == torch.int8 else 0)   # + the fp16 scale
        return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * per_token_head

    @classmethod
    def blocks_for_budget(cls, cfg: ModelConfig, memory_bytes: int, block_size: int, dtype: torch.dtype) -> int:
        return memory_bytes // cls.bytes_per_block(cfg, block_size, dtype)
