"""Quantized GEMM kernels equal their references (kernels/reference_gemm.py) under the
interpreter, on the weights our quantization modules and the HF AWQ loader produce:
W4A16 (group-wise INT4, padded input width; its batch-1 GEMV too), W8A16, FP8 with per-token
e4m3 activations. Batch 1, ragged rows/columns, forced split-K."""

from __future__ import annotations

import pytest
import torch

from engines.loaders.hf_awq import install_awq_linears, pack_awq
from engines.quantization.fp8 import Fp8Linear
from engines.quantization.int4 import (
    Int4Linear,
    dequantize_int4,
    pack_nibbles,
    quantize_int4,
)
from engines.quantization.int8 import Int8Linear
from kernels.reference_gemm import (
    fp8_linear_ref,
    quantize_rows_fp8_ref,
    w4a16_linear_ref,
    w8a16_linear_ref,
)
from kernels.triton.gemm_common import GemmPlan, plan_gemm
from kernels.triton.gemm_fp8 import fp8_linear, quantize_rows_fp8
from kernels.triton.gemm_weight_only import w4a16_linear, w4a16_plan, w8a16_linear
from kernels.triton.gemv_int4 import PROGRAMS_PER_SM, plan_gemv

SHAPES = [(1, 96, 128), (5, 70, 200), (33, 130, 256)]          # (rows, out, in): batch 1 and ragged


def _data(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k ** 0.5, torch.randn(m, k, generator=g).to(dtype),
            torch.randn(n, generator=g))


def _close(got, want, dtype):
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2                # bf16: one output rounding
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def _int4(w: torch.Tensor, group: int):
    """The portable INT4 form Int4Linear keeps (nibbles, scales, zeros), K padded to the group.
    Built with the module's own functions: the CPU module itself needs N % 16 == 0."""
    q, scales, zeros = quantize_int4(torch.nn.functional.pad(w, (0, -w.shape[1] % group)), group)
    return pack_nibbles(q), scales, zeros, dequantize_int4(q, scales, zeros, group)


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("shape", SHAPES + [(70, 40, 512)])     # 70 rows: 64x128 tiles, K steps of 64
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a16_matches_reference(dtype, shape, group):
    m, n, k = shape
    w, x, b = _data(m, n, k, dtype)
    q, scales, zeros, dense = _int4(w, group)               # K 200 is padded to 256
    got = w4a16_linear(x, q, scales, zeros, group, b)
    _close(got, w4a16_linear_ref(x, q, scales, zeros, group, b), dtype)
    if dtype == torch.float32:                               # both equal the dequantized matmul
        torch.testing.assert_close(got, x @ dense[:, :k].t() + b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w4a16_prefill_rows_multiply_the_dequantized_weight(dtype, group):
    from kernels.triton.gemm_weight_only import DEQUANTIZE_MIN_ROWS, dequantize_w4

    m, n, k = DEQUANTIZE_MIN_ROWS + 3, 70, 200                # K padded to whole groups, ragged N
    w, x, b = _data(m, n, k, dtype, seed=3)
    q, scales, zeros, dense = _int4(w, group)
    # The kernel writes exactly the values the tile kernel feeds its MMA (fp32: the weight itself).
    assert torch.equal(dequantize_w4(q, scales, zeros, group, k, torch.float32), dense[:, :k])
    assert torch.equal(dequantize_w4(q, scales, zeros, group, k, torch.bfloat16), dense[:, :k].to(torch.bfloat16))
    got = w4a16_linear(x, q, scales, zeros, group, b)
    _close(got, w4a16_linear_ref(x, q, scales, zeros, group, b), dtype)
    # Below the threshold the tiles answer the same.
    tiles = w4a16_linear(x[: DEQUANTIZE_MIN_ROWS - 1], q, scales, zeros, group, b)
    _close(tiles, got[: DEQUANTIZE_MIN_ROWS - 1], dtype)


def test_w4a16_takes_the_int4_modules_portable_form():
    w, x, b = _data(4, 96, 200, torch.bfloat16, seed=5)
    layer = Int4Linear(w, b, 64)
    p = layer.portable
    got = w4a16_linear(x, p["q"], p["scales"], p["zeros"], 64, layer.bias)
    # The CPU module (torch's int4 op, bf16 scales) computes the same product up to bf16 rounding.
    torch.testing.assert_close(got.float(), layer(x).float(), atol=3e-2, rtol=3e-2)


def test_w4a16_serves_hf_awq_checkpoints():
    """AWQ qweight/qzeros/scales -> our INT4 layout (engines/loaders/hf_awq.py) -> the kernel
    equals (q - z) * s computed straight from the AWQ tensors."""
    from engines.model import LlamaForCausalLM
    from engines.model_config import ModelConfig
    from tests.tiny_models import tiny_hf_config

    cfg = ModelConfig.from_hf(tiny_hf_config(num_hidden_layers=1).to_dict())
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(7)
    group, hf, raw = 32, {}, {}
    for block, parts in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj",
                                                                                          "down_proj"))):
        for part in parts:
            out_f, in_f = _hf_shape(cfg, part)
            q = torch.randint(0, 16, (in_f, out_f), generator=g)
            z = torch.randint(0, 16, (in_f // group, out_f), generator=g)
            s = (torch.rand(in_f // group, out_f, generator=g) * 0.02 + 0.01).half()
            base = f"model.layers.0.{block}.{part}"
            hf.update({f"{base}.qweight": pack_awq(q), f"{base}.qzeros": pack_awq(z), f"{base}.scales": s})
            raw[part] = ((q - z.repeat_interleave(group, 0)).float() * s.float().repeat_interleave(group, 0)).t()
    install_awq_linears(model, hf, group)
    down = model.layers[0].mlp.down_proj
    x = torch.randn(3, down.in_features, generator=g)
    p = down.portable
    got = w4a16_linear(x, p["q"], p["scales"], p["zeros"], group)
    torch.testing.assert_close(got, x @ raw["down_proj"].t(), atol=1e-4, rtol=1e-4)


def _hf_shape(cfg, part):
    h, kv, inter = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    return {"q_proj": (h, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, h),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}[part]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a16_matches_reference_on_int8_modules(dtype, shape):
    w, x, b = _data(*shape, dtype, seed=1)
    layer = Int8Linear(w, b)
    got = w8a16_linear(x, layer.qweight, layer.scales, layer.bias)
    _close(got, w8a16_linear_ref(x, layer.qweight, layer.scales, layer.bias), dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_gemm_matches_reference_on_fp8_modules(dtype, shape):
    w, x, b = _data(*shape, dtype, seed=2)
    layer = Fp8Linear(w, b)
    got = fp8_linear(x, layer.qweight, layer.weight_scale, layer.bias)
    _close(got, fp8_linear_ref(x, layer.qweight, layer.weight_scale, layer.bias), dtype)


def test_fp8_activation_quantization_is_exact():
    x = torch.randn(9, 1500, generator=torch.Generator().manual_seed(3)) * 5     # rows longer than one block
    x[2] = 0
    q, s = quantize_rows_fp8(x)
    q_ref, s_ref = quantize_rows_fp8_ref(x)
    assert torch.equal(s, s_ref) and torch.equal(q.float(), q_ref.float())


@pytest.mark.parametrize("split_k", [1, 3])
def test_split_k_partials_add_up(split_k):
    """Forced plans: several K splits (with a last, shorter one) sum to the single-pass result."""
    w, x, b = _data(2, 40, 320, torch.float32, seed=4)
    plan = GemmPlan(block_m=16, block_n=32, block_k=64, split_k=split_k, k_per_split=-(-5 // split_k) * 64)
    i8 = Int8Linear(w, b)
    torch.testing.assert_close(w8a16_linear(x, i8.qweight, i8.scales, i8.bias, plan=plan),
                               w8a16_linear_ref(x, i8.qweight, i8.scales, i8.bias), atol=1e-4, rtol=1e-4)
    q, scales, zeros, _ = _int4(w, 64)
    torch.testing.assert_close(w4a16_linear(x, q, scales, zeros, 64, b, plan=plan),
                               w4a16_linear_ref(x, q, scales, zeros, 64, b), atol=1e-4, rtol=1e-4)
    f8 = Fp8Linear(w, b)
    torch.testing.assert_close(fp8_linear(x, f8.qweight, f8.weight_scale, f8.bias, plan=plan),
                               fp8_linear_ref(x, f8.qweight, f8.weight_scale, f8.bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 128, 256])
def test_w4a16_gemv_split_k_over_ragged_shapes(dtype, group):
    """One row: the GEMV, with K split as on a GPU (a 1000-wide input padded to the group,
    the last split shorter), ragged N, bias; equal to the reference and, in fp32, to the
    dequantized matmul."""
    w, x, b = _data(1, 70, 1000, dtype, seed=6)
    q, scales, zeros, dense = _int4(w, group)
    plan = plan_gemv(70, 1000, group, sms=132)
    assert plan.block_m == 1 and plan.split_k > 1
    got = w4a16_linear(x, q, scales, zeros, group, b, plan=plan)
    _close(got, w4a16_linear_ref(x, q, scales, zeros, group, b), dtype)
    single = w4a16_linear(x, q, scales, zeros, group, b)        # interpreter plan: one split
    _close(got, single, dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(got, x @ dense[:, :1000].t() + b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("group", [64, 256])
def test_w4a16_gemv_tiles_narrower_than_a_group(group):
    """32-column tiles, several per group and several per split: each tile must take its
    own group's scale and zero."""
    w, x, b = _data(1, 50, 700, torch.float32, seed=8)
    q, scales, zeros, dense = _int4(w, group)
    plan = GemmPlan(block_m=1, block_n=64, block_k=32, split_k=3, k_per_split=8 * 32)
    got = w4a16_linear(x, q, scales, zeros, group, b, plan=plan)
    torch.testing.assert_close(got, x @ dense[:, :700].t() + b, atol=1e-4, rtol=1e-4)


def test_w4a16_refuses_a_weight_not_padded_to_whole_groups():
    q = torch.zeros(8, 40, dtype=torch.uint8)                       # 80 columns: not 2 groups of 64
    with pytest.raises(ValueError, match="groups of 64"):
        w4a16_linear(torch.zeros(1, 80), q, torch.ones(8, 2), torch.zeros(8, 2), 64)


def test_w4a16_batch1_takes_the_gemv_and_fills_the_gpu():
    h200 = 132
    for n, k in ((6144, 4096), (28672, 4096), (4096, 14336)):      # Llama-8B qkv, gate_up, down
        plan = w4a16_plan(1, n, k, 128, torch.device("cpu"))
        assert plan.block_m == 1 and plan.split_k == 1              # interpreter: one program per tile
        gpu = plan_gemv(n, k, 128, h200)
        programs = -(-n // gpu.block_n) * gpu.split_k
        assert programs >= (PROGRAMS_PER_SM - 1) * h200                # rounding the split may lose a few
        assert gpu.k_per_split % 128 == 0 and gpu.split_k * gpu.k_per_split >= k > (gpu.split_k - 1) * gpu.k_per_split
    assert w4a16_plan(2, 6144, 4096, 128, torch.device("cpu")).block_m == 16


def test_w4a16_gemv_plan_refuses_several_rows():
    w, x, b = _data(3, 40, 128, torch.float32)
    q, scales, zeros, _ = _int4(w, 64)
    with pytest.raises(ValueError, match="one row"):
        w4a16_linear(x, q, scales, zeros, 64, b, plan=plan_gemv(40, 128, 64, sms=1))


def test_w4a16_rejects_group_sizes_the_kernel_cannot_tile():
    with pytest.raises(ValueError, match="group size"):
        w4a16_linear(torch.zeros(1, 48), torch.zeros(4, 24, dtype=torch.uint8), torch.ones(4, 2), torch.zeros(4, 2), 24)


def test_plans_fill_the_gpu_with_column_tiles_before_splitting_k():
    h200 = 132
    qkv = plan_gemm(1, 6144, 4096, 128, h200)                 # Llama-8B qkv at batch 1
    assert (qkv.block_n, qkv.split_k) == (32, 1)              # 192 column tiles: no split, one launch
    small = plan_gemm(1, 576, 1536, 128, h200)                # SmolLM2 down_proj: 36 tiles of 16
    assert small.block_n == 16 and small.split_k > 1
    assert small.split_k * small.k_per_split >= 1536 > (small.split_k - 1) * small.k_per_split
    prefill = plan_gemm(512, 4096, 4096, 128, h200)
    assert (prefill.block_m, prefill.block_n, prefill.split_k) == (64, 128, 1)
