"""K/V for one sequence in one contiguous buffer: the simplest backend, used by the
single-stream generator and as a reference for the paged backend."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engines.model_config import ModelConfig


class ContiguousAttention:
    def __init__(self, cfg: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        shape = (cfg.num_hidden_layers, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.start = 0
        self.length = 0
        self._mask: torch.Tensor | None = None

    def begin_step(self, start: int, n_tokens: int) -> None:
        """The next forward computes positions [start, start + n_tokens)."""
        end = start + n_tokens
        if end > self.max_len:
            raise ValueError(f"sequence of {end} tokens exceeds the cache of {self.max_len}")
        self.start, self.length = start, end
        self._mask = None
        if n_tokens > 1 and start > 0:  # a chunk after cached tokens: causal with an offset
            rows = torch.arange(start, end, device=self.k.device).unsqueeze(1)
            self._mask = torch.arange(end, device=self.k.device).unsqueeze(0) <= rows

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        start, end = self.start, self.length
        self.k[layer, :, start:end] = k.transpose(0, 1)
        self.v[layer, :, start:end] = v.transpose(0, 1)
        keys = self.k[layer, :, :end].unsqueeze(0)
        values = self.v[layer, :, :end].unsqueeze(0)
        query = q.transpose(0, 1).unsqueeze(0)
        causal = self._mask is None and q.shape[0] > 1
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=self._mask, is_causal=causal, enable_gqa=True
        )
        return out[0].transpose(0, 1)
