"""INT4 as the GGUF stores it: Q4_K and Q4_1 tensors loaded into our INT4 g32 layers with no
second rounding.

A Q4_K super-block covers 256 weights of a row: fp16 `d` and `dmin`, then for each of its eight
groups of 32 a 6-bit scale `sc` and a 6-bit min `m`, and one 4-bit q per weight, with
w = d*sc*q - dmin*m. That is asymmetric INT4 with group size 32, so the nibbles are taken as
they are and only the group's scale and zero are restated in our convention
w = (q - 8) * scale + zero:  scale = d*sc,  zero = 8*d*sc - dmin*m  (exact in fp32: d*sc and
dmin*m carry 17 significant bits). A Q4_1 block (SmolLM2's format) is one group of 32: fp16 `d`
and `m`, then 16 bytes whose low nibbles are weights 0-15 and high nibbles 16-31, with
w = d*q + m: scale = d, zero = 8*d + m. The CPU op keeps (scale, zero) in bf16, which rounds
them (measured in tests/integration/test_qwen_int4_gguf.py); the portable form keeps fp32.

Linears whose GGUF tensors are not all Q4_K (in Qwen2.5-Coder's Q4_K_M file: q/k/v/o and
gate/up in Q5_0, half the down projections in Q6_K, some v in Q8_0) are quantized from their
dequantized weights by `REST_METHOD`, chosen by held-out perplexity (see `tiergate eval ppl`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engines.errors import ModelLoadError
from engines.loaders.gguf_file import gguf_decoder_names
from engines.model import LlamaForCausalLM
from engines.model.layers import Linear
from engines.quantization.int4 import Int4Linear
from engines.quantization.int8 import Int8Linear

GROUP_SIZE = 32                  # a Q4_K sub-block
_SUPER = 256                     # weights per Q4_K super-block
_BLOCK_BYTES = 144               # d (2) + dmin (2) + scales (12) + nibbles (128)
_Q4_1_BYTES = 20                 # d (2) + m (2) + nibbles (16), 32 weights
# How the linears that are not Q4_K in the file are quantized, chosen on the validation slice
# (`tiergate eval ppl --model qwen --validation --sequences 8 --no-speed`, Qwen2.5-Coder-0.5B):
# fp32 12.183; rest int8 12.178 (-0.04 %); rest INT4 RTN g32 12.741 (+4.6 %). Re-rounding their
# 5/6/8-bit weights to 4 bits costs quality the Q4_K ones do not lose, and int8 keeps it.
REST_METHOD = "int8"
# Our fused linears and the HF projections they concatenate (in row order).
_FUSED = (
    ("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("self_attn.o_proj", ("self_attn.o_proj",)),
    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.down_proj", ("mlp.down_proj",)),
)


@dataclass
class Int4Groups:
    """One weight [N, K] as INT4 g32 in our convention: w = (q - 8) * scales + zeros per group."""
    q: torch.Tensor          # int32 [N, K], 0..15
    scales: torch.Tensor     # fp32 [N, K/32]
    zeros: torch.Tensor      # fp32 [N, K/32]

    def dequantized(self) -> torch.Tensor:
        n, k = self.q.shape
        qg = self.q.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
        return ((qg - 8.0) * self.scales[..., None] + self.zeros[..., None]).view(n, k)

    def rows(self, perm: torch.Tensor) -> Int4Groups:
        return Int4Groups(self.q[perm], self.scales[perm], self.zeros[perm])


def q4k_groups(raw: np.ndarray, rows: int, cols: int) -> Int4Groups:
    """Decode Q4_K blocks (the tensor's bytes, row after row) without dequantizing them, in the
    bit layout of gguf.quants.Q4_K."""
    if cols % _SUPER:
        raise ModelLoadError(f"a Q4_K tensor's rows must be a multiple of {_SUPER} long, not {cols}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, _BLOCK_BYTES)
    if blocks.shape[0] != rows * cols // _SUPER:
        raise ModelLoadError(f"Q4_K data of {blocks.shape[0]} blocks does not fit a [{rows}, {cols}] tensor")
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)            # [B, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    packed = blocks[:, 4:16].reshape(-1, 3, 4)
    lo6, hi6, extra = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = np.concatenate([lo6 & 0x3F, (extra & 0x0F) | ((lo6 >> 2) & 0x30)], axis=-1)   # [B, 8]
    mn = np.concatenate([hi6 & 0x3F, (extra >> 4) | ((hi6 >> 2) & 0x30)], axis=-1)
    # 4 chunks of 32 bytes; a chunk's low nibbles are group 2c, its high nibbles group 2c + 1.
    nibbles = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    q = (nibbles & 0x0F).reshape(rows, cols)
    scale = (d * sc.astype(np.float32)).reshape(rows, cols // GROUP_SIZE)
    offset = (dmin * mn.astype(np.float32)).reshape(rows, cols // GROUP_SIZE)
    scale_t = torch.from_numpy(scale)
    return Int4Groups(torch.from_numpy(q.astype(np.int32)), scale_t, 8.0 * scale_t - torch.from_numpy(offset))


def q4_1_groups(raw: np.ndarray, rows: int, cols: int) -> Int4Groups:
    """Decode Q4_1 blocks (the tensor's bytes, row after row) without dequantizing them, in the
    bit layout of gguf.quants.Q4_1."""
    if cols % GROUP_SIZE:
        raise ModelLoadError(f"a Q4_1 tensor's rows must be a multiple of {GROUP_SIZE} long, not {cols}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, _Q4_1_BYTES)
    if blocks.shape[0] != rows * cols // GROUP_SIZE:
        raise ModelLoadError(f"Q4_1 data of {blocks.shape[0]} blocks does not fit a [{rows}, {cols}] tensor")
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)            # [B, 1]
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    nibbles = blocks[:, 4:].reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
    q = (nibbles & 0x0F).reshape(rows, cols)
    scale_t = torch.from_numpy(d.reshape(rows, cols // GROUP_SIZE))
    return Int4Groups(torch.from_numpy(q.astype(np.int32)), scale_t,
                      8.0 * scale_t + torch.from_numpy(m.reshape(rows, cols // GROUP_SIZE)))


def _decoders():
    import gguf

    return {gguf.GGMLQuantizationType.Q4_K: q4k_groups, gguf.GGMLQuantizationType.Q4_1: q4_1_groups}


def open_gguf(gguf_path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(gguf_path))
    except Exception as exc:  # the gguf package raises bare ValueError/struct errors
        raise ModelLoadError(f"{gguf_path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def read_int4_weights(gguf_path: Path, reader=None) -> dict[str, Int4Groups]:
    """Every 4-bit (Q4_K or Q4_1) decoder weight of the file, by HF name, rows in the order our
    model uses (`reader`: the file already opened with open_gguf)."""
    reader = reader or open_gguf(gguf_path)
    names = gguf_decoder_names(reader, gguf_path)
    decoders = _decoders()
    out: dict[str, Int4Groups] = {}
    for t in reader.tensors:
        decode = decoders.get(t.tensor_type)
        if decode is None or t.name not in names:
            continue
        cols, rows = (int(x) for x in t.shape[:2])      # GGUF lists the fastest dimension first
        groups = decode(np.asarray(t.data), rows, cols)
        perm = names[t.name].row_order(rows)
        out[names[t.name].hf] = groups if perm is None else groups.rows(perm)
    return out


def replace_decoder_linears(model: LlamaForCausalLM, stored: dict[str, Int4Groups], as_stored, otherwise,
                            counts: dict[str, int]) -> None:
    """Swap each fused decoder linear for `as_stored(groups, old)` where all its parts are 4-bit
    in `stored` (their groups concatenated in row order), else for `otherwise(old)`; each returns
    (module, route name), and `counts` tallies the routes."""
    for i in range(len(model.layers)):
        for ours, parts in _FUSED:
            parent_name, _, attr = f"layers.{i}.{ours}".rpartition(".")
            parent = model.get_submodule(parent_name)
            old = getattr(parent, attr)
            if not isinstance(old, Linear):
                raise ValueError(f"layers.{i}.{ours} is already quantized")
            found = [stored.get(f"model.layers.{i}.{p}.weight") for p in parts]
            if all(g is not None for g in found):
                groups = Int4Groups(torch.cat([g.q for g in found]), torch.cat([g.scales for g in found]),
                                    torch.cat([g.zeros for g in found]))
                if tuple(groups.q.shape) != (old.out_features, old.in_features):
                    raise ModelLoadError(f"layer {i} {ours}: 4-bit tensors of shape {tuple(groups.q.shape)}, "
                                         f"model expects {(old.out_features, old.in_features)}")
                new, route = as_stored(groups, old)
            else:
                new, route = otherwise(old)
            counts[route] = counts.get(route, 0) + 1
            setattr(parent, attr, new)


def install_gguf_int4(model: LlamaForCausalLM, gguf_path: Path, rest_method: str = REST_METHOD) -> dict[str, int]:
    """Replace each decoder linear of a model loaded from `gguf_path`: by an Int4Linear holding
    the file's own nibbles where all its parts are 4-bit (Q4_K or Q4_1), else by `rest_method`
    ("int8" or "int4-rtn", g32) applied to its loaded weight. Returns how many linears took each
    route ("as_stored" for the first)."""
    if rest_method not in ("int8", "int4-rtn"):
        raise ValueError(f"rest_method must be 'int8' or 'int4-rtn', not {rest_method!r}")

    def as_stored(g: Int4Groups, old: Linear):
        return Int4Linear(None, old.bias, GROUP_SIZE, g.q, g.scales, g.zeros, in_features=old.in_features), "as_stored"

    def otherwise(old: Linear):
        if rest_method == "int8":
            return Int8Linear(old.weight, old.bias), "int8"
        return Int4Linear(old.weight, old.bias, GROUP_SIZE), "int4-rtn"

    counts = {"as_stored": 0, rest_method: 0}
    replace_decoder_linears(model, read_int4_weights(gguf_path), as_stored, otherwise, counts)
    return counts
