"""GPTQ over a whole model, layer by layer.

sequential=True is the paper's order: each decoder layer's Hessians H = x^T x / T are read
from the inputs its linears see when every earlier layer is already quantized, so a layer
compensates the error its inputs actually carry; then the layer is quantized (gptq.py) and its
quantized outputs become the next layer's inputs (two passes of each layer: about two
forwards). sequential=False reads every Hessian in one forward of the unquantized model
(AWQ's capture): on this model both gave the same validation perplexity (+15.7 % vs +15.5 %
at g128) and it takes about 60 % of the time, so it is the default.
"""

from __future__ import annotations

import torch
from tqdm import tqdm

from engines.attention.contiguous import ContiguousAttention
from engines.model import LlamaForCausalLM
from engines.quantization.awq import capture_input_stats
from engines.quantization.gptq import gptq_quantize
from engines.quantization.int4 import Int4Linear

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class _Grams:
    """Sums of x^T x (fp32) and token counts of the hooked linears' inputs."""

    def __init__(self, layer: torch.nn.Module):
        self.sums: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}
        self.hooks = [layer.get_submodule(path).register_forward_hook(
            lambda _m, args, _out, path=path: self._add(path, args[0])) for path in LINEARS]

    def _add(self, path: str, x: torch.Tensor) -> None:
        x = x.detach().float()
        self.sums[path] = self.sums.get(path, 0.0) + x.t() @ x
        self.count[path] = self.count.get(path, 0) + x.shape[0]

    def remove(self) -> None:
        for hook in self.hooks:
            hook.remove()

    def result(self) -> dict[str, torch.Tensor]:
        return {path: self.sums[path] / self.count[path] for path in LINEARS}


@torch.no_grad()
def gptq_quantize_model(model: LlamaForCausalLM, sequences: list[list[int]], group_size: int = 128,
                        progress: bool = True, sequential: bool = False, **gptq_options) -> int:
    """Quantize every decoder linear of `model` in place with GPTQ."""
    if not sequential:
        stats = capture_input_stats(model, sequences)
        for i, layer in enumerate(tqdm(model.layers, desc=f"GPTQ int4 g{group_size}", disable=not progress,
                                       leave=False)):
            _quantize_layer(layer, {path: stats.pop(f"layers.{i}.{path}").gram for path in LINEARS}, group_size,
                            gptq_options)
        return len(LINEARS) * len(model.layers)
    states = []   # per sequence: [residual, hidden, cos, sin, attention buffer]
    for ids in sequences:
        residual = model.embed_tokens(torch.tensor(ids))
        cos, sin = model.rope.tables(torch.arange(len(ids)))
        hidden = model.layers[0].input_layernorm.add_and_norm(residual, None)
        attn = ContiguousAttention(model.config, len(ids), model.dtype)
        attn.begin_step(0, len(ids))
        states.append([residual, hidden, cos, sin, attn])
    layers = model.layers
    for i, layer in enumerate(tqdm(layers, desc=f"GPTQ int4 g{group_size}", disable=not progress, leave=False)):
        next_norm = layers[i + 1].input_layernorm if i + 1 < len(layers) else model.norm
        grams = _Grams(layer)
        try:
            for residual, hidden, cos, sin, attn in states:   # the residual is updated in place: use a copy
                layer(hidden, residual.clone(), cos, sin, attn, next_norm)
        finally:
            grams.remove()
        _quantize_layer(layer, grams.result(), group_size, gptq_options)
        for state in states:
            state[1] = layer(state[1], state[0], state[2], state[3], state[4], next_norm)
    return len(LINEARS) * len(layers)


def _quantize_layer(layer: torch.nn.Module, grams: dict[str, torch.Tensor], group_size: int, options: dict) -> None:
    for path in LINEARS:
        parent_path, _, attr = path.rpartition(".")
        parent = layer.get_submodule(parent_path)
        linear = getattr(parent, attr)
        q, scales, zeros = gptq_quantize(linear.weight, grams[path], group_size, **options)
        setattr(parent, attr, Int4Linear(linear.weight, linear.bias, group_size, q, scales, zeros))
