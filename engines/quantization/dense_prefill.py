"""Dense weights for steps of many rows beside block-quantized ones: measured, not assumed.

A block-quantized linear (w4a8.py) reads a quarter of bf16's bytes and is the fastest way to
multiply the one to a few dozen rows of a decode step. A prefill chunk is hundreds of rows, where
the arithmetic, not the bytes, sets the time, and there a CPU's matrix unit can be several times
faster on a dense copy: on an Intel Xeon with AMX, oneDNN's bf16 GEMM ran the 30 layers of
SmolLM2-135M at 256 rows in 42 ms where the integer block kernel took 202 ms (one core). Without
AMX it can be the other way round (fp32 or AVX-512 BF16 against VNNI integers). So the engine
times both on the model's own first layer at a few row counts and keeps a dense copy only when
it wins clearly; it then costs 2 bytes per weight (bf16) beside the 4-bit blocks.

Values are the same weights dequantized; the dense path skips the int8 rounding of the
activations, so long prompts are computed slightly more exactly than decode steps.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from engines.model.fused_decoder import attach_fused_decoder
from engines.model.llama import LlamaForCausalLM
from engines.quantization.w4a8 import BlockQ4Linear
from kernels.linear import PackedWeight

PROBE_ROWS = (64, 128, 256, 512)
# Dense must beat the block kernel by this much to pay for its memory (and for the decode steps
# of slightly more rows than the threshold, where the dense weights' bytes start to count).
MIN_SPEEDUP = 1.5
_REPEATS = 3


def block_linears(model: nn.Module) -> list[BlockQ4Linear]:
    return [m for m in model.modules() if isinstance(m, BlockQ4Linear)]


def _first_layer(linears: list[BlockQ4Linear], model: nn.Module) -> list[BlockQ4Linear]:
    layers = getattr(model, "layers", None)
    if layers is not None and len(layers):
        own = [m for m in layers[0].modules() if isinstance(m, BlockQ4Linear)]
        if own:
            return own
    return linears[:4]


@torch.inference_mode()
def measure_dense_rows(model: nn.Module, dtype: torch.dtype) -> tuple[int | None, dict[int, float]]:
    """(the fewest rows from which a dense `dtype` copy is at least MIN_SPEEDUP times faster than
    the block kernel, at every probed count from there up, or None; block time / dense time per
    probed row count). Timed on the first layer's block linears, the two paths interleaved and
    each keeping its best repeat, so other work on the machine slows both alike."""
    linears = block_linears(model)
    if not linears or dtype not in (torch.float32, torch.bfloat16):
        return None, {}
    probe = _first_layer(linears, model)
    packed = [(linear, PackedWeight(linear.dequantized().to(dtype))) for linear in probe]
    speedups: dict[int, float] = {}
    gen = torch.Generator().manual_seed(0)
    for rows in PROBE_ROWS:
        inputs = [torch.randn(rows, linear.in_features, generator=gen).to(dtype) for linear, _ in packed]
        best = {"block": float("inf"), "dense": float("inf")}
        for _ in range(_REPEATS):
            for path in ("block", "dense"):
                started = time.perf_counter()
                for (linear, weight), x in zip(packed, inputs):
                    if path == "block":
                        linear(x)
                    else:
                        weight.linear(x)
                best[path] = min(best[path], time.perf_counter() - started)
        speedups[rows] = best["block"] / best["dense"]
    threshold = None
    for rows in reversed(PROBE_ROWS):
        if speedups[rows] < MIN_SPEEDUP:
            break
        threshold = rows
    return threshold, speedups


def attach_dense_prefill(model: nn.Module, dtype: torch.dtype, min_rows: int) -> int:
    """Give every block linear a dense copy for steps of at least `min_rows` rows; returns how
    many linears got one."""
    linears = block_linears(model)
    for linear in linears:
        linear.attach_dense(dtype, min_rows)
    if isinstance(model, LlamaForCausalLM):
        attach_fused_decoder(model)           # it leaves such steps to the dense copies
    return len(linears)
