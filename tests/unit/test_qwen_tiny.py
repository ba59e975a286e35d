"""Qwen2 through the HF loader: a tiny random Qwen2ForCausalLM (q/k/v biases, no o_proj bias,
untied head) gives transformers' logits, and its config survives our config.json round trip."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from engines.attention.contiguous import ContiguousAttention
from engines.errors import ModelLoadError
from engines.loaded_model import load_model
from engines.model_config import ModelConfig

VOCAB = 128


def _write_tiny_qwen2(path, seed: int = 0, **overrides):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)).eval()
    with torch.no_grad():   # random norms and biases, so a wiring mistake shows in the logits
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text('{"eos_token": "w2", "bos_token": "w1"}')
    return model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    attn = ContiguousAttention(model.config, ids.numel(), model.dtype)
    attn.begin_step(0, ids.numel())
    return model.compute_logits(model(ids, torch.arange(ids.numel()), attn))


def test_tiny_qwen2_logits_match_transformers(tmp_path):
    ref = _write_tiny_qwen2(tmp_path)
    assert any(n.endswith("q_proj.bias") for n, _ in ref.named_parameters())
    assert not any(n.endswith("o_proj.bias") for n, _ in ref.named_parameters())
    loaded = load_model(tmp_path, "float32")
    cfg = loaded.config
    assert (cfg.architecture, cfg.qkv_bias, cfg.o_proj_bias, cfg.tie_word_embeddings) == ("qwen2", True, False, False)
    assert loaded.model.layers[0].self_attn.o_proj.bias is None
    ids = torch.randint(0, VOCAB, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ref(ids.unsqueeze(0)).logits[0]
    assert (_logits(loaded.model, ids) - expected).abs().max() < 1e-4


def test_qwen2_config_round_trips_as_qwen2(tmp_path):
    _write_tiny_qwen2(tmp_path)
    cfg = ModelConfig.from_hf(json.loads((tmp_path / "config.json").read_text()))
    hf = cfg.to_hf()
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and hf["model_type"] == "qwen2"
    assert ModelConfig.from_hf(hf) == cfg


def test_sliding_window_qwen2_is_refused(tmp_path):
    _write_tiny_qwen2(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="sliding-window"):
        ModelConfig.from_hf({**raw, "use_sliding_window": True})


def test_tojson_in_templates_keeps_key_order_and_text_as_transformers():
    """Qwen's template prints `tools | tojson`: transformers' filter (key order kept, no HTML
    escaping, non-ASCII as is), not jinja's (sorted keys, `<` escaped)."""
    from engines.chat_template import ChatTemplate

    template = ChatTemplate("{{ tools | tojson }}|{{ tools[0] | tojson(indent=1) }}")
    tools = [{"type": "function", "function": {"name": "f", "description": "<b>°C</b>"}}]
    expected = json.dumps(tools, ensure_ascii=False) + "|" + json.dumps(tools[0], ensure_ascii=False, indent=1)
    assert template.render([], tools=tools) == expected
