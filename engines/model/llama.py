"""The Llama-family decoder over a flat batch of tokens.

The model sees one step as flat tensors (token ids, positions) and leaves K/V storage to
an attention backend, so batching and paging never reach this file.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.attention import AttentionBackend
from engines.model.layers import Linear, RMSNorm, SwiGLU
from engines.model.rope import RotaryEmbedding
from engines.model_config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.attention_bias, dtype)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, cfg.attention_bias, dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding, attn: AttentionBackend):
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        # Q and K are adjacent columns: rotate them in one pass.
        qk = rope(positions, qkv[:, : self.q_size + self.kv_size].view(t, self.n_heads + self.n_kv, self.head_dim))
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads:]
        v = qkv[:, self.q_size + self.kv_size:].view(t, self.n_kv, self.head_dim)
        out = attn.forward(self.layer, q, k, v)
        return self.o_proj(out.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype)

    def forward(self, x, positions, rope, attn):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.embed_tokens.weight.requires_grad_(False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden_size, cfg.vocab_size, False, dtype)
        self.rope = RotaryEmbedding(cfg, dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, self.rope, attn)
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in fp32 for the rows that need sampling."""
        if self.lm_head is None:
            logits = torch.nn.functional.linear(hidden, self.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        return logits.float()
