"""Every decoder layer in one C++ call, for models whose linears are all block-quantized.

A block-quantized layer on the CPU is ~11 C++ ops dispatched from Python (projections, rope,
KV write, attention, norms, SiLU); at batch 1 the dispatches cost about as much as the
arithmetic. `kernels/cpu/decoder_layer.cpp` makes the same calls in the same order from one
entry point, so a step computes the same numbers bit for bit with one dispatch per layer.

Steps the fused layer does not cover take the Python layers: attention other than the C++
paged kernels (Triton, the torch reference, INT4/FP8 KV), and steps of at least as many rows as
a linear's dense prefill copy serves (the Python linear switches to it there).
"""

from __future__ import annotations

import torch

from engines.attention.paged import PagedAttention
from kernels.cpu_extension import load_cpu_kernels
from kernels.dispatch import AttentionOps

NATIVE_DTYPES = (torch.float32, torch.bfloat16)


class FusedDecoder:
    def __init__(self, model, native):
        cfg = model.config
        self.native = native
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.dtype = model.dtype
        layers = model.layers
        norms = [layer.input_layernorm for layer in layers] + [model.norm]
        self.eps = layers[0].post_attention_layernorm.eps
        self.layers = []
        dense_rows = []
        for i, layer in enumerate(layers):
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
            forms = [linear.fused_form() for linear in linears]
            dense_rows += [linear.dense_min_rows for linear in linears if linear.dense is not None]
            self.layers.append(([tensors for _, tensors in forms], [kind for kind, _ in forms],
                                [linear.out_features for linear in linears],
                                layer.post_attention_layernorm.weight, norms[i + 1].weight))
        self.dense_from = min(dense_rows, default=None)    # the fewest rows any linear's dense copy takes

    def takes(self, attn, rows: int) -> bool:
        """Whether this step's attention and size are the ones the fused layer computes."""
        if self.dense_from is not None and rows >= self.dense_from:
            return False
        if not isinstance(attn, PagedAttention) or attn.ops.native is None or attn.ops.triton is not None:
            return False
        k_pool = attn.pool.k
        if k_pool.dtype == self.dtype:
            return True
        return k_pool.dtype == torch.int8 and AttentionOps.native_quantized_shape_ok(
            self.head_dim, self.heads // self.kv_heads, k_pool.shape[4], self.dtype)

    def run(self, hidden: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            attn: PagedAttention) -> torch.Tensor:
        """hidden = the first input norm of `residual`; returns the final norm's output."""
        meta, pool = attn.meta, attn.pool
        scale = self.head_dim ** -0.5
        for i, (linears, kinds, widths, post_norm, next_norm) in enumerate(self.layers):
            scales = pool.scales(i)
            kv = [pool.k[i], pool.v[i]] if scales is None else [pool.k[i], pool.v[i], *scales]
            hidden = self.native.decoder_layer_blocks(
                hidden, residual, cos, sin, linears, kinds, widths, post_norm, next_norm, self.eps, self.heads,
                self.kv_heads, self.head_dim, kv, meta.slot_mapping, meta.block_tables, meta.seq_of_token,
                meta.context_lens, scale)
        return hidden


def attach_fused_decoder(model) -> None:
    """Give `model` a FusedDecoder when every decoder linear is block-quantized, its weights are
    on the CPU in fp32 or bf16 and the C++ kernels built; else none. Call it again after the
    linears change (quantization, a dense prefill copy attached, a move)."""
    model.fused_decoder = None
    if model.dtype not in NATIVE_DTYPES or model.embed_tokens.weight.device.type != "cpu":
        return
    for layer in model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                       layer.mlp.down_proj):
            if getattr(linear, "fused_form", None) is None:
                return
    norms = {layer.input_layernorm.eps for layer in model.layers} | {layer.post_attention_layernorm.eps
                                                                     for layer in model.layers} | {model.norm.eps}
    native = load_cpu_kernels()
    if native is None or len(norms) != 1:
        return
    model.fused_decoder = FusedDecoder(model, native)
