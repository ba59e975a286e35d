"""Torch reference ops: the semantics every kernel must match, and the fallback path."""

from __future__ import annotations

import torch


def paged_decode_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [B, Hq, D]; k/v_pool: [Hkv, NB, BS, D]; block_tables: [B, max_blocks]; context_lens: [B].

    Gathers each sequence's blocks into a padded batch and attends with two batched
    matmuls; query head h uses KV head h // (Hq // Hkv).
    """
    b, hq, d = q.shape
    hkv, _, bs, _ = k_pool.shape
    max_blocks = block_tables.shape[1]
    length = max_blocks * bs
    ids = block_tables.reshape(-1)
    keys = k_pool.index_select(1, ids).view(hkv, b, length, d)
    values = v_pool.index_select(1, ids).view(hkv, b, length, d)
    qg = q.view(b, hkv, hq // hkv, d).transpose(0, 1)                      # [Hkv, B, G, D]
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * scale      # [Hkv, B, G, L]
    visible = torch.arange(length).unsqueeze(0) < context_lens.unsqueeze(1)
    scores = scores.masked_fill(~visible[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).transpose(0, 1).reshape(b, hq, d)
