"""Rotary position embedding (rotate-half layout) with linear and Llama-3 scaling."""

from __future__ import annotations

import math

import torch
from torch import nn

from engines.model_config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scale(inv_freq, scaling)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute position."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        inv_freq = inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        positions = torch.arange(cfg.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        # rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1.., +1..]: the sign goes into sin.
        self.register_buffer("cos", torch.cat((freqs, freqs), dim=-1).cos().to(dtype), persistent=False)
        self.register_buffer("sin", torch.cat((-freqs.sin(), freqs.sin()), dim=-1).to(dtype), persistent=False)
        self.max_positions = cfg.max_position_embeddings

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for the step's positions, [T, 1, D]: looked up once, used by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
