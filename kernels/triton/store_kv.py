"""Store-KV: write a step's new K/V ([T, Hkv, D]) into their paged slots, quantizing on the
way for int8 / FP8 e4m3 pools (one fp16 scale per token and KV head).

Pool layout (one layer, kernels/reference.py): K [Hkv, NB, D/P, BS, P], V [Hkv, NB, BS/P, D, P],
scales [Hkv, NB, BS]; every address goes through the tensors' strides, P is a constexpr.
A program writes ROWS tokens, all of their KV heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton._common import cdiv, interpreting, next_pow2, rows_per_program
from kernels.triton.jit_utils import cast_for, round_half_even, to_e4m3

QUANT_NONE, QUANT_INT8, QUANT_FP8 = 0, 1, 2
_QMAX = {QUANT_INT8: 127.0, QUANT_FP8: 448.0}


@triton.jit
def _quantize(x, mask, QUANT: tl.constexpr, QMAX: tl.constexpr, EMULATE_RNE: tl.constexpr):
    """Per (token, head) of x [ROWS, H, D]: fp16 scale = amax / QMAX (1 for all zeros), values / scale."""
    amax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=2)
    # Round the scale to fp16 first: the stored scale is the one the values are divided by.
    scale = tl.where(amax > 0.0, amax / QMAX, 1.0).to(tl.float16)
    y = x / scale.to(tl.float32)[:, :, None]
    if QUANT == 1:
        q = tl.minimum(tl.maximum(round_half_even(y), -127.0), 127.0).to(tl.int8)
    else:
        q = to_e4m3(tl.minimum(tl.maximum(y, -448.0), 448.0), EMULATE_RNE)
    return q, scale


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kp_ptr, vp_ptr, ks_ptr, vs_ptr, slot_ptr,
                     sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
                     skp_h, skp_b, skp_d, skp_o, skp_p,
                     svp_h, svp_b, svp_o, svp_d, svp_p,
                     sks_h, sks_b, sks_o, svs_h, svs_b, svs_o,
                     T, HKV, D,
                     BS: tl.constexpr, P: tl.constexpr, ROWS: tl.constexpr, H_PAD: tl.constexpr,
                     D_PAD: tl.constexpr, QUANT: tl.constexpr, QMAX: tl.constexpr, EMULATE_RNE: tl.constexpr):
    tt = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    slot = tl.load(slot_ptr + tt, mask=tt < T, other=0).to(tl.int64)
    t = tt[:, None, None]
    blk = (slot // BS)[:, None, None]
    off = (slot % BS)[:, None, None]
    h = tl.arange(0, H_PAD)[None, :, None]
    d = tl.arange(0, D_PAD)[None, None, :]
    mask = (t < T) & (h < HKV) & (d < D)
    k = tl.load(k_ptr + t * sk_t + h * sk_h + d * sk_d, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t * sv_t + h * sv_h + d * sv_d, mask=mask, other=0.0).to(tl.float32)
    k_dst = kp_ptr + h * skp_h + blk * skp_b + (d // P) * skp_d + off * skp_o + (d % P) * skp_p
    v_dst = vp_ptr + h * svp_h + blk * svp_b + (off // P) * svp_o + d * svp_d + (off % P) * svp_p
    if QUANT == 0:
        tl.store(k_dst, cast_for(kp_ptr, k, EMULATE_RNE), mask=mask)
        tl.store(v_dst, cast_for(vp_ptr, v, EMULATE_RNE), mask=mask)
    else:
        hs = tl.arange(0, H_PAD)[None, :]
        row_ok = (tt[:, None] < T) & (hs < HKV)
        blk2, off2 = (slot // BS)[:, None], (slot % BS)[:, None]
        kq, kscale = _quantize(k, mask, QUANT, QMAX, EMULATE_RNE)
        vq, vscale = _quantize(v, mask, QUANT, QMAX, EMULATE_RNE)
        tl.store(k_dst, kq, mask=mask)
        tl.store(v_dst, vq, mask=mask)
        tl.store(ks_ptr + hs * sks_h + blk2 * sks_b + off2 * sks_o, kscale, mask=row_ok)
        tl.store(vs_ptr + hs * svs_h + blk2 * svs_b + off2 * svs_o, vscale, mask=row_ok)


def _quant_kind(pool: torch.Tensor) -> int:
    if pool.dtype == torch.int8:
        return QUANT_INT8
    if pool.dtype == torch.float8_e4m3fn:
        return QUANT_FP8
    return QUANT_NONE


def _launch(k, v, k_pool, v_pool, k_scale, v_scale, slot_mapping) -> None:
    t, hkv, d = k.shape
    if t == 0:
        return
    bs, p = k_pool.shape[3], k_pool.shape[4]
    quant = _quant_kind(k_pool)
    if quant != QUANT_NONE and (k_scale is None or p != 1):
        raise ValueError(f"a {k_pool.dtype} pool needs scales and P = 1")
    if quant == QUANT_NONE:
        k_scale = v_scale = k_pool                      # unused; any tensor with 3 strides
    slots = slot_mapping.to(k.device)
    per = rows_per_program(next_pow2(hkv) * next_pow2(d))
    _store_kv_kernel[(cdiv(t, per),)](
        k, v, k_pool, v_pool, k_scale, v_scale, slots,
        *k.stride(), *v.stride(), *k_pool.stride(), *v_pool.stride(),
        *k_scale.stride()[:3], *v_scale.stride()[:3],
        t, hkv, d, BS=bs, P=p, ROWS=per, H_PAD=next_pow2(hkv), D_PAD=next_pow2(d), QUANT=quant, QMAX=_QMAX.get(quant, 1.0),
        EMULATE_RNE=interpreting())


def write_kv_triton(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Same contract as kernels.reference.write_kv_ref (16-bit or fp32 pools)."""
    if _quant_kind(k_pool) != QUANT_NONE:
        raise ValueError(f"{k_pool.dtype} pools store through write_kv_quantized_triton")
    _launch(k, v, k_pool, v_pool, None, None, slot_mapping)


def write_kv_quantized_triton(k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                              k_scale: torch.Tensor, v_scale: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Same contract as kernels.reference.write_kv_int8_ref, for int8 and FP8 e4m3 pools
    (scale = amax / 127 or amax / 448, rounded to fp16)."""
    if _quant_kind(k_pool) == QUANT_NONE:
        raise ValueError(f"{k_pool.dtype} is not a quantized KV dtype")
    _launch(k, v, k_pool, v_pool, k_scale, v_scale, slot_mapping)
