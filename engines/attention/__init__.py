"""Attention backends: where K/V are kept and how a step attends over them.

The model calls `backend.forward(layer, q, k, v)` with the step's flattened tokens
(q: [T, Hq, D], k/v: [T, Hkv, D]); the backend stores k/v and returns [T, Hq, D].
"""

from typing import Protocol

import torch


class AttentionBackend(Protocol):
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...
