"""`w4a8-gguf`: a GGUF's own blocks served with int8 activations (quantization/w4a8.py).

Linears whose parts are all 4-bit in the file (Q4_1, Q4_K) keep their nibbles, scales and mins
as they are (quantization/gguf_int4.py decodes them); the others (Qwen2.5-Coder's Q5_0, Q6_K and
Q8_0 tensors) become 8-bit blocks of their loaded weights. The output head becomes 8-bit blocks
too: the file's own Q8_0 blocks where the head (or the tied embedding) is Q8_0 there, as in
SmolLM2, which is what llama.cpp multiplies; else its loaded weight, quantized per block. At
batch 1 the head is the largest single read of a small model's step (49,152 x 576 in SmolLM2):
8-bit blocks read half of bf16's bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engines.errors import ModelLoadError
from engines.model import LlamaForCausalLM
from engines.quantization.gguf_int4 import open_gguf, read_int4_weights, replace_decoder_linears
from engines.quantization.w4a8 import BLOCK, BlockQ4Linear, BlockQ8Linear

_Q8_0_BYTES = 34                 # d (fp16) + 32 int8


def q8_0_blocks(raw: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode Q8_0 blocks (fp16 d, then 32 int8 q; w = d * q) without dequantizing: (int8 [rows,
    cols], fp32 scales [rows, cols/32])."""
    if cols % BLOCK:
        raise ModelLoadError(f"a Q8_0 tensor's rows must be a multiple of {BLOCK} long, not {cols}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, _Q8_0_BYTES)
    if blocks.shape[0] != rows * cols // BLOCK:
        raise ModelLoadError(f"Q8_0 data of {blocks.shape[0]} blocks does not fit a [{rows}, {cols}] tensor")
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(rows, cols // BLOCK)
    q = blocks[:, 2:].copy().view(np.int8).reshape(rows, cols)
    return torch.from_numpy(q), torch.from_numpy(d)


def _stored_head(reader, model: LlamaForCausalLM) -> BlockQ8Linear | None:
    """The head's Q8_0 blocks as the file stores them, if it stores them so."""
    import gguf

    wanted = "token_embd.weight" if model.lm_head is None else "output.weight"
    for t in reader.tensors:
        if t.name == wanted and t.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            cols, rows = (int(x) for x in t.shape[:2])
            if (rows, cols) != (model.config.vocab_size, model.config.hidden_size):
                raise ModelLoadError(f"{wanted}: Q8_0 tensor of shape {(rows, cols)}, model expects "
                                     f"{(model.config.vocab_size, model.config.hidden_size)}")
            return BlockQ8Linear(*q8_0_blocks(np.asarray(t.data), rows, cols), None)
    return None


def install_gguf_w4a8(model: LlamaForCausalLM, gguf_path: Path) -> dict[str, int]:
    """Replace each decoder linear of a model loaded from `gguf_path` by a block-quantized one,
    and give the model a block-quantized head. Returns how many linears took each route."""
    reader = open_gguf(gguf_path)
    counts = {"q4_as_stored": 0, "q8_blocks": 0}
    replace_decoder_linears(
        model, read_int4_weights(gguf_path, reader),
        lambda g, old: (BlockQ4Linear.from_groups(g.q, g.scales, g.zeros, old.bias), "q4_as_stored"),
        lambda old: (BlockQ8Linear.from_weight(old.weight, old.bias), "q8_blocks"), counts)
    head = _stored_head(reader, model)
    counts["head_as_stored"] = int(head is not None)
    if head is None:
        weight = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
        head = BlockQ8Linear.from_weight(weight, None)
    model.set_quantized_head(head)
    return counts
