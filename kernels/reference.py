"""Torch reference ops: the semantics every kernel must match, and the fallback path.

Pool layout (one layer), P = 2 for 16-bit pools, 1 for fp32 (see kernels/cpu/paged_attention.cpp):
K [Hkv, NB, D/P, BS, P] (each block transposed, head-dim pairs together),
V [Hkv, NB, BS/P, D, P] (token pairs together).
Quantized pools (P = 1) carry fp16 scales per (KV head, token): int8 and fp8 e4m3 store one
element per value with a scale [Hkv, NB, BS]; int4 stores two values per uint8 (K [Hkv, NB,
D/2, BS, 1], V [Hkv, NB, BS, D/2, 1]) with scales and zeros [Hkv, NB, 2, BS].
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
    """Blocks -> K, V as [Hkv, n_blocks * BS, D] in token order, dequantized with `scales` for
    a quantized pool (int8 / fp8: [Hkv, NB, BS] each; int4: [Hkv, NB, 2, BS], scales and zeros)."""
    hkv, _, _, bs, _ = k_pool.shape
    n = block_ids.numel()
    if k_pool.dtype == torch.uint8:
        return _gather_int4(k_pool, v_pool, block_ids, scales, dtype)
    d = v_pool.shape[3]
    keys = k_pool.index_select(1, block_ids).permute(0, 1, 3, 2, 4).reshape(hkv, n * bs, d)
    values = v_pool.index_select(1, block_ids).permute(0, 1, 2, 4, 3).reshape(hkv, n * bs, d)
    if scales is not None:
        ks, vs = (sc.index_select(1, block_ids).reshape(hkv, n * bs, 1).float() for sc in scales)
        keys, values = keys.float() * ks, values.float() * vs
    if dtype is not None:
        keys, values = keys.to(dtype), values.to(dtype)
    return keys, values


def _gather_int4(k_pool, v_pool, block_ids, scales, dtype):
    hkv, _, half, bs, _ = k_pool.shape
    n, d = block_ids.numel(), 2 * half
    kb = k_pool.index_select(1, block_ids)[..., 0]                                  # [Hkv, n, D/2, BS]
    keys = torch.cat([kb & 15, kb >> 4], dim=2).permute(0, 1, 3, 2).reshape(hkv, n * bs, d)
    vb = v_pool.index_select(1, block_ids)[..., 0]                                  # [Hkv, n, BS, D/2]
    values = torch.cat([vb & 15, vb >> 4], dim=3).reshape(hkv, n * bs, d)
    out = []
    for x, sc in zip((keys, values), scales):
        sz = sc.index_select(1, block_ids).float()                                 # [Hkv, n, 2, BS]
        out.append(x.float() * sz[:, :, 0].reshape(hkv, n * bs, 1) + sz[:, :, 1].reshape(hkv, n * bs, 1))
    return tuple(x.to(dtype) for x in out) if dtype is not None else tuple(out)


def _store_unpacked(k_q, v_q, k_pool, v_pool, slot_mapping) -> None:
    """Store quantized k, v ([T, Hkv, D]) into int8 / fp8 pools (K [Hkv, NB, D, BS, 1], V [Hkv, NB, BS, D, 1])."""
    bs = k_pool.shape[3]
    blocks, offsets = slot_mapping // bs, slot_mapping % bs
    k_pool[..., 0][:, blocks, :, offsets] = k_q                  # advanced dims first: [T, Hkv, D]
    v_pool[..., 0][:, blocks, offsets] = v_q.transpose(0, 1)     # adjacent advanced dims stay: [Hkv, T, D]


def _store_scales(scales: torch.Tensor, values: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """values [T, Hkv] -> scales [Hkv, NB, BS] at the tokens' slots."""
    bs = scales.shape[-1]
    scales[:, slot_mapping // bs, slot_mapping % bs] = values.t()


def write_kv_int8_ref(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize k, v per (token, KV head) to int8 with an fp16 scale (amax / 127) and store them."""
    quantized = []
    for x, scale in ((k, k_scale), (v, v_scale)):
        amax = x.float().abs().amax(dim=-1)                                   # [T, Hkv]
        s16 = torch.where(amax > 0, amax / 127, torch.ones_like(amax)).to(torch.float16)
        quantized.append(torch.round(x.float() / s16.float()[..., None]).clamp(-127, 127).to(torch.int8))
        _store_scales(scale, s16, slot_mapping)
    _store_unpacked(*quantized, k_pool, v_pool, slot_mapping)


E4M3_MAX = 448.0


def write_kv_fp8_ref(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                     k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize k, v per (token, KV head) to fp8 e4m3 with an fp16 scale (amax / 448) and store them."""
    quantized = []
    for x, scale in ((k, k_scale), (v, v_scale)):
        amax = x.float().abs().amax(dim=-1)
        s16 = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax)).to(torch.float16)
        scaled = (x.float() / s16.float()[..., None]).clamp(-E4M3_MAX, E4M3_MAX)
        quantized.append(scaled.to(torch.float8_e4m3fn))
        _store_scales(scale, s16, slot_mapping)
    _store_unpacked(*quantized, k_pool, v_pool, slot_mapping)


def quantize_kv_int4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[T, Hkv, D] -> (bytes [T, Hkv, D/2]: dim j low nibble, dim j + D/2 high; fp16 scale and
    zero [T, Hkv]) with x ~= q * scale + zero, q in 0..15 (asymmetric, per token and head)."""
    xf = x.float()
    lo, hi = xf.amin(dim=-1), xf.amax(dim=-1)
    s16 = torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(hi)).to(torch.float16)
    z16 = lo.to(torch.float16)
    q = torch.round((xf - z16.float()[..., None]) / s16.float()[..., None]).clamp(0, 15).to(torch.uint8)
    half = x.shape[-1] // 2
    return q[..., :half] | (q[..., half:] << 4), s16, z16


def write_kv_int4_ref(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                      k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize k, v to int4 (quantize_kv_int4) and store them: pools K [Hkv, NB, D/2, BS, 1] and
    V [Hkv, NB, BS, D/2, 1] uint8, scales [Hkv, NB, 2, BS] fp16 (row 0 scales, row 1 zeros)."""
    packed = []
    for x, scale in ((k, k_scale), (v, v_scale)):
        q, s16, z16 = quantize_kv_int4(x)
        packed.append(q)
        _store_scales(scale[:, :, 0], s16, slot_mapping)
        _store_scales(scale[:, :, 1], z16, slot_mapping)
    _store_unpacked(*packed, k_pool, v_pool, slot_mapping)


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
        idx = torch.tensor(single, device=q.device)
        out[idx] = _padded_batch(q[idx], k_pool, v_pool, block_tables[seq_of_token[idx]], context_lens[idx], scale,
                                 kv_scales)
    for s, rows in counts.items():
        if len(rows) == 1:
            continue
        idx = torch.tensor(rows, device=q.device)
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
    hidden = torch.arange(length, device=lens.device).unsqueeze(0) >= lens.unsqueeze(1)
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
    hidden = torch.arange(length, device=lens.device).unsqueeze(0) >= lens.unsqueeze(1)
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
