"""Torch reference of the rotary-embedding kernel (kernels/triton/elementwise.py)."""

from __future__ import annotations

import torch


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x [T, H, D]; cos, sin [T, 1, D] with the sign of rotate_half folded
    into sin (first half -sin, second half +sin), so rotate_half(x) * sin_hf == roll(x, D/2) * sin."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin
