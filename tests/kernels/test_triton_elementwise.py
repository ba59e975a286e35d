"""Fused residual-add + RMSNorm, SiLU * mul and rotary embedding kernels equal their torch
references under the interpreter (fp32 and bf16, ragged widths, strided inputs)."""

from __future__ import annotations

import pytest
import torch

from kernels.reference import add_rms_norm_ref, silu_mul_ref
from kernels.reference_rope import apply_rope_ref
from kernels.triton.elementwise import (
    add_rms_norm_triton,
    apply_rope_triton,
    silu_mul_triton,
)

TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("width", [64, 96, 576])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_matches_reference(dtype, width):
    g = torch.Generator().manual_seed(width)
    residual = torch.randn(7, width, generator=g).to(dtype)
    delta = torch.randn(7, width, generator=g).to(dtype)
    weight = torch.rand(width, generator=g) + 0.5
    ours, ref = residual.clone(), residual.clone()
    got = add_rms_norm_triton(ours, delta, weight, 1e-5)
    want = add_rms_norm_ref(ref, delta, weight, 1e-5)
    assert torch.equal(ours, ref)                       # the in-place residual update is exact
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
    plain = add_rms_norm_triton(residual.clone(), None, weight, 1e-5)
    torch.testing.assert_close(plain.float(), add_rms_norm_ref(residual.clone(), None, weight, 1e-5).float(),
                               atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("inter", [96, 1536, 80])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_fp32_math(dtype, inter):
    gate_up = torch.randn(5, 2 * inter, generator=torch.Generator().manual_seed(inter)).to(dtype)
    got = silu_mul_triton(gate_up)
    # The kernel rounds once; compare with fp32 math on the same inputs.
    torch.testing.assert_close(got.float(), silu_mul_ref(gate_up.float()), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_reference_on_the_fused_qk_view(dtype):
    """x is the Q|K column slice of the fused qkv output (strided), positions ragged."""
    from engines.model.rope import RotaryEmbedding
    from engines.model_config import ModelConfig
    from tests.tiny_models import tiny_hf_config

    cfg = ModelConfig.from_hf(tiny_hf_config(num_attention_heads=9, num_key_value_heads=3, hidden_size=9 * 64,
                                             rope_theta=100000.0).to_dict())
    rope = RotaryEmbedding(cfg, dtype)
    positions = torch.tensor([0, 1, 17, 33, 100, 101, 255])
    cos, sin = rope.tables(positions)
    qkv = torch.randn(7, (9 + 2 * 3) * 64, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = qkv[:, : 12 * 64].view(7, 12, 64)
    got = apply_rope_triton(x, cos, sin)
    want = apply_rope_ref(x, cos, sin)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_rms_norm_needs_rows():
    with pytest.raises(ValueError, match="rows"):
        add_rms_norm_triton(torch.zeros(4, 8).t(), None, torch.ones(4), 1e-5)
