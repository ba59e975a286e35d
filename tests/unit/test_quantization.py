"""Weight quantization: round trips within the format's error, modules equal their
dequantized weights, and a quantized tiny model stays close to the original."""

from __future__ import annotations

import pytest
import torch

from engines.quantization.fp8 import Fp8Linear, quantize_fp8
from engines.quantization.int4 import Int4Linear, dequantize_int4, quantize_int4
from engines.quantization.int8 import Int8Linear, quantize_int8

G = torch.Generator().manual_seed(0)
W = torch.randn(96, 256, generator=G)
X = torch.randn(5, 256, generator=G)


def test_int8_round_trip_error_is_half_a_step():
    q, scales = quantize_int8(W)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    err = (q.float() * scales[:, None] - W).abs()
    assert (err <= scales[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_round_trip_error_is_half_a_step(group):
    q, scales, zeros = quantize_int4(W, group)
    assert q.min() >= 0 and q.max() <= 15
    err = (dequantize_int4(q, scales, zeros, group) - W).abs().view(96, -1, group)
    assert (err <= scales[..., None] / 2 + 1e-5).all()


def test_int4_rejects_group_sizes_that_do_not_divide():
    with pytest.raises(ValueError, match="group size"):
        quantize_int4(W[:, :96], 64)


@pytest.mark.parametrize("make,tol", [
    (lambda w, b: Int8Linear(w, b), 0.1),
    (lambda w, b: Int4Linear(w, b, 64), 0.1),
    (lambda w, b: Fp8Linear(w, b), 0.1),
])
def test_modules_equal_their_dequantized_weights(make, tol):
    bias = torch.randn(96, generator=G)
    module = make(W, bias)
    if isinstance(module, Int8Linear):
        ref_w = module.dequantized()
    elif isinstance(module, Int4Linear):
        q, s, z = quantize_int4(W, 64)
        ref_w = dequantize_int4(q, s.bfloat16().float(), z.bfloat16().float(), 64)
    else:
        q, s = quantize_fp8(W)
        ref_w = q.float() * s[:, None]
    want = X.bfloat16().float() @ ref_w.t() + bias
    got = module(X.bfloat16()).float()
    assert (got - want).abs().max().item() < tol * want.abs().max().item()


def test_int4_pads_inputs_that_groups_do_not_divide():
    w = torch.randn(64, 576, generator=G)                        # 576 = 4.5 x 128, like SmolLM2
    module = Int4Linear(w, None, 128)
    assert module.padded_in == 640 and module.in_features == 576
    x = torch.randn(3, 576, generator=G).bfloat16()
    q, s, z = quantize_int4(torch.nn.functional.pad(w, (0, 64)), 128)
    deq = dequantize_int4(q, s.bfloat16().float(), z.bfloat16().float(), 128)
    want = x.float() @ deq[:, :576].t()
    got = module(x).float()
    assert (got - want).abs().max() < 0.02 * want.abs().max()


@pytest.mark.parametrize("method", ["int8", "int4-rtn", "fp8", "w8a8"])
def test_quantized_tiny_model_stays_close(tmp_path, method):
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization import quantize_model, weight_bytes
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path, intermediate_size=128)
    ref = load_model(tmp_path, "bfloat16").model
    quant = load_model(tmp_path, "bfloat16").model
    assert quantize_model(quant, method, group_size=32, progress=False) == 2 * 4
    assert weight_bytes(quant) < weight_bytes(ref)
    ids = torch.arange(1, 25)

    def logits(model):
        attn = ContiguousAttention(model.config, 24, torch.bfloat16)
        attn.begin_step(0, 24)
        return model.compute_logits(model(ids, torch.arange(24), attn))

    a, b = logits(ref), logits(quant)
    assert (a - b).abs().mean() < 0.1 * a.abs().mean()


def test_awq_scale_search_beats_plain_rounding_on_outlier_channels():
    """With a few input channels carrying large activations, the searched scale lowers the
    output error of INT4 rounding (AWQ's premise); alpha = 0 would reproduce plain RTN."""
    from engines.quantization.awq import InputStats, _fake_quant, search_scale

    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=g)
    x = torch.randn(512, 256, generator=g)
    x[:, :8] *= 30.0                                            # salient channels
    ref = x @ w.t()
    rtn_err = ((x @ _fake_quant(w, 64).t() - ref) ** 2).mean()
    s = search_scale(w, InputStats.of(x), 64)
    awq_err = ((x @ (_fake_quant(w * s, 64) / s).t() - ref) ** 2).mean()
    assert awq_err < 0.8 * rtn_err


def test_awq_clip_search_never_worse_than_no_clipping():
    from engines.quantization.awq import InputStats, clip_and_quantize
    from engines.quantization.int4 import dequantize_int4

    g = torch.Generator().manual_seed(2)
    w = torch.randn(32, 128, generator=g)
    w[0, 5] = 12.0                                              # an outlier weight stretches its group
    x = torch.randn(256, 128, generator=g)
    ref = x @ w.t()
    q, s, z = quantize_int4(w, 64)
    plain = ((x @ dequantize_int4(q, s, z, 64).t() - ref) ** 2).sum()
    q, s, z = clip_and_quantize(w, InputStats.of(x).gram, 64)
    clipped = ((x @ dequantize_int4(q, s, z, 64).t() - ref) ** 2).sum()
    assert clipped <= plain


def test_input_stats_give_the_activations_output_error_and_follow_the_folded_scale():
    """sum((D H) * D) with H = x^T x / T is the mean squared output error ||x D^T||^2 / T, and
    the statistics of x / s follow from those of x (the searches never keep activations)."""
    from engines.quantization.awq import InputStats, output_error

    g = torch.Generator().manual_seed(4)
    x = torch.randn(300, 48, generator=g) * torch.rand(48, generator=g) * 3
    d = torch.randn(20, 48, generator=g) * 0.01
    stats = InputStats.of(x)
    direct = float(((x @ d.t()) ** 2).sum()) / x.shape[0]
    assert abs(output_error(d, stats.gram) - direct) < 1e-4 * direct
    s = torch.rand(48, generator=g) + 0.5
    folded, fresh = stats.divided_by(s), InputStats.of(x / s)
    torch.testing.assert_close(folded.gram, fresh.gram, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(folded.mean_abs, fresh.mean_abs)


def test_captured_input_stats_cover_every_calibration_token(tmp_path):
    """capture_input_stats equals the statistics of the inputs a hook sees, over all sequences."""
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization.awq import InputStats, capture_input_stats
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path, intermediate_size=128)
    model = load_model(tmp_path, "float32").model
    sequences = [list(range(1, 40)), list(range(50, 61))]
    stats = capture_input_stats(model, sequences)
    assert len(stats) == 4 * len(model.layers)
    seen = []
    hook = model.layers[1].mlp.down_proj.register_forward_hook(lambda _m, args, _o: seen.append(args[0].clone()))
    for ids in sequences:
        attn = ContiguousAttention(model.config, len(ids), torch.float32)
        attn.begin_step(0, len(ids))
        model(torch.tensor(ids), torch.arange(len(ids)), attn)
    hook.remove()
    want = InputStats.of(torch.cat(seen))
    got = stats["layers.1.mlp.down_proj"]
    torch.testing.assert_close(got.gram, want.gram, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.mean_abs, want.mean_abs, rtol=1e-5, atol=1e-6)


def test_awq_on_tiny_model_keeps_it_close(tmp_path):
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization.awq import awq_quantize
    from engines.quantization.int4 import Int4Linear
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path, intermediate_size=128)
    ref = load_model(tmp_path, "bfloat16").model
    quant = load_model(tmp_path, "bfloat16").model
    calib = [list(range(1, 60)), list(range(60, 120))]
    assert awq_quantize(quant, calib, group_size=32, progress=False) == 8
    assert isinstance(quant.layers[0].mlp.down_proj, Int4Linear)
    ids = torch.arange(3, 40)

    def logits(model):
        attn = ContiguousAttention(model.config, len(ids), torch.bfloat16)
        attn.begin_step(0, len(ids))
        return model.compute_logits(model(ids, torch.arange(len(ids)), attn))

    a, b = logits(ref), logits(quant)
    assert (a - b).abs().mean() < 0.1 * a.abs().mean()


@pytest.mark.parametrize("method", ["int8", "int4-rtn", "int4-awq", "fp8", "w8a8"])
def test_artifact_round_trip_gives_identical_logits(tmp_path, method):
    """Saved and reloaded, a quantized model computes exactly what it did in memory."""
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization import quantize_model
    from engines.quantization.artifact import save_artifact
    from engines.quantization.awq import awq_quantize
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src", intermediate_size=128)
    (tmp_path / "src" / "generation_config.json").write_text('{"eos_token_id": [3, 7]}')
    loaded = load_model(tmp_path / "src", "bfloat16")
    if method == "int4-awq":
        awq_quantize(loaded.model, [list(range(1, 50))], group_size=32, progress=False)
    else:
        quantize_model(loaded.model, method, group_size=32, progress=False)
    save_artifact(loaded.model, loaded.path, tmp_path / "q", method, 32)
    reloaded = load_model(tmp_path / "q", "bfloat16")
    assert reloaded.quantization == f"{method}-g32"
    assert {3, 7} <= reloaded.tokenizer.eos_token_ids == loaded.tokenizer.eos_token_ids    # where generation ends
    ids = torch.arange(2, 30)

    def logits(model):
        attn = ContiguousAttention(model.config, len(ids), torch.bfloat16)
        attn.begin_step(0, len(ids))
        return model.compute_logits(model(ids, torch.arange(len(ids)), attn))

    assert torch.equal(logits(loaded.model), logits(reloaded.model))


def test_quantize_cli_and_cached_tier_artifact(tmp_path):
    import subprocess
    import sys

    from engines.quantization.artifact_cache import ensure_quantized
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src", intermediate_size=128)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "quantize", "--method", "int8", "--model",
                           str(tmp_path / "src"), "--out", str(out)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert (out / "quantization_config.json").is_file() and (out / "tokenizer.json").is_file()
    first = ensure_quantized(str(tmp_path / "src"), "int4-rtn", 32, cache_root=tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = ensure_quantized(str(tmp_path / "src"), "int4-rtn", 32, cache_root=tmp_path / "cache")
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp


def test_awq_scale_folding_preserves_the_function(tmp_path, monkeypatch):
    """With rounding switched off, AWQ's scaled and folded model equals the original: the
    scales moved into norms, v_proj rows (shared per KV head) and up_proj rows cancel out."""
    from engines.attention.contiguous import ContiguousAttention
    from engines.loaded_model import load_model
    from engines.quantization import awq
    from tests.tiny_models import write_tiny_checkpoint

    class Unrounded(torch.nn.Module):
        def __init__(self, weight, bias, *_args, **_kwargs):
            super().__init__()
            self.weight, self.bias = weight.detach().clone(), bias

        def forward(self, x):
            return torch.nn.functional.linear(x, self.weight, self.bias)

    monkeypatch.setattr(awq, "Int4Linear", Unrounded)
    monkeypatch.setattr(awq, "clip_and_quantize", lambda *_args: (None, None, None))
    write_tiny_checkpoint(tmp_path, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    ref = load_model(tmp_path, "float32").model
    folded = load_model(tmp_path, "float32").model
    awq.awq_quantize(folded, [list(range(1, 60))], group_size=32, progress=False)
    assert not torch.equal(folded.layers[0].input_layernorm.weight, ref.layers[0].input_layernorm.weight)
    ids = torch.arange(5, 45)

    def logits(model):
        attn = ContiguousAttention(model.config, len(ids), torch.float32)
        attn.begin_step(0, len(ids))
        return model.compute_logits(model(ids, torch.arange(len(ids)), attn))

    torch.testing.assert_close(logits(folded), logits(ref), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_cpu_paths_equal_the_dequantized_weight(rows, dtype):
    """Decode-sized inputs (<= 8 rows) take the fused C++ kernel, larger ones the exact bf16
    conversion + GEMM; both compute x (q * scale)^T with the scale applied to the output.
    K = 200 is not a multiple of 16, so the kernel's scalar tail runs too."""
    from kernels.cpu_extension import load_cpu_kernels

    native = load_cpu_kernels()
    assert native is not None
    g = torch.Generator().manual_seed(3)
    w = torch.randn(72, 200, generator=g) * torch.rand(72, 1, generator=g)
    w[5, 7] = 1e-6                                                   # an e4m3 subnormal after scaling
    module = Fp8Linear(w, None)
    assert torch.equal(native.fp8_to_bf16(module.qweight).float(), module.qweight.float())   # exact
    x = torch.randn(rows, 200, generator=g).to(dtype)
    want = x.float() @ module.dequantized().t()
    got = module(x)
    assert got.dtype == dtype and got.shape == (rows, 72)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert (got.float() - want).abs().max() <= tol * want.abs().max()


def test_cached_artifact_is_rebuilt_when_the_algorithm_version_changes(tmp_path, monkeypatch):
    """The cache key holds each method's algorithm version, so a changed algorithm never
    silently reuses an artifact an older version built."""
    import json

    from engines.quantization import build
    from engines.quantization.artifact_cache import ensure_quantized
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src", intermediate_size=128)
    first = ensure_quantized(str(tmp_path / "src"), "int4-rtn", 32, cache_root=tmp_path / "cache")
    assert json.loads((first / "quantization_config.json").read_text())["algorithm_version"] == 1
    monkeypatch.setitem(build.ALGORITHM_VERSIONS, "int4-rtn", 2)
    second = ensure_quantized(str(tmp_path / "src"), "int4-rtn", 32, cache_root=tmp_path / "cache")
    assert second != first and json.loads((second / "quantization_config.json").read_text())["algorithm_version"] == 2


def test_an_artifact_another_process_finished_first_is_used(tmp_path, monkeypatch):
    """Two gateways starting together build the same artifact: the one that renames second
    finds the first one's complete artifact and uses it, instead of failing its tier."""
    import engines.quantization.artifact_cache as cache
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src", intermediate_size=128)
    real_build = cache.quantize_to_dir
    target = cache.artifact_dir(str(tmp_path / "src"), "int8", 128, tmp_path / "cache")

    def build_while_another_finishes(source, method, group_size, out_dir, calibration=None):
        real_build(source, method, group_size, target, calibration)      # the other process, done first
        return real_build(source, method, group_size, out_dir, calibration)

    monkeypatch.setattr(cache, "quantize_to_dir", build_while_another_finishes)
    assert cache.ensure_quantized(str(tmp_path / "src"), "int8", 128, cache_root=tmp_path / "cache") == target
    assert cache.is_quantized_dir(target)
    assert [p.name for p in (tmp_path / "cache" / "quantized").iterdir()] == [target.name]   # no temp left


def test_every_setting_of_a_method_is_part_of_its_cache_key(tmp_path, monkeypatch):
    from engines.quantization import build
    from engines.quantization.artifact_cache import artifact_dir
    from engines.quantization.calibration import CalibrationSource
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src")
    text = CalibrationSource("some text", lambda: [])
    where = lambda method, calib=text: artifact_dir(str(tmp_path / "src"), method, 64, tmp_path, calib)
    gptq, awq, rtn = where("int4-gptq"), where("int4-awq"), where("int4-rtn")
    assert where("int4-awq", CalibrationSource("other text", lambda: [])) != awq
    monkeypatch.setitem(build.GPTQ_OPTIONS, "damp", 0.01)
    monkeypatch.setitem(build.AWQ_CALIBRATION, "n", 32)
    assert where("int4-gptq") != gptq and where("int4-awq") != awq and where("int4-rtn") == rtn


def test_a_calibrated_method_without_calibration_text_is_refused(tmp_path):
    from engines.quantization.artifact_cache import ensure_quantized
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "src")
    with pytest.raises(ValueError, match="calibration"):
        ensure_quantized(str(tmp_path / "src"), "int4-awq", 64, cache_root=tmp_path / "cache")
