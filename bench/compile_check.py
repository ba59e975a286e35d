"""Compile every Triton kernel the engine launches for a GPU target, without a GPU (ptxas
ships with triton): the interpreter never runs the compiled branches (native bf16/FP8
dots, hardware casts) nor the layout rules of real codegen, so this catches what the CPU
tests cannot. Reports registers, spills (local memory or a stack frame), shared memory and
the width of the global loads per compiled variant.

The variants are not listed by hand: bench/gpu_check's cases (SmolLM2 and Llama-8B sizes,
every kernel, the dispatched ops) run on CPU tensors of the real sizes under
bench/launch_recorder.py, which records each launch as the JIT specializes it (aligned
pointers, integers divisible by 16, unit strides made constants) with the plans an H200
gets. That specialization decides whether loads vectorize; without it Triton emits byte
loads with a 64-bit address per element, which is not the code that runs.

  env -u TRITON_INTERPRET python bench/compile_check.py [--arch 90] [--sms 132] [--json OUT]
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


def recorded_launches(arch: int, sms: int) -> list[tuple[str, object]]:
    """(first case that made it, Launch) for every distinct launch of gpu_check's cases."""
    import torch

    from bench import gpu_cases
    from bench.launch_recorder import recording

    seen: dict[str, tuple[str, object]] = {}
    device = torch.device("cpu")
    for build in (gpu_cases.store_cases, gpu_cases.attention_cases, gpu_cases.gemm_cases,
                  gpu_cases.elementwise_cases):
        with recording(arch, sms) as launches:
            cases = build(device, small=False)     # one family's tensors at a time; plans made here see `sms`
            for case in cases:
                start = len(launches)
                case.run()
                for launch in launches[start:]:
                    seen.setdefault(launch.key, (f"{case.kernel} {case.name}", launch))
        del cases
    return list(seen.values())


def load_widths(ptx: str) -> dict[str, int]:
    """Global loads in the PTX by bytes per thread (plain and asynchronous copies alike):
    16 means full vectors, 1 or 2 scalar loads."""
    widths: dict[str, int] = {}
    for lanes, bits in re.findall(r"ld\.global[\w.:]*?(?:\.v(\d))?\.b(\d+)\b", ptx):
        key = str(int(lanes or 1) * int(bits) // 8)
        widths[key] = widths.get(key, 0) + 1
    for size in re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], (0x[0-9a-f]+)", ptx):
        key = str(int(size, 16))
        widths[key] = widths.get(key, 0) + 1
    return widths


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
    parser.add_argument("--sms", type=int, default=132, help="multiprocessors the plans fill (H200: 132)")
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
    started = time.perf_counter()
    launches = recorded_launches(args.arch, args.sms)
    print(f"{len(launches)} distinct launches recorded ({time.perf_counter() - started:.0f} s)")
    rows = []
    for case, launch in launches:
        row = {"kernel": launch.name, "case": case, "num_warps": launch.num_warps, "num_stages": launch.num_stages,
               "constexprs": {launch.fn.arg_names[path[0]]: value for path, value in launch.constexprs.items()
                              if isinstance(value, (bool, int, float))}}
        try:
            compiled = triton.compile(ASTSource(launch.fn, launch.signature, launch.constexprs, launch.attrs),
                                      target=target,
                                      options={"num_warps": launch.num_warps, "num_stages": launch.num_stages})
            row.update(resource_usage(compiled.asm["cubin"], cuobjdump), shared_bytes=compiled.metadata.shared,
                       load_bytes=load_widths(compiled.asm["ptx"]))
            row["ok"] = (row.get("local", 0) == 0 and row.get("stack", 0) == 0
                         and compiled.metadata.shared <= SHARED_LIMIT.get(args.arch, 99 * 1024))
        except Exception as exc:  # noqa: BLE001  report every variant, then fail
            row.update(ok=False, exception=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        rows.append(row)
        status = "ok " if row["ok"] else "BAD"
        print(f"{status} {launch.name:22} {case:44} regs {row.get('reg', '-'):>4} local {row.get('local', '-'):>4} "
              f"stack {row.get('stack', '-'):>4} shared {row.get('shared_bytes', '-'):>7} {row.get('exception', '')}")
    bad = [r["kernel"] for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} variants compile for sm_{args.arch} without spills "
          f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"arch": args.arch, "sms": args.sms, "triton": triton.__version__,
                                         "variants": rows}, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
