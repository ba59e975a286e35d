"""How exact INT4-as-loaded is on the real Qwen2.5-Coder GGUF: for each of its 12 Q4_K tensors
(the down projections of half the layers), our INT4 g32 weight against gguf's own dequantization
to fp32. The portable form (fp32 scale and zero: the Triton path and artifacts) equals it to fp32
rounding; the CPU op keeps (scale, zero) in bf16, which moves a weight by at most ~5 % of its
group's quantization step (measured max 3.3e-3 absolute, mean 1.5e-5, on weights up to ~0.85)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engines.quantization.gguf_int4 import read_int4_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pairs(qwen_gguf):
    ours = read_int4_weights(qwen_gguf)
    reader = gguf.GGUFReader(str(qwen_gguf))
    out = []
    for t in reader.tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.Q4_K:
            ref = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
            out.append((t.name, ours[f"model.layers.{t.name.split('.')[1]}.mlp.down_proj.weight"], ref))
    return out


def test_the_q4k_tensors_are_the_down_projections(pairs):
    assert len(pairs) == 12 and all(name.endswith("ffn_down.weight") for name, _, _ in pairs)


def test_portable_int4_equals_the_gguf_dequantization(pairs):
    for name, groups, ref in pairs:
        assert groups.q.shape == ref.shape
        assert (groups.dequantized() - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * ref.abs().max(), name


def test_bf16_scales_of_the_cpu_op_move_weights_by_a_small_part_of_a_step(pairs):
    for name, g, ref in pairs:
        n, k = g.q.shape
        s, z = g.scales.to(torch.bfloat16).float(), g.zeros.to(torch.bfloat16).float()
        w = ((g.q.float().view(n, k // 32, 32) - 8) * s[..., None] + z[..., None]).view(n, k)
        err = (w - ref).abs()
        assert err.max() < 5e-3 and err.mean() < 5e-5, name
        # Relative to each group's step (its scale), leaving out groups whose scale is ~0 (constant groups).
        step = g.scales[..., None].expand(n, k // 32, 32).reshape(n, k)
        live = step > 1e-4
        assert (err[live] / step[live]).max() < 0.06, name
