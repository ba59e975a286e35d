"""Dense copies of block-quantized weights for steps of many rows: which rows take them, what
they compute, and how the threshold follows the measurement."""

from __future__ import annotations

import pytest
import torch

from engines.quantization import dense_prefill
from engines.quantization.dense_prefill import PROBE_ROWS, attach_dense_prefill, measure_dense_rows
from engines.quantization.int4 import quantize_int4
from engines.quantization.w4a8 import BlockQ4Linear

G = torch.Generator().manual_seed(5)


def _layer() -> BlockQ4Linear:
    w = torch.randn(96, 128, generator=G) * 0.05
    return BlockQ4Linear.from_groups(*quantize_int4(w, 32), torch.randn(96, generator=G))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_from_the_threshold_take_the_dense_copy_and_fewer_keep_the_blocks(dtype):
    layer = _layer()
    x = torch.randn(8, 128, generator=G).to(dtype)
    blocks = layer(x)                                   # no dense copy yet: the integer kernel
    layer.attach_dense(dtype, min_rows=4)
    exact = (x.float() @ layer.dequantized().t() + layer.bias).to(dtype)
    # 4 rows and more: the dense weights, equal to the dequantized product up to summation order
    # (the blocks' int8 activations are off by up to half a step per value).
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(layer(x).float(), exact.float(), rtol=tol, atol=tol)
    assert (layer(x).float() - blocks.float()).abs().max() > 0      # a different path, visibly
    # 3 rows: still the blocks, the very values of before.
    torch.testing.assert_close(layer(x[:3]), blocks[:3], rtol=0, atol=0)
    out = layer(x.view(2, 4, 128))                      # leading dimensions keep their shape
    assert out.shape == (2, 4, 96) and out.dtype == dtype


def test_threshold_is_the_fewest_rows_from_which_every_probe_clears_the_bar(monkeypatch):
    layer = _layer()
    threshold, speedups = measure_dense_rows(torch.nn.Sequential(layer), torch.bfloat16)
    assert set(speedups) == set(PROBE_ROWS) and all(s > 0 for s in speedups.values())
    clear = [rows for rows in PROBE_ROWS if all(speedups[r] >= dense_prefill.MIN_SPEEDUP
                                                 for r in PROBE_ROWS if r >= rows)]
    assert threshold == (min(clear) if clear else None)
    # A bar nothing clears: no threshold.
    monkeypatch.setattr(dense_prefill, "MIN_SPEEDUP", float("inf"))
    assert measure_dense_rows(torch.nn.Sequential(layer), torch.bfloat16)[0] is None


def test_models_without_block_weights_are_left_alone():
    assert measure_dense_rows(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.float32) == (None, {})
    assert attach_dense_prefill(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.float32, 64) == 0
