"""Block-quantized linears (4-bit and 8-bit blocks of 32) with int8 activations per block."""

from __future__ import annotations

import pytest
import torch

from engines.attention.contiguous import ContiguousAttention
from engines.model import LlamaForCausalLM
from engines.model_config import ModelConfig
from engines.model.layers import Linear
from engines.quantization.apply import quantized_linear
from engines.quantization.artifact import load_artifact_into, save_artifact
from engines.quantization.int4 import quantize_int4
from engines.quantization.w4a8 import (BlockQ4Linear, BlockQ8Linear, pack_block_nibbles, quantize_blocks_q8,
                                       unpack_block_nibbles)
from kernels.block_layout import interleave_columns, interleave_q4, interleave_q8
from kernels.cpu_extension import load_cpu_kernels
from kernels.reference_gemm import q4_block_linear_ref, q8_block_linear_ref, quantize_blocks_q8_ref

G = torch.Generator().manual_seed(11)
TINY = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)


def _logits(model: LlamaForCausalLM, n: int) -> torch.Tensor:
    attn = ContiguousAttention(model.config, n, model.dtype)
    attn.begin_step(0, n)
    return model.compute_logits(model(torch.arange(n), torch.arange(n), attn))


def _native():
    native = load_cpu_kernels()
    if native is None:
        pytest.skip("the C++ CPU kernels did not build here (no compiler)")
    return native


def test_nibbles_pack_in_gguf_block_order_and_round_trip():
    q = torch.randint(0, 16, (3, 64), generator=G, dtype=torch.int32)
    packed = pack_block_nibbles(q)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8
    # Block 0's first byte holds element 0 (low) and element 16 (high).
    assert int(packed[0, 0]) == int(q[0, 0]) | (int(q[0, 16]) << 4)
    assert torch.equal(unpack_block_nibbles(packed), q.to(torch.uint8))


def test_reference_activation_blocks_are_independent_and_on_the_grid():
    x = torch.randn(2, 96, generator=G)
    x[0, 32:64] *= 1000.0                       # one block's scale must not touch its neighbours
    x[1, 64:] = 0.0
    q, d, s = quantize_blocks_q8_ref(x)
    assert q.shape == (2, 96) and d.shape == (2, 3) and s.shape == (2, 3)
    assert q[0].view(3, 32).abs().amax(dim=1).tolist() == [127, 127, 127]
    assert torch.equal(q[1, 64:], torch.zeros(32, dtype=torch.int8)) and d[1, 2] == 0 and s[1, 2] == 0
    err = (q.float().view(2, 3, 32) * d[..., None] - x.view(2, 3, 32)).abs()
    assert (err <= d[..., None] / 2 * (1 + 1e-5)).all()
    torch.testing.assert_close(s, d * q.float().view(2, 3, 32).sum(-1))


# Rows: whole row tiles of 4 (AVX2) and 8 (AVX-512, two column groups per register), their
# remainders, and more than one block of 64 rows; 200 columns span several cache chunks.
@pytest.mark.parametrize("rows,cols", [(1, 200), (2, 200), (3, 203), (4, 200), (5, 197), (8, 200), (17, 200),
                                       (70, 203)])
def test_cpu_kernels_equal_the_reference(rows, cols):
    native = _native()
    # fp32 inputs: no value sits on a rounding tie, so kernel and reference quantize identically.
    x = torch.randn(rows, 576, generator=G)
    q_ref, d_ref, s_ref = quantize_blocks_q8_ref(x)
    q, d, s = native.quantize_blocks_q8(x)
    assert torch.equal(q, q_ref)
    torch.testing.assert_close(d, d_ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-6)
    # Column counts that are not a multiple of 8 leave the last group partly empty.
    nibbles = torch.randint(0, 256, (cols, 288), generator=G, dtype=torch.uint8)
    scales, mins = torch.rand(cols, 18, generator=G) * 0.01, torch.randn(cols, 18, generator=G) * 0.01
    bias = torch.randn(cols, generator=G)
    got = native.q4_block_linear(x, interleave_q4(unpack_block_nibbles(nibbles)), interleave_columns(scales),
                                 interleave_columns(mins), bias, cols, False)
    assert got.shape == (rows, cols) and got.dtype == torch.float32
    torch.testing.assert_close(got, q4_block_linear_ref(x, nibbles, scales, mins, bias), rtol=1e-5, atol=1e-5)
    w8 = torch.randint(-127, 128, (cols, 576), generator=G, dtype=torch.int8)
    w8[:, :32] = -127                                # the sign trick at the range's end
    got8 = native.q8_block_linear(x, interleave_q8(w8), interleave_columns(scales), None, cols, False)
    torch.testing.assert_close(got8, q8_block_linear_ref(x, w8, scales, None), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 8, 16])
def test_cpu_q8_kernel_over_a_weight_larger_than_the_caches_equals_the_reference(rows):
    # Past 4 MiB of weights (an output head) the tiles request each next pair of column groups
    # ahead: the products must not change.
    native = _native()
    cols = 8200
    x = torch.randn(rows, 576, generator=G)
    w8 = torch.randint(-127, 128, (cols, 576), generator=G, dtype=torch.int8)
    scales = torch.rand(cols, 18, generator=G) * 0.01
    got = native.q8_block_linear(x, interleave_q8(w8), interleave_columns(scales), None, cols, True)
    torch.testing.assert_close(got, q8_block_linear_ref(x, w8, scales, None), rtol=1e-5, atol=1e-4)


def test_cpu_kernel_takes_bfloat16_activations():
    native = _native()
    x = torch.randn(4, 576, generator=G).to(torch.bfloat16)
    q_ref, _, _ = quantize_blocks_q8_ref(x)
    q, _, _ = native.quantize_blocks_q8(x)
    # Built with -ffast-math: a bf16 value on a rounding tie may land one step away, nothing more.
    assert (q.int() - q_ref.int()).abs().max() <= 1
    assert (q != q_ref).float().mean() < 0.01


@pytest.mark.parametrize("rows", [3, 8, 13])
def test_cpu_kernels_write_bfloat16_as_the_rounded_float32_result(rows):
    native = _native()
    x = torch.randn(rows, 576, generator=G).to(torch.bfloat16)
    cols = 203
    scales, mins = torch.rand(cols, 18, generator=G) * 0.01, torch.randn(cols, 18, generator=G) * 0.01
    bias = torch.randn(cols, generator=G)
    q4 = (interleave_q4(unpack_block_nibbles(torch.randint(0, 256, (cols, 288), generator=G, dtype=torch.uint8))),
          interleave_columns(scales), interleave_columns(mins), bias, cols)
    q8 = (interleave_q8(torch.randint(-127, 128, (cols, 576), generator=G, dtype=torch.int8)),
          interleave_columns(scales), bias, cols)
    for linear, args in ((native.q4_block_linear, q4), (native.q8_block_linear, q8)):
        wide, narrow = linear(x, *args, True), linear(x, *args, False)
        assert wide.dtype == torch.float32 and narrow.dtype == torch.bfloat16
        assert torch.equal(narrow, wide.to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_modules_are_close_to_the_dense_layer_and_keep_rows_independent(kind):
    w = torch.randn(96, 128, generator=G) * 0.05
    bias = torch.randn(96, generator=G)
    layer = (BlockQ4Linear.from_groups(*quantize_int4(w, 32), bias) if kind == "q4"
             else BlockQ8Linear.from_weight(w, bias))
    x = torch.randn(6, 128, generator=G)
    dense = x @ layer.dequantized().t() + bias
    out = layer(x)
    assert out.shape == (6, 96) and out.dtype == torch.float32
    # Only the activations' rounding separates them: <= half a step per value, summed.
    assert (out - dense).abs().max() < 0.05 * dense.abs().max()
    assert torch.allclose(layer(x[2:3]), out[2:3], rtol=1e-5, atol=1e-5)
    err = (layer.dequantized() - w).abs().max()
    assert err < (0.05 if kind == "q4" else 0.005)


def test_w4a8_layer_method_and_width_check():
    dense = Linear(64, 32, True, torch.float32)
    dense.weight.copy_(torch.randn(32, 64, generator=G))
    layer = quantized_linear("w4a8", dense, 128)       # blocks of 32, whatever the group size says
    assert isinstance(layer, BlockQ4Linear) and layer.portable["scales"].shape == (32, 2)
    with pytest.raises(ValueError, match="multiple of 32"):
        BlockQ8Linear.from_weight(torch.randn(4, 48), None)


def test_q8_blocks_give_back_a_q8_0_tensor_exactly():
    q = torch.randint(-127, 128, (8, 64), generator=G, dtype=torch.int8)
    q[:, 0] = 127                                    # Q8_0: each block's largest magnitude is 127
    q[:, 32] = -127
    d = torch.rand(8, 2, generator=G).half().float()
    w = (q.float().view(8, 2, 32) * d[..., None]).view(8, 64)
    q2, d2 = quantize_blocks_q8(w)
    assert torch.equal(q2, q) and torch.equal(d2, d)


def test_artifact_round_trip_keeps_block_layers_and_the_head(tmp_path):
    model = LlamaForCausalLM(TINY, torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=G) * 0.05)
    for name, module in list(model.named_modules()):
        if isinstance(module, Linear) and name.startswith("layers."):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, quantized_linear("w4a8", module, 32))
    model.set_quantized_head(BlockQ8Linear.from_weight(model.embed_tokens.weight, None))
    want = _logits(model, 5)
    save_artifact(model, tmp_path, tmp_path / "art", "w4a8", 32)
    fresh = LlamaForCausalLM(TINY, torch.float32)
    load_artifact_into(fresh, tmp_path / "art")
    fresh.pack_weights()
    assert isinstance(fresh.quantized_head, BlockQ8Linear) and fresh._tied_head is None
    assert isinstance(fresh.layers[0].mlp.gate_up_proj, BlockQ4Linear)
    got = _logits(fresh, 5)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", ["q4", "q8"])
def test_cached_kernel_tensors_follow_the_module_when_it_is_moved(kind):
    w = torch.randn(16, 64, generator=G) * 0.05
    layer = (BlockQ4Linear.from_groups(*quantize_int4(w, 32), None) if kind == "q4"
             else BlockQ8Linear.from_weight(w, None))
    x = torch.randn(3, 64, generator=G)
    before = layer(x)
    # .to() / .cpu() / .share_memory() go through _apply with new tensors; the cached tuple must
    # name the module's current buffers, not the ones it held at the first call.
    layer._apply(lambda t: t.clone())
    assert all(a is b for a, b in zip(layer._kernel_args(), (layer.packed, layer.packed_scales)))
    layer.packed_scales.mul_(2.0)                    # w = scale * q (+ min): doubling both doubles w
    if kind == "q4":
        layer.packed_mins.mul_(2.0)
    torch.testing.assert_close(layer(x), 2.0 * before, rtol=1e-5, atol=1e-6)
