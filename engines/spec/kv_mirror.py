"""Self-speculation reads the target's own K/V, quantized (QuantSpec style).

The self-draft is the target's checkpoint with INT4 weights; its pool (INT8 by default)
has the target's block layout. Every target forward writes its K/V into that pool as well,
so for every computed position the draft attends over the target's K/V in the draft's KV
dtype: the draft needs no prefill of its own, prefix-cache hits are valid for it, and only
its draft positions hold the draft's own K/V, until the target's verification overwrites them.
"""

from __future__ import annotations

import torch

from engines.attention.paged import PagedAttention
from engines.kv_cache import KVPool


class MirroredAttention:
    """The target's paged attention that also stores each step's K/V in the draft's pool.
    The draft source layers it over the target runner's backend with `wrap_attention`."""

    def __init__(self, inner: PagedAttention, draft_pool: KVPool):
        self.inner = inner
        self.pool = inner.pool
        self.draft_pool = draft_pool

    @property
    def meta(self):
        return self.inner.meta

    def prepare(self, meta) -> None:
        self.inner.prepare(meta)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.draft_pool
        scales = pool.scales(layer)
        if scales is None and k.dtype != pool.dtype:
            k, v = k.to(pool.dtype), v.to(pool.dtype)
        self.inner.ops.write_kv(k, v, pool.k[layer], pool.v[layer], self.inner.meta.slot_mapping, scales)
        return self.inner.forward(layer, q, k, v)
