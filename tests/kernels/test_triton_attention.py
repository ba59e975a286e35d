"""Paged decode (split-K) and extend attention kernels equal kernels.reference.paged_attention_ref
under the Triton interpreter: GQA, ragged contexts, chunks over cached prefixes, 16-bit,
fp32, int8 and FP8 pools."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import paged_attention_ref
from kernels.triton.attention_ops import TritonAttentionOps
from kernels.triton.decode_attention import (
    choose_splits,
    launch_decode,
    paged_decode_attention,
)
from kernels.triton.extend_attention import (
    block_tokens,
    extend_tiles,
    paged_extend_attention,
)
from tests.kernels.kv_cases import (
    decode_step,
    make_pool,
    mixed_step,
    tolerance,
)

BS, BLOCKS = 16, 24
HEADS = [(9, 3, 64), (4, 4, 32), (8, 2, 128)]          # SmolLM2's GQA, MHA, a Llama-like group of 4
LENS = [1, 17, 33, 100]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _max_err(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got).all()
    return (got.float() - want.float()).abs().max().item()


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_matches_reference(dtype, heads):
    hq, hkv, d = heads
    k, v, _ = make_pool(dtype, hkv, BLOCKS, d, BS)
    q, tables, seq, lens = decode_step(LENS, hq, d, BLOCKS, BS, dtype)
    want = paged_attention_ref(q, k, v, tables, seq, lens, d ** -0.5)
    assert _max_err(paged_decode_attention(q, k, v, tables, seq, lens, d ** -0.5), want) < tolerance(dtype)


@pytest.mark.parametrize("splits", [1, 2, 7])
def test_decode_split_k_merges_exactly(splits):
    """Forced split counts, including splits that start past a short context (empty ones)."""
    k, v, _ = make_pool(torch.float32, 3, BLOCKS, 64, BS)
    q, tables, seq, lens = decode_step([1, 17, 100, 33, 64], 9, 64, BLOCKS, BS, torch.float32)
    want = paged_attention_ref(q, k, v, tables, seq, lens, 0.125)
    assert _max_err(launch_decode(q, k, v, tables, seq, lens, 0.125, None, splits), want) < 2e-5


def test_split_heuristic_fills_the_device_and_respects_the_context():
    h200 = 132
    assert choose_splits(1, 8, 4096, 64, h200) == 33          # a lone long decode: 8 x 33 programs
    assert choose_splits(64, 8, 4096, 64, h200) == 1          # a full batch already fills the GPU
    assert choose_splits(1, 1, 100, 64, h200) == 2            # never more splits than 64-token steps


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extend_matches_reference_on_a_mixed_step(dtype, heads):
    hq, hkv, d = heads
    k, v, _ = make_pool(dtype, hkv, BLOCKS, d, BS)
    q, tables, seq, lens = mixed_step(hq, d, BLOCKS, BS, dtype)
    want = paged_attention_ref(q, k, v, tables, seq, lens, d ** -0.5)
    assert _max_err(paged_extend_attention(q, k, v, tables, seq, lens, d ** -0.5), want) < tolerance(dtype)


def test_decode_kernel_is_exact_on_a_mixed_step_too():
    """Every token is independent in the decode kernel, so it is a correct fallback for any step."""
    k, v, _ = make_pool(torch.float32, 3, BLOCKS, 64, BS)
    q, tables, seq, lens = mixed_step(9, 64, BLOCKS, BS, torch.float32)
    want = paged_attention_ref(q, k, v, tables, seq, lens, 0.125)
    assert _max_err(paged_decode_attention(q, k, v, tables, seq, lens, 0.125), want) < 2e-5


def test_extend_tiles_cut_runs_of_one_sequence():
    seq = torch.tensor([0] + [1] * 20 + [2] * 3 + [0])
    assert extend_tiles(seq, 8).tolist() == [[0, 1], [1, 8], [9, 8], [17, 4], [21, 3], [24, 1]]
    assert block_tokens(3) == 16 and block_tokens(1) == 64


@pytest.mark.parametrize("qdtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn])
def test_quantized_kv_dequantized_inside_both_kernels(kv_dtype, qdtype):
    k, v, scales = make_pool(kv_dtype, 3, BLOCKS, 64, BS)
    tol = 3e-2 if qdtype == torch.bfloat16 else 2e-5
    for build, kernel in ((decode_step, paged_decode_attention), (mixed_step, paged_extend_attention)):
        q, tables, seq, lens = (build(LENS, 9, 64, BLOCKS, BS, kv_dtype) if build is decode_step
                                else build(9, 64, BLOCKS, BS, kv_dtype))
        q = q.to(qdtype)
        want = paged_attention_ref(q, k, v, tables, seq, lens, 0.125, scales)
        assert _max_err(kernel(q, k, v, tables, seq, lens, 0.125, scales), want) < tol


def test_ops_pick_the_kernel_per_step_and_reuse_tiles(monkeypatch):
    ops = TritonAttentionOps()
    k, v, _ = make_pool(torch.float32, 3, BLOCKS, 64, BS)
    calls = []
    import kernels.triton.attention_ops as mod
    real_decode = mod.launch_decode
    monkeypatch.setattr(mod, "launch_decode", lambda *a: calls.append("decode") or real_decode(*a))
    real_launch = mod.launch_extend
    monkeypatch.setattr(mod, "launch_extend", lambda *a: calls.append("extend") or real_launch(*a))
    q, tables, seq, lens = decode_step(LENS, 9, 64, BLOCKS, BS, torch.float32)
    want = paged_attention_ref(q, k, v, tables, seq, lens, 0.125)
    assert _max_err(ops.paged_attention(q, k, v, tables, seq, lens, 0.125), want) < 2e-5
    q, tables, seq, lens = mixed_step(9, 64, BLOCKS, BS, torch.float32)
    want = paged_attention_ref(q, k, v, tables, seq, lens, 0.125)
    for _ in range(2):                                    # two layers of one step
        assert _max_err(ops.paged_attention(q, k, v, tables, seq, lens, 0.125), want) < 2e-5
    tiles = ops._tiles
    ops.paged_attention(q, k, v, tables, seq, lens, 0.125)
    assert calls == ["decode", "extend", "extend", "extend"] and ops._tiles is tiles


def test_ops_fall_back_to_the_reference_for_shapes_the_kernels_do_not_cover(caplog):
    k, v, _ = make_pool(torch.float32, 2, BLOCKS, 48, BS)             # head dim 48: not a power of two
    q, tables, seq, lens = decode_step(LENS, 4, 48, BLOCKS, BS, torch.float32)
    with pytest.raises(ValueError, match="powers of two"):
        paged_decode_attention(q, k, v, tables, seq, lens, 0.1)
    got = TritonAttentionOps().paged_attention(q, k, v, tables, seq, lens, 0.1)
    assert torch.equal(got, paged_attention_ref(q, k, v, tables, seq, lens, 0.1))
    assert "torch reference" in caplog.text
