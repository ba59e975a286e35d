"""Compile every Triton kernel for a GPU target without a GPU (ptxas ships with triton):
the interpreter never runs the compiled branches (native bf16/FP8 dots, hardware casts)
nor the layout rules of real codegen, so this catches what the CPU tests cannot. Reports
registers, spills (local memory or a stack frame) and shared memory per kernel variant.

Arguments are specialized as the JIT does at the engine's real shapes: pointers 16-byte
aligned (torch allocations), strides and split lengths multiples of 16. Without that
alignment Triton cannot vectorize loads, and the compiled code (byte loads, 64-bit
addresses per element) is not what runs.

  env -u TRITON_INTERPRET python bench/compile_check.py [--arch 90] [--json OUT]
Exit status 1 when a variant fails to compile, spills, or needs more shared memory than
the target has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_LIMIT = {90: 227 * 1024, 89: 99 * 1024, 80: 163 * 1024}
KV = {"bf16": ("*bf16", 2), "int8": ("*i8", 1), "fp8": ("*fp8e4nv", 1)}


def variants():
    """(label, jit function, pointer/scalar types, constexprs) at the shapes the engine runs."""
    from kernels.triton import (
        decode_attention,
        elementwise,
        extend_attention,
        gemm_common,
        gemm_fp8,
        gemm_weight_only,
        gemv_int4,
        store_kv,
    )
    from kernels.triton._common import rows_per_program

    out = []
    for model, (hkv, d, g) in {"smollm2": (3, 64, 3), "llama8b": (8, 128, 4)}.items():
        h_pad = 4 if hkv == 3 else 8
        for kv, (ptr, p) in KV.items():
            quant = {"bf16": 0, "int8": 1, "fp8": 2}[kv]
            pools = {"kp_ptr": ptr, "vp_ptr": ptr, "ks_ptr": "*fp16", "vs_ptr": "*fp16"}
            out.append((f"store_kv {model} {kv}", store_kv._store_kv_kernel,
                        {"k_ptr": "*bf16", "v_ptr": "*bf16", "slot_ptr": "*i64", **pools},
                        {"BS": 16, "P": p, "ROWS": rows_per_program(h_pad * d), "H_PAD": h_pad, "D_PAD": d,
                         "QUANT": quant,
                         "QMAX": 127.0 if quant == 1 else 448.0, "EMULATE_RNE": False,
                         "num_warps": store_kv.STORE_WARPS}))
            attn = {"q_ptr": "*bf16", "tab_ptr": "*i64", "seq_ptr": "*i64", "ctx_ptr": "*i64", "out_ptr": "*bf16",
                    "qk_scale": "fp32", **pools}
            for split in (False, True):
                out.append((f"decode {model} {kv} split={split}", decode_attention._decode_kernel,
                            {**attn, "part_ptr": "*fp32", "lse_ptr": "*fp32"},
                            {"G": g, "G_PAD": 16, "D": d, "BS": 16, "P": p, "PAGES": 4, "QUANT": quant > 0,
                             "UPCAST": False, "SPLIT": split, "EMULATE_RNE": False}))
            out.append((f"extend {model} {kv}", extend_attention._extend_kernel, {**attn, "tiles_ptr": "*i32"},
                        {"G": g, "G_PAD": 4, "BLOCK_T": 16, "D": d, "BS": 16, "P": p, "PAGES": 4,
                         "QUANT": quant > 0, "UPCAST": False, "EMULATE_RNE": False}))
        out.append((f"decode merge {model}", decode_attention._merge_kernel,
                    {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*bf16"}, {"D": d, "S_PAD": 64}))
    for bm, bn, bk, warps in ((16, 16, 128, 4), (16, 32, 128, 4), (16, 64, 128, 4), (64, 128, 64, 8)):  # plan_gemm's
        for split in (False, True):
            out_t = "*fp32" if split else "*bf16"
            common = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "UPCAST": False, "HAS_BIAS": not split,
                      "SPLIT": split, "EMULATE_RNE": False, "num_warps": warps}
            out.append((f"w4a16 {bm}x{bn} split={split}", gemm_weight_only._w4a16_kernel,
                        {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32", "z_ptr": "*fp32", "bias_ptr": "*bf16",
                         "out_ptr": out_t}, {"GROUP": 128, **common}))
            out.append((f"w8a16 {bm}x{bn} split={split}", gemm_weight_only._w8a16_kernel,
                        {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": out_t},
                        common))
            out.append((f"fp8 gemm {bm}x{bn} split={split}", gemm_fp8._fp8_gemm_kernel,
                        {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "as_ptr": "*fp32", "bs_ptr": "*fp32",
                         "bias_ptr": "*bf16", "out_ptr": out_t}, common))
    for split in (False, True):
        out.append((f"w4a16 gemv split={split}", gemv_int4._w4a16_gemv_kernel,
                    {"x_ptr": "*bf16", "q_ptr": "*u8", "s_ptr": "*fp32", "z_ptr": "*fp32", "bias_ptr": "*bf16",
                     "out_ptr": "*fp32" if split else "*bf16"},
                    {"GROUP": 128, "BLOCK_N": gemv_int4.BLOCK_N, "BLOCK_K": 128, "HAS_BIAS": not split,
                     "SPLIT": split, "EMULATE_RNE": False}))
    out.append(("gemm sum splits", gemm_common._sum_splits_kernel,
                {"part_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"},
                {"HAS_BIAS": True, "BLOCK": 1024, "EMULATE_RNE": False}))
    out.append(("fp8 quantize rows", gemm_fp8._quantize_rows_kernel,
                {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32"}, {"BLOCK": 1024, "EMULATE_RNE": False}))
    for h in (576, 4096):
        out.append((f"add_rms_norm H={h}", elementwise._add_rms_norm_kernel,
                    {"res_ptr": "*bf16", "delta_ptr": "*bf16", "w_ptr": "*fp32", "out_ptr": "*bf16", "eps": "fp32"},
                    {"HAS_DELTA": True, "ROWS": rows_per_program(h), "BLOCK": 1024 if h == 576 else 4096,
                     "EMULATE_RNE": False}))
    out.append(("silu_mul", elementwise._silu_mul_kernel, {"gu_ptr": "*bf16", "out_ptr": "*bf16"},
                {"ROWS": rows_per_program(1024), "BLOCK": 1024, "EMULATE_RNE": False}))
    out.append(("rope llama8b", elementwise._rope_kernel,
                {"x_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "out_ptr": "*bf16"},
                {"ROWS": 1, "H_PAD": 64, "D_PAD": 128, "EMULATE_RNE": False}))
    return out


def aligned_args(fn, types: dict) -> dict:
    """tt.divisibility = 16 where the JIT would find it at real shapes (see the docstring)."""
    names = [n for n in fn.arg_names if n in types and types[n].startswith("*")
             or n.startswith("s") and "_" in n or n in ("k_per_split", "partition")]
    return {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in names}


def resource_usage(cubin: bytes, cuobjdump: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    return {key.lower(): int(val) for key, val in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("compile_check: unset TRITON_INTERPRET (kernels must be JIT functions, not interpreted)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    target = GPUTarget("cuda", args.arch, 32)
    rows, started = [], time.perf_counter()
    for label, fn, types, consts in variants():
        consts = dict(consts)
        options = {key: consts.pop(key) for key in ("num_warps",) if key in consts}     # launch options
        signature = {name: ("constexpr" if name in consts else types.get(name, "i32")) for name in fn.arg_names}
        row = {"kernel": label}
        try:
            compiled = triton.compile(ASTSource(fn, signature, constexprs=consts, attrs=aligned_args(fn, types)),
                                      target=target, options=options)
            row.update(resource_usage(compiled.asm["cubin"], cuobjdump), shared_bytes=compiled.metadata.shared,
                       num_warps=compiled.metadata.num_warps)
            row["ok"] = (row.get("local", 0) == 0 and row.get("stack", 0) == 0
                         and compiled.metadata.shared <= SHARED_LIMIT.get(args.arch, 99 * 1024))
        except Exception as exc:  # noqa: BLE001  report every variant, then fail
            row.update(ok=False, exception=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        rows.append(row)
        status = "ok " if row["ok"] else "BAD"
        print(f"{status} {label:34} regs {row.get('reg', '-'):>4} local {row.get('local', '-'):>4} "
              f"stack {row.get('stack', '-'):>4} "
              f"shared {row.get('shared_bytes', '-'):>7} {row.get('exception', '')}")
    bad = [r["kernel"] for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} variants compile for sm_{args.arch} without spills "
          f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"arch": args.arch, "triton": triton.__version__, "variants": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
