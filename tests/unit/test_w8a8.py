"""W8A8 linears: per-token int8 activations times per-channel int8 weights, in int32."""

from __future__ import annotations

import pytest
import torch

from engines.quantization.int8 import quantize_int8
from engines.quantization.w8a8 import W8A8Linear
from kernels.cpu_extension import load_cpu_kernels
from kernels.reference_gemm import quantize_rows_int8_ref, w8a8_linear_ref

G = torch.Generator().manual_seed(7)


def _native():
    native = load_cpu_kernels()
    if native is None:
        pytest.skip("the C++ CPU kernels did not build here (no compiler)")
    return native


def test_reference_quantization_is_per_row_and_exact_on_the_grid():
    x = torch.randn(5, 64, generator=G)
    x[2] *= 1000.0                                   # one row's scale must not touch the others
    x[4] = 0.0
    q, scale = quantize_rows_int8_ref(x)
    assert q.dtype == torch.int8 and scale.shape == (5,)
    assert torch.equal(q.abs().amax(dim=1)[:4], torch.full((4,), 127, dtype=torch.int8))
    assert torch.equal(q[4], torch.zeros(64, dtype=torch.int8)) and scale[4] == 1.0
    err = (q.float() * scale[:, None] - x).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 17, 64])
def test_cpu_kernel_equals_the_reference(rows, dtype):
    native = _native()
    x = torch.randn(rows, 576, generator=G).to(dtype)
    q_ref, s_ref = quantize_rows_int8_ref(x)
    q, s = native.quantize_rows_int8(x)
    # The kernel is built with -ffast-math: a value within an ulp of a rounding boundary may land
    # one step away, nothing more.
    assert (q.int() - q_ref.int()).abs().max() <= 1
    assert (q != q_ref).float().mean() < 0.01
    torch.testing.assert_close(s, s_ref, rtol=1e-6, atol=0)
    w = torch.randn(960, 576, generator=G) * 0.02
    bias = torch.randn(960, generator=G)
    qw, ws = quantize_int8(w)
    got = native.w8a8_linear(x, qw, ws, bias)
    want = w8a8_linear_ref(x, qw, ws, bias)
    assert got.dtype == dtype and got.shape == (rows, 960)
    # Off-by-one activation codes move an output by at most ~2 x |w| x scale.
    tol = 2 * float(ws.max()) * 127 * float(s.max()) + (0.02 if dtype == torch.bfloat16 else 1e-5) * float(want.abs().max())
    assert (got.float() - want.float()).abs().max() <= tol


def test_module_is_close_to_the_dense_layer_and_keeps_rows_independent():
    w = torch.randn(256, 128, generator=G) * 0.05
    bias = torch.randn(256, generator=G)
    layer = W8A8Linear(w, bias)
    x = torch.randn(8, 128, generator=G)
    dense = x @ w.t() + bias
    out = layer(x)
    assert (out - dense).abs().max() < 0.02 * dense.abs().max()
    # A row's answer does not depend on the batch beside it (per-token scales).
    alone = layer(x[3:4])
    assert torch.equal(alone, out[3:4])
    x_big = x.clone()
    x_big[0] *= 100.0
    assert torch.equal(layer(x_big)[1:], out[1:])
    assert torch.equal(layer.dequantized(), layer.qweight.float() * layer.scales[:, None])
