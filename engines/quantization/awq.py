"""Activation-aware INT4 weight quantization (AWQ), written from the paper's recipe.

For each group of linears that share an input (q/k/v after the input norm, gate/up after
the post-attention norm, down after up), input channels that carry large activations are
scaled up before quantization and the inverse scale is folded into the op that produces
that input, so the model is unchanged in exact arithmetic but the important channels lose
less to rounding. The per-channel scale is s = mean|x|^alpha, alpha grid-searched per group
to minimise the group's output error after quantization. Then each linear's quantization
range is clipped per (output row, group), the clip ratio searched the same way.
For o_proj, whose input is the attention output, the scale is folded into v_proj's rows;
with grouped-query attention the query heads sharing a KV head must share that scale, so
it is searched per (KV head, head dim) and repeated over the group.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engines.attention.contiguous import ContiguousAttention
from engines.model import LlamaForCausalLM
from engines.quantization.int4 import Int4Linear, dequantize_int4, quantize_int4

ALPHAS = [i / 10 for i in range(11)]
CLIP_RATIOS = [1.0 - 0.05 * i for i in range(10)]


def _pad(w: torch.Tensor, group: int) -> torch.Tensor:
    return F.pad(w, (0, -w.shape[-1] % group))


def _fake_quant(w: torch.Tensor, group: int) -> torch.Tensor:
    """Round-to-nearest INT4 and back, for [N, K] with K padded as the module will."""
    k = w.shape[1]
    q, s, z = quantize_int4(_pad(w, group), group)
    return dequantize_int4(q, s, z, group)[:, :k]


@torch.no_grad()
def capture_inputs(model: LlamaForCausalLM, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Inputs (fp32, [tokens, in_features]) of every decoder linear over the calibration set."""
    store: dict[str, list[torch.Tensor]] = {}
    hooks = []
    for name, module in model.named_modules():
        if name.startswith("layers.") and name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            hooks.append(module.register_forward_hook(
                lambda _m, args, _out, name=name: store.setdefault(name, []).append(args[0].detach().float())))
    try:
        for ids in sequences:
            attn = ContiguousAttention(model.config, len(ids), model.dtype)
            attn.begin_step(0, len(ids))
            model(torch.tensor(ids), torch.arange(len(ids)), attn)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: torch.cat(chunks) for name, chunks in store.items()}


def search_scale(weight: torch.Tensor, x: torch.Tensor, group: int, tie=None) -> torch.Tensor:
    """Per-input-channel scale minimising || x W^T - x (Q(W s) / s)^T ||^2 over alpha.
    `tie` maps per-channel magnitudes to shared ones (channels that must share a scale)."""
    w = weight.float()
    ref = x @ w.t()
    mean_abs = x.abs().mean(dim=0).clamp_min(1e-6)
    if tie is not None:
        mean_abs = tie(mean_abs)
    best_err, best = float("inf"), torch.ones_like(mean_abs)
    for alpha in ALPHAS:
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        err = float(((x @ (_fake_quant(w * s, group) / s).t() - ref) ** 2).mean())
        if err < best_err:
            best_err, best = err, s
    return best


def clip_and_quantize(weight: torch.Tensor, x: torch.Tensor, group: int):
    """Search a clip ratio per (row, group) on output error; return int4 q, scales, zeros (padded)."""
    w = _pad(weight.float(), group)
    xs = _pad(x, group)
    n, kp = w.shape
    wg = w.view(n, kp // group, group)
    xg = xs.view(xs.shape[0], kp // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    best_err = torch.full((n, kp // group), float("inf"))
    best = wg.clone()
    for ratio in CLIP_RATIOS:
        clipped = torch.maximum(torch.minimum(wg, hi * ratio), lo * ratio)
        q, s, z = quantize_int4(clipped.view(n, kp), group)
        delta = wg - dequantize_int4(q, s, z, group).view(n, kp // group, group)
        err = torch.einsum("tgi,ngi->tng", xg, delta).pow(2).sum(0)          # [N, groups]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better[..., None], clipped, best)
    return quantize_int4(best.view(n, kp), group)


def _tie_gqa(per_channel: torch.Tensor, attn) -> torch.Tensor:
    """Average magnitudes over the query heads that read the same KV head, and repeat."""
    g = attn.n_heads // attn.n_kv
    shared = per_channel.view(attn.n_kv, g, attn.head_dim).mean(dim=1, keepdim=True)
    return shared.expand(attn.n_kv, g, attn.head_dim).reshape(-1)


@torch.no_grad()
def awq_quantize(model: LlamaForCausalLM, sequences: list[list[int]], group_size: int = 128,
                 search_tokens: int = 512, progress: bool = True) -> int:
    """Scale, fold, clip and quantize every decoder linear of `model` in place."""
    acts = capture_inputs(model, sequences)
    gen = torch.Generator().manual_seed(0)
    total = next(iter(acts.values())).shape[0]
    pick = torch.randperm(total, generator=gen)[: min(search_tokens, total)]
    for i, layer in enumerate(tqdm(model.layers, desc=f"AWQ int4 g{group_size}", disable=not progress, leave=False)):
        attn, mlp = layer.self_attn, layer.mlp
        x = {key: acts.pop(f"layers.{i}.{path}")[pick] for key, path in
             (("qkv", "self_attn.qkv_proj"), ("o", "self_attn.o_proj"), ("gate_up", "mlp.gate_up_proj"),
              ("down", "mlp.down_proj"))}
        # Scales, folded into the producer of each input.
        s = search_scale(attn.qkv_proj.weight, x["qkv"], group_size)
        layer.input_layernorm.weight.div_(s)
        attn.qkv_proj.weight.mul_(s.to(attn.qkv_proj.weight.dtype))
        x["qkv"] = x["qkv"] / s
        s = search_scale(attn.o_proj.weight, x["o"], group_size, tie=partial(_tie_gqa, attn=attn))
        v_rows = slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size)
        s_v = s.view(attn.n_kv, attn.n_heads // attn.n_kv, attn.head_dim)[:, 0].reshape(-1)
        attn.qkv_proj.weight[v_rows].div_(s_v.to(attn.qkv_proj.weight.dtype)[:, None])
        if attn.qkv_proj.bias is not None:
            attn.qkv_proj.bias[v_rows].div_(s_v.to(attn.qkv_proj.bias.dtype))
        attn.o_proj.weight.mul_(s.to(attn.o_proj.weight.dtype))
        x["o"] = x["o"] / s
        s = search_scale(mlp.gate_up_proj.weight, x["gate_up"], group_size)
        layer.post_attention_layernorm.weight.div_(s)
        mlp.gate_up_proj.weight.mul_(s.to(mlp.gate_up_proj.weight.dtype))
        x["gate_up"] = x["gate_up"] / s
        s = search_scale(mlp.down_proj.weight, x["down"], group_size)
        mlp.gate_up_proj.weight[mlp.intermediate:].div_(s.to(mlp.gate_up_proj.weight.dtype)[:, None])
        mlp.down_proj.weight.mul_(s.to(mlp.down_proj.weight.dtype))
        x["down"] = x["down"] / s
        # Clip and quantize.
        for parent, attr, key in ((attn, "qkv_proj", "qkv"), (attn, "o_proj", "o"),
                                  (mlp, "gate_up_proj", "gate_up"), (mlp, "down_proj", "down")):
            linear = getattr(parent, attr)
            q, scales, zeros = clip_and_quantize(linear.weight, x[key], group_size)
            setattr(parent, attr, Int4Linear(linear.weight, linear.bias, group_size, q, scales, zeros))
    return 4 * len(model.layers)
