"""Torch reference ops: the semantics every kernel must match, and the fallback path.

Pool layout (one layer), P = 2 for 16-bit pools, 1 for fp32 (see kernels/cpu/paged_attention.cpp):
K [Hkv, NB, D/P, BS, P] (each block transposed, head-dim pairs together),
V [Hkv, NB, BS/P, D, P] (token pairs together).
"""

from __future__ import annotations

import torch


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Store k, v ([T, Hkv, D]) at their slots, in place."""
    t, hkv, d = k.shape
    bs, p = k_pool.shape[3], k_pool.shape[4]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    # Advanced indices split by slices put their dims first: the targets are [T, Hkv, D/P, P] and [T, Hkv, D].
    k_pool[:, blocks, :, offsets, :] = k.reshape(t, hkv, d // p, p).to(k_pool.dtype)
    v_pool[:, blocks, offsets // p, :, offsets % p] = v.to(v_pool.dtype)


def gather_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, block_ids: torch.Tensor,
              scales: tuple[torch.Tensor, torch.Tensor] | None = None,
              dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks -> K, V as [Hkv, n_blocks * BS, D] in token order (dequantized with `scales`,
    [Hkv, NB, BS] each, for an int8 pool)."""
    hkv, _, _, bs, p = k_pool.shape
    d = v_pool.shape[3]
    n = block_ids.numel()
    keys = k_pool.index_select(1, block_ids).permute(0, 1, 3, 2, 4).reshape(hkv, n * bs, d)
    values = v_pool.index_select(1, block_ids).permute(0, 1, 2, 4, 3).reshape(hkv, n * bs, d)
    if scales is not None:
        ks, vs = (sc.index_select(1, block_ids).reshape(hkv, n * bs, 1).float() for sc in scales)
        keys, values = keys.float() * ks, values.float() * vs
    if dtype is not None:
        keys, values = keys.to(dtype), values.to(dtype)
    return keys, values


def write_kv_int8_ref(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize k, v per (token, KV head) to int8 with an fp16 scale and store them."""
    bs = k_pool.shape[3]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    for x, pool, scale in ((k, k_pool, k_scale), (v, v_pool, v_scale)):
        amax = x.float().abs().amax(dim=-1)                                   # [T, Hkv]
        s16 = torch.where(amax > 0, amax / 127, torch.ones_like(amax)).to(torch.float16)
        q = torch.round(x.float() / s16.float()[..., None]).clamp(-127, 127).to(torch.int8)
        scale[:, blocks, offsets] = s16.t()
        if pool is k_pool:
            pool[:, blocks, :, offsets, :] = q.unsqueeze(-1)
        else:
            pool[:, blocks, offsets, :, torch.zeros_like(offsets)] = q     # advanced dims first: [T, Hkv, D]


def paged_attention_ref(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                        seq_of_token: torch.Tensor, context_lens: torch.Tensor, scale: float,
                        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q: [T, Hq, D]; block_tables: [S, max_blocks]; seq_of_token, context_lens: [T] -> [T, Hq, D].

    Token t attends over positions [0, context_lens[t]) of sequence seq_of_token[t]; query
    head h reads KV head h // (Hq // Hkv). Sequences with one token in the step (decodes)
    are batched into one padded gather and two matmuls; others are computed one by one.
    """
    out = torch.empty_like(q)
    seqs = seq_of_token.tolist()
    counts: dict[int, list[int]] = {}
    for t, s in enumerate(seqs):
        counts.setdefault(s, []).append(t)
    single = [rows[0] for rows in counts.values() if len(rows) == 1]
    if single:
        idx = torch.tensor(single)
        out[idx] = _padded_batch(q[idx], k_pool, v_pool, block_tables[seq_of_token[idx]], context_lens[idx], scale,
                                 kv_scales)
    for s, rows in counts.items():
        if len(rows) == 1:
            continue
        idx = torch.tensor(rows)
        lens = context_lens[idx]
        n_blocks = -(-int(lens.max()) // k_pool.shape[3])
        keys, values = gather_kv(k_pool, v_pool, block_tables[s, :n_blocks], kv_scales, q.dtype)
        out[idx] = _attend(q[idx], keys, values, lens, scale)
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, Hq, D] over one sequence's keys/values [Hkv, L, D]; token i sees lens[i] positions."""
    n, hq, d = q.shape
    hkv, length = keys.shape[0], keys.shape[1]
    qg = q.transpose(0, 1).reshape(hkv, hq // hkv * n, d)
    scores = (torch.matmul(qg, keys.transpose(-1, -2)).float() * scale).view(hkv, hq // hkv, n, length)
    hidden = torch.arange(length).unsqueeze(0) >= lens.unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).to(values.dtype)
    out = torch.matmul(probs.view(hkv, -1, length), values)
    return out.view(hq, n, d).transpose(0, 1)


def _padded_batch(q, k_pool, v_pool, tables, lens, scale, kv_scales=None):
    """One query token per sequence, all sequences in one padded gather."""
    b, hq, d = q.shape
    hkv = k_pool.shape[0]
    n_blocks = -(-int(lens.max()) // k_pool.shape[3])
    keys, values = gather_kv(k_pool, v_pool, tables[:, :n_blocks].reshape(-1), kv_scales, q.dtype)
    length = keys.shape[1] // b
    keys, values = keys.view(hkv, b, length, d), values.view(hkv, b, length, d)
    qg = q.view(b, hkv, hq // hkv, d).transpose(0, 1)                      # [Hkv, B, G, D]
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * scale      # [Hkv, B, G, L]
    hidden = torch.arange(length).unsqueeze(0) >= lens.unsqueeze(1)
    scores = scores.masked_fill(hidden[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).transpose(0, 1).reshape(b, hq, d)


def add_rms_norm_ref(residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
    """residual += delta (in place, when given); return rms_norm(residual) * weight, in fp32 math."""
    if delta is not None:
        residual.add_(delta)
    return torch.nn.functional.rms_norm(residual.float(), (residual.shape[-1],), weight, eps).to(residual.dtype)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate | up) -> silu(gate) * up, [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
