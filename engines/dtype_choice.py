"""Choose the compute dtype a model runs fastest in on this machine, by timing it here.

Which dtype is faster on a CPU depends on the CPU: with AMX, bf16 GEMMs beat fp32 from small
batches up; with AVX-512 BF16 and no AMX fp32 can win; with AVX2 only, oneDNN cannot even
pack bf16 weights and bf16 runs several times slower. Quantized kernels have their own
preferences (torch's INT4 CPU kernel wants bf16 activations). So a tier whose dtype is `auto`
times the GEMMs of one decode step of its own model (one decoder layer's projections times
the layer count, plus the output head), built with its own weight format, at batch 1 and at
its batch size, for each candidate dtype, and keeps the fastest. Weights are random: speed
does not depend on their values.

Candidates are timed interleaved and each keeps its best repeat, so that other work on the
machine (another tier loading beside this one) slows every candidate alike rather than one.
On a GPU the answer is bf16 without timing: its tensor cores have no fp32 equivalent.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

import torch
from torch import nn

from engines.model.layers import Linear
from engines.model_config import ModelConfig
from engines.quantization.methods import LAYER_METHOD_OF

CANDIDATES = ("float32", "bfloat16")
_REPEATS = 5
# Timings of two tiers loading at once would disturb each other: one probe at a time.
_PROBE_LOCK = threading.Lock()


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str
    # candidate -> batch size -> milliseconds of the step's GEMMs (best of the repeats)
    step_ms: dict[str, dict[int, float]] = field(default_factory=dict)
    reason: str = ""


def _step_linears(cfg: ModelConfig, dtype: torch.dtype, method: str | None, group_size: int) -> list[nn.Module]:
    """One decoder layer's projections and the output head, packed as the model packs them."""
    from engines.quantization.apply import quantized_linear

    shapes = [(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size), (cfg.q_size, cfg.hidden_size),
              (cfg.hidden_size, 2 * cfg.intermediate_size), (cfg.intermediate_size, cfg.hidden_size)]
    layers: list[nn.Module] = []
    gen = torch.Generator().manual_seed(0)
    for in_features, out_features in shapes:
        layer = Linear(in_features, out_features, False, dtype)
        layer.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.02)
        if method is not None:
            layer = quantized_linear(LAYER_METHOD_OF[method], layer, group_size)
        else:
            layer.pack()
        layers.append(layer)
    head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype)
    head.weight.copy_(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.02)
    head.pack()
    return [*layers, head]


@torch.inference_mode()
def _time_step(linears: list[nn.Module], layers: int, batch: int, dtype: torch.dtype, hidden: int) -> float:
    """Milliseconds of one step's GEMMs: the layer projections `layers` times, the head once."""
    *projections, head = linears
    inputs = [torch.randn(batch, p.in_features).to(dtype) for p in projections]
    x_head = torch.randn(batch, hidden).to(dtype)
    started = time.perf_counter()
    for proj, x in zip(projections, inputs):
        proj(x)
    per_layer = time.perf_counter() - started
    started = time.perf_counter()
    head(x_head)
    return (per_layer * layers + time.perf_counter() - started) * 1e3


def choose_dtype(cfg: ModelConfig, device: torch.device, quantization: str | None = None, group_size: int = 128,
                 max_batch: int = 32) -> DtypeChoice:
    """The candidate dtype whose step GEMMs take the least time, geometric mean over batch 1
    and `max_batch` (capped at 32: past that, a step is a large GEMM in either dtype)."""
    if device.type == "cuda":
        return DtypeChoice("bfloat16", reason="GPU: bf16 tensor cores")
    batches = sorted({1, max(1, min(max_batch, 32))})
    with _PROBE_LOCK:
        built = {name: _step_linears(cfg, getattr(torch, name), quantization, group_size) for name in CANDIDATES}
        best: dict[str, dict[int, float]] = {name: {b: math.inf for b in batches} for name in CANDIDATES}
        for repeat in range(_REPEATS + 1):
            for name in CANDIDATES:
                for batch in batches:
                    ms = _time_step(built[name], cfg.num_hidden_layers, batch, getattr(torch, name), cfg.hidden_size)
                    if repeat:                      # the first round warms caches and packs
                        best[name][batch] = min(best[name][batch], ms)
    score = {name: math.prod(best[name].values()) ** (1 / len(batches)) for name in CANDIDATES}
    winner = min(CANDIDATES, key=score.__getitem__)
    loser = max(CANDIDATES, key=score.__getitem__)
    figures = ", ".join(f"{name} " + "/".join(f"{best[name][b]:.2f}" for b in batches) for name in CANDIDATES)
    reason = (f"{winner}: {score[loser] / score[winner]:.1f}x faster than {loser} "
              f"(step GEMMs at batch {'/'.join(map(str, batches))}, ms: {figures})")
    return DtypeChoice(winner, {n: {b: round(v, 3) for b, v in best[n].items()} for n in CANDIDATES}, reason)
