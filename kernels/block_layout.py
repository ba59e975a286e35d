"""The weight layout of the C++ block linears (kernels/cpu/block_linear.cpp): output columns
interleaved in groups of 8, so that one 256-bit vector of int32 lanes is 8 output columns.

A weight [N, K] in blocks of 32 along K becomes [ceil(N/8), K/32, bytes]: for each group of 8
columns and each block, the 8 columns' 32 weights with 4 consecutive weights of a column in each
32-bit lane. 8-bit weights take 8 vectors of 32 bytes per block (vector j: weights 4j..4j+3);
4-bit weights take 4, vector j holding weights 4j..4j+3 in its low nibbles and 16+4j..16+4j+3
in its high ones. Per-block scales and mins become [ceil(N/8), K/32, 8]. Missing columns of the
last group are zeros and never written out.
"""

from __future__ import annotations

import torch

BLOCK = 32
GROUP = 8


def _groups(n: int) -> int:
    return (n + GROUP - 1) // GROUP


def _pad_rows(t: torch.Tensor) -> torch.Tensor:
    n = t.shape[0]
    extra = _groups(n) * GROUP - n
    return t if extra == 0 else torch.cat([t, t.new_zeros((extra, *t.shape[1:]))])


def interleave_columns(t: torch.Tensor) -> torch.Tensor:
    """[N, K/32] per-block values (scales, mins) -> [ceil(N/8), K/32, 8] float32."""
    nb = t.shape[1]
    return _pad_rows(t.float()).view(-1, GROUP, nb).permute(0, 2, 1).contiguous()


def deinterleave_columns(t: torch.Tensor, n: int) -> torch.Tensor:
    g, nb, _ = t.shape
    return t.permute(0, 2, 1).reshape(g * GROUP, nb)[:n].contiguous()


def _lanes(q: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [G, K/32, 8 steps of 4, 8 columns, 4]: weight 4s + kk of column c at [.., s, c, kk]."""
    k = q.shape[1]
    return _pad_rows(q).view(-1, GROUP, k // BLOCK, BLOCK // 4, 4).permute(0, 2, 3, 1, 4)


def _columns(lanes: torch.Tensor, n: int) -> torch.Tensor:
    g, nb = lanes.shape[:2]
    return lanes.permute(0, 3, 1, 2, 4).reshape(g * GROUP, nb * BLOCK)[:n].contiguous()


def interleave_q8(q: torch.Tensor) -> torch.Tensor:
    """[N, K] int8 -> [ceil(N/8), K/32, 256] int8."""
    lanes = _lanes(q.to(torch.int8))
    return lanes.reshape(lanes.shape[0], lanes.shape[1], 256).contiguous()


def deinterleave_q8(packed: torch.Tensor, n: int) -> torch.Tensor:
    g, nb, _ = packed.shape
    return _columns(packed.view(g, nb, BLOCK // 4, GROUP, 4), n)


def interleave_q4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] values 0..15 -> [ceil(N/8), K/32, 128] uint8."""
    lanes = _lanes(q.to(torch.uint8))
    packed = lanes[:, :, :4] | (lanes[:, :, 4:] << 4)
    return packed.reshape(lanes.shape[0], lanes.shape[1], 128).contiguous()


def deinterleave_q4(packed: torch.Tensor, n: int) -> torch.Tensor:
    g, nb, _ = packed.shape
    halves = packed.view(g, nb, 4, GROUP, 4)
    return _columns(torch.cat([halves & 15, halves >> 4], dim=2), n)
