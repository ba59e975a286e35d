"""GPTQ rounding: lower Hessian-weighted output error than round-to-nearest at the same group
size, weights on the stored INT4 grid, no compensation without input correlation, and a
tiny model quantized sequentially that stays close and round-trips through an artifact."""

from __future__ import annotations

import pytest
import torch

from engines.quantization.awq import InputStats, clip_and_quantize, output_error
from engines.quantization.gptq import gptq_quantize
from engines.quantization.int4 import Int4Linear, dequantize_int4, quantize_int4


def _layer(seed: int, n: int = 48, k: int = 256, tokens: int = 1024, held_out: bool = False):
    """A random weight and correlated inputs with uneven channel magnitudes (as in a model);
    with held_out, also as many other inputs of the same distribution."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(k) + 0.1 * torch.randn(k, k, generator=g)   # correlated channels, as in a model
    scale = 0.2 + 3 * torch.rand(k, generator=g)
    x = torch.randn(2 * tokens, k, generator=g) @ mix * scale
    w = torch.randn(n, k, generator=g) * 0.05
    return (w, x[:tokens], x[tokens:]) if held_out else (w, x[:tokens])


def _error(w, q, s, z, group, gram):
    return output_error(dequantize_int4(q, s, z, group)[:, :w.shape[1]] - w, gram)


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_round_to_nearest_and_clip_search(group, act_order):
    """On the calibration inputs and on other inputs of the same kind (GPTQ fits the first)."""
    w, x, other = _layer(0, held_out=True)
    gram, other_gram = InputStats.of(x).gram, InputStats.of(other).gram
    quantized = {"rtn": quantize_int4(w, group), "clipped": clip_and_quantize(w, gram, group),
                 "gptq": gptq_quantize(w, gram, group, act_order=act_order)}
    for g in (gram, other_gram):
        err = {name: _error(w, *qsz, group, g) for name, qsz in quantized.items()}
        assert err["gptq"] < 0.8 * min(err["rtn"], err["clipped"]), err


def test_gptq_weights_lie_on_the_int4_grid_the_op_reads():
    """Levels are integers 0..15, scales and zeros are exact in bf16 (the op's storage), and
    the module computes x @ dequantized^T; K = 160 is padded to the group as Int4Linear does."""
    w, x = _layer(1, k=160)
    q, s, z = gptq_quantize(w, InputStats.of(x).gram, 64)
    assert q.shape == (48, 192) and q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    assert torch.equal(s, s.bfloat16().float()) and torch.equal(z, z.bfloat16().float())
    deq = dequantize_int4(q, s, z, 64)[:, :160]
    module = Int4Linear(w, None, 64, q, s, z)
    got = module(x[:8].bfloat16()).float()
    want = x[:8].bfloat16().float() @ deq.t()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().mean()))


def test_gptq_without_input_correlation_is_round_to_nearest():
    """With a diagonal Hessian no rounding error can be compensated by another column: GPTQ
    (without clipping) must give exactly min-max round-to-nearest."""
    w, _ = _layer(2, k=192)
    gram = torch.diag(torch.rand(192) + 0.5)
    q, s, z = gptq_quantize(w, gram, 64, clip=False)
    deq = dequantize_int4(q, s, z, 64)
    lo, hi = w.view(48, 3, 64).amin(-1), w.view(48, 3, 64).amax(-1)
    scale = ((hi - lo) / 15).bfloat16().float()
    zero = (lo + 8 * scale).bfloat16().float()
    level = torch.round((w.view(48, 3, 64) - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)
    torch.testing.assert_close(deq, ((level - 8) * scale[..., None] + zero[..., None]).view(48, 192))


@pytest.mark.parametrize("sequential", [False, True])
def test_gptq_tiny_model_stays_close_and_round_trips(tmp_path, sequential):
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization.artifact import save_artifact
    from engines.quantization.gptq_model import gptq_quantize_model
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src", intermediate_size=128)
    ref = load_model(tmp_path / "src", "bfloat16")
    loaded = load_model(tmp_path / "src", "bfloat16")
    calib = [list(range(1, 60)), list(range(60, 120))]
    assert gptq_quantize_model(loaded.model, calib, group_size=32, progress=False, sequential=sequential) == 8
    assert isinstance(loaded.model.layers[1].self_attn.o_proj, Int4Linear)
    save_artifact(loaded.model, loaded.path, tmp_path / "q", "int4-gptq", 32)
    reloaded = load_model(tmp_path / "q", "bfloat16")
    ids = torch.arange(3, 40)

    def logits(model):
        attn = ContiguousAttention(model.config, len(ids), torch.bfloat16)
        attn.begin_step(0, len(ids))
        return model.compute_logits(model(ids, torch.arange(len(ids)), attn))

    a, b = logits(ref.model), logits(loaded.model)
    assert (a - b).abs().mean() < 0.1 * a.abs().mean()
    assert torch.equal(b, logits(reloaded.model))
