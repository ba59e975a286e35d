"""The C++ CPU paged-cache kernels equal the torch reference ops."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_extension import load_cpu_kernels
from kernels.reference import gather_kv, paged_attention_ref, write_kv_ref


@pytest.fixture(scope="module")
def native():
    module = load_cpu_kernels()
    assert module is not None, "the C++ kernels must build on the CPU machines (gcc + Python headers)"
    return module


def _pools(hkv, blocks, bs, d, dtype, generator=None, fill=True):
    """Empty or random pools in the kernel layout (P = 2 for bf16, 1 for fp32)."""
    p = 2 if dtype == torch.bfloat16 else 1
    make = (lambda *shape: torch.randn(*shape, generator=generator).to(dtype)) if fill else \
        (lambda *shape: torch.zeros(*shape, dtype=dtype))
    return make(hkv, blocks, d // p, bs, p), make(hkv, blocks, bs // p, d, p)


def _case(dtype, hq=9, hkv=3, d=64, blocks=64, bs=16, batch=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, v = _pools(hkv, blocks, bs, d, dtype, g)
    lens = torch.randint(1, 10 * bs, (batch,), generator=g)
    lens[0] = 1                                   # a one-token context
    lens[1] = 3 * bs                              # exactly block-aligned
    max_blocks = int((lens.max() + bs - 1) // bs)
    tables = torch.stack([torch.randperm(blocks, generator=g)[:max_blocks] for _ in range(batch)])
    q = torch.randn(batch, hq, d, generator=g).to(dtype)
    return q, k, v, tables, lens


def _mixed_step(q, tables, lens):
    """Turn a decode batch into a mixed step: sequence 2 also brings a causal chunk of 5 tokens."""
    seq = torch.arange(q.shape[0])
    extra = 5
    chunk_lens = lens[2] - extra + torch.arange(1, extra + 1)
    g = torch.Generator().manual_seed(9)
    q2 = torch.cat([q, torch.randn(extra, *q.shape[1:], generator=g).to(q.dtype)])
    return q2, torch.cat([seq, torch.full((extra,), 2)]), torch.cat([lens, chunk_lens])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads", [(9, 3, 64), (14, 2, 64), (8, 8, 64), (4, 1, 128), (6, 2, 48)])
def test_native_attention_matches_reference(native, dtype, tol, heads):
    hq, hkv, d = heads
    q, k, v, tables, lens = _case(dtype, hq, hkv, d)
    lens[2] = max(int(lens[2]), 8)
    q, seq_of_token, ctx = _mixed_step(q, tables, lens)
    scale = d ** -0.5
    got = native.paged_attention(q, k, v, tables, seq_of_token, ctx, scale)
    want = paged_attention_ref(q, k, v, tables, seq_of_token, ctx, scale)
    assert got.dtype == dtype and got.shape == q.shape
    assert (got.float() - want.float()).abs().max().item() < tol


def test_reference_equals_dense_attention():
    q, k, v, tables, lens = _case(torch.float32)
    out = paged_attention_ref(q, k, v, tables, torch.arange(q.shape[0]), lens, 0.125)
    for b in range(q.shape[0]):
        n = int(lens[b])
        keys, values = gather_kv(k, v, tables[b])
        keys, values = keys[:, :n], values[:, :n]
        dense = torch.nn.functional.scaled_dot_product_attention(
            q[b].view(9, 1, 64), keys.repeat_interleave(3, 0), values.repeat_interleave(3, 0), scale=0.125)
        torch.testing.assert_close(out[b], dense.view(9, 64), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_write_matches_reference_and_gather_reads_it_back(native, dtype):
    hkv, blocks, bs, d, t = 3, 20, 16, 64, 37
    g = torch.Generator().manual_seed(3)
    k = torch.randn(t, hkv, d, generator=g).to(dtype)
    v = torch.randn(t, hkv, d, generator=g).to(dtype)
    slots = torch.randperm(blocks * bs, generator=g)[:t]
    pools = [_pools(hkv, blocks, bs, d, dtype, fill=False) for _ in range(2)]
    native.write_kv(k, v, *pools[0], slots)
    write_kv_ref(k, v, *pools[1], slots)
    assert torch.equal(pools[0][0], pools[1][0]) and torch.equal(pools[0][1], pools[1][1])
    keys, values = gather_kv(*pools[0], torch.arange(blocks))
    assert torch.equal(keys[:, slots].transpose(0, 1), k) and torch.equal(values[:, slots].transpose(0, 1), v)


def test_reference_chunk_is_causal():
    """Tokens of one chunk equal dense causal attention over the sequence's prefix."""
    q, k, v, tables, lens = _case(torch.float32, batch=2)
    n = 20
    ctx = torch.arange(1, n + 1)
    qs = torch.randn(n, 9, 64, generator=torch.Generator().manual_seed(4))
    out = paged_attention_ref(qs, k, v, tables, torch.zeros(n, dtype=torch.long), ctx, 0.125)
    keys, values = gather_kv(k, v, tables[0])
    keys, values = keys[:, :n].repeat_interleave(3, 0), values[:, :n].repeat_interleave(3, 0)
    dense = torch.nn.functional.scaled_dot_product_attention(qs.transpose(0, 1), keys, values, is_causal=True,
                                                             scale=0.125)
    torch.testing.assert_close(out, dense.transpose(0, 1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_native_fused_elementwise_ops_match_reference(native, dtype, tol):
    from kernels.reference import add_rms_norm_ref, silu_mul_ref

    g = torch.Generator().manual_seed(5)
    residual = torch.randn(33, 96, generator=g).to(dtype)
    delta = torch.randn(33, 96, generator=g).to(dtype)
    weight = torch.rand(96, generator=g) + 0.5
    res_native, res_ref = residual.clone(), residual.clone()
    got = native.add_rms_norm(res_native, delta, weight, 1e-5)
    want = add_rms_norm_ref(res_ref, delta, weight, 1e-5)
    assert torch.equal(res_native, res_ref)                          # the residual update is exact
    assert (got.float() - want.float()).abs().max().item() < tol
    plain = native.add_rms_norm(residual.clone(), None, weight, 1e-5)
    assert (plain.float() - add_rms_norm_ref(residual.clone(), None, weight, 1e-5).float()).abs().max() < tol
    gate_up = torch.randn(33, 2 * 80, generator=g).to(dtype)
    # The fused op rounds once; compare with fp32 math on the same inputs.
    exact = silu_mul_ref(gate_up.float())
    torch.testing.assert_close(native.silu_mul(gate_up).float(), exact, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
def test_native_rope_split_rotates_q_and_k_and_copies_v(native, dtype, tol):
    from engines.model.rope import RotaryEmbedding
    from engines.model_config import ModelConfig
    from kernels.fused import rope_split_qkv
    from kernels.reference_rope import apply_rope_ref
    from tests.tiny_models import tiny_hf_config

    hq, hkv, d = 9, 3, 64
    cfg = ModelConfig.from_hf(tiny_hf_config(num_attention_heads=hq, num_key_value_heads=hkv, hidden_size=hq * d,
                                             rope_theta=100000.0).to_dict())
    cos, sin = RotaryEmbedding(cfg, dtype).tables(torch.tensor([0, 1, 17, 33, 100, 101, 255]))
    g = torch.Generator().manual_seed(6)
    # A strided input: the rows of a wider buffer, as a projection's output view can be.
    qkv = torch.randn(7, (hq + 2 * hkv) * d + 32, generator=g).to(dtype)[:, : (hq + 2 * hkv) * d]
    q, k, v = native.rope_split_qkv(qkv, cos, sin, hq, hkv, d)
    assert all(t.is_contiguous() for t in (q, k, v))
    # The rotation rounds once from fp32 math on the same inputs.
    want = apply_rope_ref(qkv[:, : (hq + hkv) * d].view(7, hq + hkv, d).float(), cos.float(), sin.float())
    torch.testing.assert_close(q.float(), want[:, :hq], rtol=tol, atol=tol)
    torch.testing.assert_close(k.float(), want[:, hq:], rtol=tol, atol=tol)
    assert torch.equal(v, qkv[:, (hq + hkv) * d:].reshape(7, hkv, d))
    # The model's dispatcher takes this kernel on the CPU and gives the same tensors.
    for got, ours in zip(rope_split_qkv(qkv, cos, sin, hq, hkv, d), (q, k, v), strict=True):
        assert torch.equal(got, ours)
