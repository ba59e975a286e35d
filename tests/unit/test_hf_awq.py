"""Loading ready-made AWQ checkpoints (Hugging Face / AutoAWQ GEMM layout)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from engines.attention.contiguous import ContiguousAttention
from engines.loaded_model import load_model
from engines.loaders.hf_awq import AWQ_ORDER, pack_awq, unpack_awq
from engines.model.weights import load_hf_state_dict
from engines.quantization.int4 import Int4Linear
from tests.tiny_models import write_tiny_checkpoint

GROUP = 32
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def test_pack_order_matches_the_gemm_layout():
    values = torch.arange(16).remainder(16).view(1, 16).to(torch.int32)
    packed = pack_awq(values)
    # The AutoAWQ GEMM format: nibble i of each int32 holds column (0, 2, 4, 6, 1, 3, 5, 7)[i]
    # of its group of eight (written out here, not taken from the module under test).
    first = int(packed[0, 0]) & 0xFFFFFFFF
    assert [(first >> (4 * i)) & 15 for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    assert torch.equal(unpack_awq(packed), values)


def _awq_quantize(w: torch.Tensor):
    """AutoAWQ's convention: s = (max - min) / 15, integer zero z, w ~= (q - z) s. w is [out, in]."""
    wt = w.t().float()                                                  # [in, out]
    g = wt.view(-1, GROUP, wt.shape[1])
    lo, hi = g.amin(1), g.amax(1)
    s = ((hi - lo) / 15).clamp_min(1e-5)
    z = torch.round(-lo / s).clamp(0, 15)
    q = torch.clamp(torch.round(g / s[:, None]) + z[:, None], 0, 15)
    deq = ((q - z[:, None]) * s[:, None]).view_as(wt).t()
    return q.view_as(wt).to(torch.int32), z.to(torch.int32), s.half(), deq


def test_awq_checkpoint_loads_and_matches_its_dequantized_weights(tmp_path):
    ref_model = write_tiny_checkpoint(tmp_path / "dense", intermediate_size=128)
    tensors = load_file(str(tmp_path / "dense" / "model.safetensors"))
    awq_dir = tmp_path / "awq"
    awq_dir.mkdir()
    awq, dense_deq = {}, dict(tensors)
    for name, t in tensors.items():
        if any(name.endswith(f"{lin}.weight") for lin in LINEARS):
            base = name.removesuffix(".weight")
            q, z, s, deq = _awq_quantize(t)
            awq[f"{base}.qweight"] = pack_awq(q)
            awq[f"{base}.qzeros"] = pack_awq(z)
            awq[f"{base}.scales"] = s
            dense_deq[name] = deq
        else:
            awq[name] = t
    save_file(awq, str(awq_dir / "model.safetensors"))
    config = json.loads((tmp_path / "dense" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP,
                                     "version": "gemm", "zero_point": True}
    (awq_dir / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (awq_dir / f).write_text((tmp_path / "dense" / f).read_text())
    loaded = load_model(awq_dir, "bfloat16")
    assert loaded.quantization == f"awq-checkpoint-g{GROUP}"
    assert isinstance(loaded.model.layers[1].self_attn.qkv_proj, Int4Linear)
    # Reference: transformers on the same weights, dequantized.
    ref_model.load_state_dict({k: v for k, v in dense_deq.items()}, strict=False)
    ids = torch.arange(4, 36)
    attn = ContiguousAttention(loaded.config, len(ids), torch.bfloat16)
    attn.begin_step(0, len(ids))
    ours = loaded.model.compute_logits(loaded.model(ids, torch.arange(len(ids)), attn))
    with torch.no_grad():
        theirs = ref_model(ids.unsqueeze(0)).logits[0].float()
    # Our INT4 path runs in bf16: its distance to transformers in fp32 is judged relative to that of
    # a plain bf16 model holding the same dequantized weights, on the same machine (how far bf16
    # lands from fp32 depends on the CPU's bf16 GEMMs). Measured about 1x; a wrong nibble order,
    # zero or scale gives errors of the logits' own size.
    plain = load_model(tmp_path / "dense", "bfloat16")
    load_hf_state_dict(plain.model, dense_deq)
    plain.model.pack_weights()
    attn = ContiguousAttention(plain.config, len(ids), torch.bfloat16)
    attn.begin_step(0, len(ids))
    with torch.no_grad():
        bf16 = plain.model.compute_logits(plain.model(ids, torch.arange(len(ids)), attn)).float()
    err, bf16_err = (ours.float() - theirs).abs(), (bf16 - theirs).abs()
    assert bf16_err.max() > 0, "the bf16 model computed in fp32: the comparison proves nothing"
    assert err.mean() <= 2 * bf16_err.mean() and err.max() <= 2 * bf16_err.max(), (err.mean(), bf16_err.mean())
    assert err.mean() < 0.1 * theirs.abs().mean()          # and bf16 itself is close (a loose sanity bound)
