"""Quantized KV pools (int8, fp8 e4m3, int4): the C++ write and attention kernels equal the
torch references bit for bit (writes) or to rounding (attention), the references round-trip
within each format's step, and attention over a quantized pool stays close to attention
over the unquantized values."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_extension import load_cpu_kernels
from kernels.dispatch import AttentionOps
from kernels.reference import (
    gather_kv,
    paged_attention_ref,
    write_kv_fp8_ref,
    write_kv_int4_ref,
    write_kv_int8_ref,
    write_kv_ref,
)

FORMATS = {"int8": write_kv_int8_ref, "fp8": write_kv_fp8_ref, "int4": write_kv_int4_ref}


@pytest.fixture(scope="module")
def native():
    module = load_cpu_kernels()
    assert module is not None, "the C++ kernels must build on the CPU machines (gcc + Python headers)"
    return module


def _pools(fmt: str, hkv: int, blocks: int, bs: int, d: int):
    """Empty pools and scales in the layout KVPool allocates for one layer."""
    if fmt == "int4":
        return (torch.zeros(hkv, blocks, d // 2, bs, 1, dtype=torch.uint8),
                torch.zeros(hkv, blocks, bs, d // 2, 1, dtype=torch.uint8),
                torch.ones(hkv, blocks, 2, bs, dtype=torch.float16), torch.ones(hkv, blocks, 2, bs, dtype=torch.float16))
    dtype = torch.int8 if fmt == "int8" else torch.float8_e4m3fn
    return (torch.zeros(hkv, blocks, d, bs, 1, dtype=dtype), torch.zeros(hkv, blocks, bs, d, 1, dtype=dtype),
            torch.ones(hkv, blocks, bs, dtype=torch.float16), torch.ones(hkv, blocks, bs, dtype=torch.float16))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _kv(t, hkv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(t, hkv, d, generator=g) * torch.rand(t, hkv, 1, generator=g) * 4   # varied per-token ranges
    v = torch.randn(t, hkv, d, generator=g) + torch.randn(t, hkv, 1, generator=g)      # off-centre rows
    return k.to(dtype), v.to(dtype)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_write_equals_reference_and_round_trips_within_a_step(native, fmt, dtype):
    hkv, blocks, bs, d, t = 3, 12, 16, 64, 40
    k, v = _kv(t, hkv, d, dtype, seed=7)
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(1))[:t]
    a, b = _pools(fmt, hkv, blocks, bs, d), _pools(fmt, hkv, blocks, bs, d)
    getattr(native, f"write_kv_{fmt}")(k, v, *a, slots)
    FORMATS[fmt](k, v, *b, slots)
    for got, want in zip(a, b):
        assert torch.equal(_bits(got), _bits(want))
    keys, values = gather_kv(a[0], a[1], torch.arange(blocks), (a[2], a[3]))
    for x, back in ((k, keys), (v, values)):
        x = x.float()
        err = (back[:, slots].transpose(0, 1) - x).abs()                     # [T, Hkv, D]
        amax = x.abs().amax(-1, keepdim=True)
        if fmt == "int8":
            bound = amax / 127 / 2 * 1.01
        elif fmt == "fp8":        # 3 mantissa bits: half a step is 1/16 of the value, or a subnormal step
            bound = torch.maximum(x.abs() / 16, amax / 448 * 2.0 ** -9) * 1.01
        else:
            bound = (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 15 / 2 * 1.01 + amax * 2.0 ** -9
        assert (err <= bound).all(), f"{fmt}: worst excess {(err - bound).max().item()}"


def _attention_case(fmt, dtype, hq, hkv, d, seed=3):
    """A mixed step over a quantized pool: 6 decode tokens with varied context lengths (1,
    block-aligned, long) and a 5-token causal chunk of sequence 2."""
    bs, blocks, batch = 16, 48, 6
    g = torch.Generator().manual_seed(seed)
    n = blocks * bs
    k, v = _kv(n, hkv, d, dtype, seed)
    pools = _pools(fmt, hkv, blocks, bs, d)
    FORMATS[fmt](k, v, *pools, torch.arange(n))
    lens = torch.randint(20, 8 * bs, (batch,), generator=g)
    lens[0], lens[1] = 1, 3 * bs
    tables = torch.stack([torch.randperm(blocks, generator=g)[:8] for _ in range(batch)])
    q = torch.randn(batch + 5, hq, d, generator=g).to(dtype)
    seq = torch.cat([torch.arange(batch), torch.full((5,), 2)])
    ctx = torch.cat([lens, lens[2] - 5 + torch.arange(1, 6)])
    return q, pools, tables, seq, ctx


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads", [(9, 3, 64), (14, 2, 64), (8, 8, 64), (4, 1, 128), (8, 2, 128)])
def test_native_quantized_attention_matches_reference(native, fmt, dtype, tol, heads):
    q, (kp, vp, ks, vs), tables, seq, ctx = _attention_case(fmt, dtype, *heads)
    scale = heads[2] ** -0.5
    got = native.paged_attention_quantized(q, kp, vp, ks, vs, tables, seq, ctx, scale)
    want = paged_attention_ref(q, kp, vp, tables, seq, ctx, scale, (ks, vs))
    assert got.dtype == dtype and got.shape == q.shape
    # bf16: the reference rounds dequantized K/V and scores to bf16, so allow ~2 ulps of the output.
    assert (got.float() - want.float()).abs().max().item() < tol * max(1.0, want.float().abs().max().item())


@pytest.mark.parametrize("fmt,bound", [("int8", 0.02), ("fp8", 0.05), ("int4", 0.25)])
def test_quantized_attention_stays_close_to_unquantized(native, fmt, bound):
    """Against fp32 attention over the same K/V written unquantized: each format's error is a
    fraction of the output's size (a wrong scale, zero or nibble order gives O(1) errors)."""
    hq, hkv, d = 9, 3, 64
    q, pools, tables, seq, ctx = _attention_case(fmt, torch.float32, hq, hkv, d)
    n = pools[0].shape[1] * 16
    k, v = _kv(n, hkv, d, torch.float32, seed=3)
    plain = (torch.zeros(hkv, n // 16, d, 16, 1), torch.zeros(hkv, n // 16, 16, d, 1))
    write_kv_ref(k, v, *plain, torch.arange(n))
    exact = paged_attention_ref(q, *plain, tables, seq, ctx, d ** -0.5)
    got = native.paged_attention_quantized(q, *pools, tables, seq, ctx, d ** -0.5)
    rel = (got - exact).abs().mean() / exact.abs().mean()
    assert rel < bound, f"{fmt}: mean relative error {rel:.4f}"


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_dispatch_uses_native_or_reference_with_the_same_result(native, fmt):
    """AttentionOps picks the C++ kernels where it can and the reference elsewhere (head size 48
    has no C++ instance); both routes store and read the same values."""
    for d, native_expected in ((64, True), (48, False)):
        hkv, hq = 2, 4
        q, pools, tables, seq, ctx = _attention_case(fmt, torch.float32, hq, hkv, d)
        k, v = _kv(7, hkv, d, torch.float32, seed=11)
        slots = torch.tensor([3, 17, 40, 41, 100, 200, 511])
        ops, ref_ops = AttentionOps("cpu"), AttentionOps("cpu", prefer_native=False)
        assert ref_ops.native is None and ops._native_quantized_ok(q, pools[0]) == native_expected
        a, b = [x.clone() for x in pools], [x.clone() for x in pools]
        ops.write_kv(k, v, a[0], a[1], slots, (a[2], a[3]))
        ref_ops.write_kv(k, v, b[0], b[1], slots, (b[2], b[3]))
        assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b))
        got = ops.paged_attention(q, a[0], a[1], tables, seq, ctx, d ** -0.5, (a[2], a[3]))
        want = ref_ops.paged_attention(q, b[0], b[1], tables, seq, ctx, d ** -0.5, (b[2], b[3]))
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
