"""The Llama-family decoder (Llama, Mistral, Qwen2: see engines/model_config.py's ARCHITECTURES)
over a flat batch of tokens.

The model sees one step as flat tensors (token ids, positions) and leaves K/V storage to
an attention backend, so batching and paging never reach this file.
"""

from __future__ import annotations

import torch
from torch import nn

from engines.attention import AttentionBackend
from engines.model.fused_decoder import FusedDecoder
from engines.model.layers import Linear, RMSNorm, SwiGLU
from kernels.fused import rope_split_qkv
from kernels.linear import PackedWeight
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
        self.qkv_proj = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, cfg.qkv_bias, dtype)
        self.o_proj = Linear(cfg.q_size, cfg.hidden_size, cfg.o_proj_bias, dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: AttentionBackend):
        t = x.shape[0]
        q, k, v = rope_split_qkv(self.qkv_proj(x), cos, sin, self.n_heads, self.n_kv, self.head_dim)
        out = attn.forward(self.layer, q, k, v)
        return self.o_proj(out.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, dtype)

    def forward(self, hidden, residual, cos, sin, attn, next_norm: RMSNorm):
        """hidden = input_layernorm(residual). Adds this layer's two outputs into `residual`
        in place and returns next_norm(residual) for the next layer (or the final norm)."""
        hidden = self.post_attention_layernorm.add_and_norm(residual, self.self_attn(hidden, cos, sin, attn))
        return next_norm.add_and_norm(residual, self.mlp(hidden))


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
        self._tied_head: PackedWeight | None = None
        # A block-quantized output head (quantization/w4a8.py) that replaces the tied or untied
        # one, when the quantization method brings one.
        self.quantized_head: nn.Module | None = None
        # Every layer in one C++ call when all linears are block-quantized (fused_decoder.py).
        self.fused_decoder: FusedDecoder | None = None

    def pack_weights(self) -> None:
        """Prepack every GEMM weight once the checkpoint is loaded (see kernels/linear.py)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        if self.lm_head is None and self.quantized_head is None:
            self._tied_head = PackedWeight(self.embed_tokens.weight)

    def set_quantized_head(self, head: nn.Module) -> None:
        """Compute logits with `head` (a block-quantized head with `forward_float`): the packed
        copy of a tied embedding is then dead weight, and goes."""
        self.quantized_head = head
        self._tied_head = None

    def share_embedding_with(self, other: LlamaForCausalLM) -> None:
        """Read token embeddings from `other`'s table, and when `other`'s head is tied to it,
        logits from `other`'s packed head too (else this model keeps its own head): a draft
        derived from `other` then holds no second copy of the unquantized embedding. Call it
        once both models are packed and on their device, since packing makes the tied head."""
        if (other.config.vocab_size, other.config.hidden_size) != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError("models with different vocabularies or hidden sizes cannot share an embedding")
        self.embed_tokens = other.embed_tokens
        if other._tied_head is not None:
            self._tied_head = other._tied_head

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden]."""
        residual = self.embed_tokens(input_ids)
        cos, sin = self.rope.tables(positions)
        layers = self.layers
        hidden = layers[0].input_layernorm.add_and_norm(residual, None)
        fused = self.fused_decoder
        if fused is not None and fused.takes(attn, input_ids.shape[0]):
            return fused.run(hidden, residual, cos, sin, attn)
        for i, layer in enumerate(layers):
            next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else self.norm
            hidden = layer(hidden, residual, cos, sin, attn, next_norm)
        return hidden

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits in fp32 for the rows that need sampling."""
        if self.quantized_head is not None:
            return self.quantized_head.forward_float(hidden)
        if self._tied_head is not None:
            logits = self._tied_head.linear(hidden)
        elif self.lm_head is None:
            logits = torch.nn.functional.linear(hidden, self.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        return logits.float()
