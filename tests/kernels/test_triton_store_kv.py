"""Store-KV kernel: writes equal kernels.reference's writers bit for bit (16-bit and fp32
pools, int8 with fp16 scales, FP8 e4m3 with fp16 scales), through the strides of a
per-layer pool view and of K/V that are column slices of the fused qkv output."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import gather_kv, write_kv_int8_ref, write_kv_ref
from kernels.triton.store_kv import write_kv_quantized_triton, write_kv_triton
from tests.kernels.kv_cases import make_pool

HKV, BLOCKS, BS, D = 3, 12, 16, 64


def _new_kv(t, dtype, seed=0, hkv=HKV, d=D):
    """k, v as strided views of one [T, (Hq + 2 Hkv) * D] projection, like the model's."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (3 * hkv + 2 * hkv) * d, generator=g).to(dtype)
    k = qkv[:, 3 * hkv * d: 4 * hkv * d].view(t, hkv, d)
    v = qkv[:, 4 * hkv * d:].view(t, hkv, d)
    return k, v


def _empty_like_pools(k_pool, v_pool, scales):
    out = [torch.zeros_like(k_pool), torch.zeros_like(v_pool)]
    if scales is not None:
        out += [torch.ones_like(s) for s in scales]
    return out


@pytest.mark.parametrize("t", [1, 37])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_equals_reference_and_reads_back(dtype, t):
    k_pool, v_pool, _ = make_pool(dtype, HKV, BLOCKS, D, BS)
    k, v = _new_kv(t, dtype)
    slots = torch.randperm(BLOCKS * BS, generator=torch.Generator().manual_seed(t))[:t]
    ours, ref = (k_pool.clone(), v_pool.clone()), (k_pool.clone(), v_pool.clone())
    write_kv_triton(k, v, *ours, slots)
    write_kv_ref(k, v, *ref, slots)
    assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])
    keys, values = gather_kv(*ours, torch.arange(BLOCKS))
    assert torch.equal(keys[:, slots].transpose(0, 1), k) and torch.equal(values[:, slots].transpose(0, 1), v)


@pytest.mark.parametrize("kdtype", [torch.float32, torch.bfloat16])
def test_int8_store_equals_reference(kdtype):
    k_pool, v_pool, scales = make_pool(torch.int8, HKV, BLOCKS, D, BS)
    k, v = _new_kv(29, kdtype, seed=3)
    k[4, 1] = 0                                                   # an all-zero row keeps scale 1
    slots = torch.randperm(BLOCKS * BS, generator=torch.Generator().manual_seed(4))[:29]
    ours, ref = _empty_like_pools(k_pool, v_pool, scales), _empty_like_pools(k_pool, v_pool, scales)
    write_kv_quantized_triton(k, v, *ours, slots)
    write_kv_int8_ref(k, v, *ref, slots)
    assert all(torch.equal(a, b) for a, b in zip(ours, ref, strict=True))
    assert ours[2][1, slots[4] // BS, slots[4] % BS] == 1


def _fp8_expected(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (token, head): fp16 scale = amax / 448 (1 for zeros), codes = x / scale in e4m3."""
    amax = x.float().abs().amax(-1)
    s16 = torch.where(amax > 0, amax / 448, torch.ones_like(amax)).to(torch.float16)
    q = (x.float() / s16.float()[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q, s16


def test_fp8_store_rounds_like_torch_and_reads_back():
    k_pool, v_pool, scales = make_pool(torch.float8_e4m3fn, HKV, BLOCKS, D, BS)
    k, v = _new_kv(33, torch.bfloat16, seed=5)
    slots = torch.randperm(BLOCKS * BS, generator=torch.Generator().manual_seed(6))[:33]
    ours = _empty_like_pools(k_pool, v_pool, scales)
    write_kv_quantized_triton(k, v, *ours, slots)
    keys, values = gather_kv(ours[0], ours[1], torch.arange(BLOCKS))          # raw codes, token order
    ks, vs = (s.reshape(HKV, -1)[:, slots].t() for s in ours[2:])
    for x, codes, got_scale in ((k, keys, ks), (v, values, vs)):
        want_q, want_s = _fp8_expected(x)
        assert torch.equal(got_scale, want_s)
        assert torch.equal(codes[:, slots].transpose(0, 1).float(), want_q.float())
        # e4m3 keeps 3 mantissa bits: within 1/16 relative, or half a subnormal step (2^-10 scale)
        deq = codes[:, slots].transpose(0, 1).float() * got_scale.float()[..., None]
        assert ((deq - x.float()).abs() <= x.float().abs() / 16 + got_scale.float()[..., None] / 1024).all()


def test_plain_store_rejects_a_quantized_pool():
    k_pool, v_pool, _ = make_pool(torch.int8, HKV, BLOCKS, D, BS)
    k, v = _new_kv(2, torch.float32)
    with pytest.raises(ValueError, match="write_kv_quantized_triton"):
        write_kv_triton(k, v, k_pool, v_pool, torch.tensor([0, 1]))
