"""Launch helpers shared by the kernel wrappers."""

from __future__ import annotations

import functools

import torch

from kernels.triton.select import interpreting


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def upcast_dots(*dtypes: torch.dtype) -> bool:
    """Run tl.dot on fp32 operands: always for fp32 data, and under the interpreter, whose
    bf16/fp16 dot products are not trustworthy."""
    return interpreting() or any(d == torch.float32 for d in dtypes)


@functools.cache  # a device's SM count is fixed
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors to fill. The interpreter runs programs one after another, so
    there it is 1: splitting would only add programs (tests force the split paths)."""
    if device.type == "cuda":
        return _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rows_per_program(row_elements: int, tile_elements: int = 4096) -> int:
    """Rows per program for row-wise kernels: about `tile_elements` values per program, so
    narrow rows (small models) do not leave most lanes idle; between 1 and 64."""
    return max(1, min(64, tile_elements // next_pow2(row_elements)))
