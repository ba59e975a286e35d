"""Activation-aware INT4 weight quantization (AWQ), written from the paper's recipe.

For each group of linears that share an input (q/k/v after the input norm, gate/up after
the post-attention norm, down after up), input channels that carry large activations are
scaled up before quantization and the inverse scale is folded into the op that produces
that input, so the model is unchanged in exact arithmetic but the important channels lose
less to rounding. The per-channel scale is s = mean|x|^alpha, alpha grid-searched per group
to minimise the group's output error after quantization. Then each linear's quantization
range is clipped per (output row, group), the clip ratio searched the same way.
The output error of a weight error D over calibration inputs x is ||x D^T||^2 = tr(D H D^T)
with H = x^T x: the searches read H and mean|x| per linear, accumulated over every
calibration token, instead of keeping the activations. (Searching on a 512-token sample
instead was far worse: see docs/BENCHMARKS.md.)
For o_proj, whose input is the attention output, the scale is folded into v_proj's rows;
with grouped-query attention the query heads sharing a KV head must share that scale, so
it is searched per (KV head, head dim) and repeated over the group.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class InputStats:
    """What the searches need from a linear's calibration inputs x [T, K]: the second moment
    H = x^T x / T (so a weight error D costs ||x D^T||^2 / T = sum((D H) * D), whatever T is)
    and mean |x| per channel."""
    gram: torch.Tensor       # [K, K] fp32
    mean_abs: torch.Tensor   # [K]

    @classmethod
    def of(cls, x: torch.Tensor) -> InputStats:
        x = x.float()
        return cls(x.t() @ x / x.shape[0], x.abs().mean(dim=0))

    def divided_by(self, s: torch.Tensor) -> InputStats:
        """The statistics of x / s (after s is folded into the producer of x)."""
        return InputStats(self.gram / (s[:, None] * s[None, :]), self.mean_abs / s)


def output_error(delta: torch.Tensor, gram: torch.Tensor) -> float:
    return float(((delta @ gram) * delta).sum())


@torch.no_grad()
def capture_input_stats(model: LlamaForCausalLM, sequences: list[list[int]]) -> dict[str, InputStats]:
    """InputStats of every decoder linear over the calibration set, accumulated per sequence
    (x^T x in the model's dtype with fp32 sums), so every calibration token counts and memory
    does not grow with the calibration text."""
    sums: dict[str, list] = {}
    hooks = []

    def accumulate(name, x):
        x = x.detach()
        entry = sums.setdefault(name, [0.0, 0.0, 0])
        entry[0] = entry[0] + (x.t() @ x).float()
        entry[1] = entry[1] + x.float().abs().sum(dim=0)
        entry[2] += x.shape[0]

    for name, module in model.named_modules():
        if name.startswith("layers.") and name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            hooks.append(module.register_forward_hook(lambda _m, args, _out, name=name: accumulate(name, args[0])))
    try:
        for ids in sequences:
            attn = ContiguousAttention(model.config, len(ids), model.dtype)
            attn.begin_step(0, len(ids))
            model(torch.tensor(ids), torch.arange(len(ids)), attn)
    finally:
        for hook in hooks:
            hook.remove()
    return {name: InputStats(g / n, a / n) for name, (g, a, n) in sums.items()}


def search_scale(weight: torch.Tensor, stats: InputStats, group: int, tie=None) -> torch.Tensor:
    """Per-input-channel scale s = mean|x|^alpha minimising the output error of Q(W s) / s
    over alpha. `tie` maps per-channel values to shared ones (channels that must share a scale)."""
    w = weight.float()
    base = stats.mean_abs.clamp_min(1e-6)
    best_err, best = float("inf"), torch.ones_like(base)
    for alpha in ALPHAS:
        s = base.pow(alpha)
        if tie is not None:
            s = tie(s)
        s = s / (s.max() * s.min()).sqrt()
        err = output_error(_fake_quant(w * s, group) / s - w, stats.gram)
        if err < best_err:
            best_err, best = err, s
    return best


def clip_and_quantize(weight: torch.Tensor, gram: torch.Tensor, group: int):
    """Search a clip ratio per (row, group) on that group's output error (its block of the
    input second moment); return int4 q, scales, zeros (padded). (Searching the minimum's and
    the maximum's ratios independently lowered that error but cost perplexity: +20.2 % vs
    +15.7 % at g128 on the validation slice; the search ignores errors across groups.)"""
    w = _pad(weight.float(), group)
    n, kp = w.shape
    groups = kp // group
    h = F.pad(gram, (0, kp - gram.shape[0], 0, kp - gram.shape[0]))
    h_blocks = h.view(groups, group, groups, group).diagonal(dim1=0, dim2=2).permute(2, 0, 1)   # [G, g, g]
    wg = w.view(n, groups, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    best_err = torch.full((n, groups), float("inf"))
    best = wg.clone()
    for ratio in CLIP_RATIOS:
        clipped = torch.maximum(torch.minimum(wg, hi * ratio), lo * ratio)
        q, s, z = quantize_int4(clipped.view(n, kp), group)
        delta = wg - dequantize_int4(q, s, z, group).view(n, groups, group)
        err = (torch.einsum("ngi,gij->ngj", delta, h_blocks) * delta).sum(-1)      # [N, groups]
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
                 progress: bool = True) -> int:
    """Scale, fold, clip and quantize every decoder linear of `model` in place. (GPTQ rounding
    of the scaled weights was tried instead of the clip search: +16.4 % vs +15.7 % at g128 on
    the validation slice, so AWQ keeps round-to-nearest; GPTQ alone is `int4-gptq`.)"""
    stats = capture_input_stats(model, sequences)
    for i, layer in enumerate(tqdm(model.layers, desc=f"AWQ int4 g{group_size}", disable=not progress, leave=False)):
        attn, mlp = layer.self_attn, layer.mlp
        x = {key: stats.pop(f"layers.{i}.{path}") for key, path in
             (("qkv", "self_attn.qkv_proj"), ("o", "self_attn.o_proj"), ("gate_up", "mlp.gate_up_proj"),
              ("down", "mlp.down_proj"))}
        # Scales, folded into the producer of each input.
        s = search_scale(attn.qkv_proj.weight, x["qkv"], group_size)
        layer.input_layernorm.weight.div_(s)
        attn.qkv_proj.weight.mul_(s.to(attn.qkv_proj.weight.dtype))
        x["qkv"] = x["qkv"].divided_by(s)
        s = search_scale(attn.o_proj.weight, x["o"], group_size, tie=partial(_tie_gqa, attn=attn))
        v_rows = slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size)
        s_v = s.view(attn.n_kv, attn.n_heads // attn.n_kv, attn.head_dim)[:, 0].reshape(-1)
        attn.qkv_proj.weight[v_rows].div_(s_v.to(attn.qkv_proj.weight.dtype)[:, None])
        if attn.qkv_proj.bias is not None:
            attn.qkv_proj.bias[v_rows].div_(s_v.to(attn.qkv_proj.bias.dtype))
        attn.o_proj.weight.mul_(s.to(attn.o_proj.weight.dtype))
        x["o"] = x["o"].divided_by(s)
        s = search_scale(mlp.gate_up_proj.weight, x["gate_up"], group_size)
        layer.post_attention_layernorm.weight.div_(s)
        mlp.gate_up_proj.weight.mul_(s.to(mlp.gate_up_proj.weight.dtype))
        x["gate_up"] = x["gate_up"].divided_by(s)
        s = search_scale(mlp.down_proj.weight, x["down"], group_size)
        mlp.gate_up_proj.weight[mlp.intermediate:].div_(s.to(mlp.gate_up_proj.weight.dtype)[:, None])
        mlp.down_proj.weight.mul_(s.to(mlp.down_proj.weight.dtype))
        x["down"] = x["down"].divided_by(s)
        # Clip and quantize.
        for parent, attr, key in ((attn, "qkv_proj", "qkv"), (attn, "o_proj", "o"),
                                  (mlp, "gate_up_proj", "gate_up"), (mlp, "down_proj", "down")):
            linear = getattr(parent, attr)
            q, scales, zeros = clip_and_quantize(linear.weight, x[key].gram, group_size)
            setattr(parent, attr, Int4Linear(linear.weight, linear.bias, group_size, q, scales, zeros))
    return 4 * len(model.layers)
