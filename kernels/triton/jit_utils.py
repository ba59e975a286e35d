"""Device helpers shared by several kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_half_even(x):
    """rint() that also runs under the interpreter (libdevice does not)."""
    r = tl.floor(x + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(((r - x) == 0.5) & odd, r - 1.0, r)


@triton.jit
def to_e4m3(x, EMULATE_RNE: tl.constexpr):
    """fp32 (already within +-448) -> float8 e4m3fn, round to nearest even.

    The interpreter's fp32 -> fp8 conversion rounds without carrying into the exponent
    (124.3 becomes 64), so with EMULATE_RNE the value is first rounded onto the e4m3 grid in
    fp32, after which the conversion is exact. GPUs convert in hardware (cvt.rn)."""
    if EMULATE_RNE:
        exponent = ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        # 3 mantissa bits; below the smallest normal (2^-6) the spacing stays 2^-9.
        ulp = tl.exp2((tl.maximum(exponent, -6) - 3).to(tl.float32))
        x = round_half_even(x / ulp) * ulp
    return x.to(tl.float8e4nv)


@triton.jit
def cast_for(ptr, x, EMULATE_RNE: tl.constexpr):
    """x (fp32) in the element type of `ptr`, rounded to nearest even.

    The interpreter truncates fp32 -> bf16; with EMULATE_RNE the rounding is done on the
    bits first (add 0x7FFF plus the lowest kept bit, clear the low half), after which the
    conversion is exact. Compiled kernels round in hardware."""
    if EMULATE_RNE and ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(ptr.dtype.element_ty)
