"""GPU check of the Triton kernels: every kernel's correctness at real sizes
against its torch reference, its time (bench/gpu_timing.py: the kernels' GPU time with a cold
L2 from CUDA graph replays, and do_bench's eager median beside it) and the GB/s and
TFLOP/s it reaches next to this chip's measured ceilings (a device-to-device copy, a big
bf16 matmul). Bars: paged decode attention >= 70 % of the copy bandwidth; W4A16 at batch 1
>= 2x the bf16 GEMM of the same shape (Llama-8B shapes; SmolLM2's are launch-bound).
First, the whole engine on CUDA (bench/gpu_check_engine.py): SmolLM2 fp32 greedy tokens equal
to the CPU path's, bf16 agreement, decode tokens/s at batch 1 and 32.

  bench/gpu_check.sh [OUT.json] [--no-engine]    CUDA machine, under 5 minutes
  python bench/gpu_check.py --smoke --json X     CPU, under TRITON_INTERPRET=1, tiny shapes:
                                                 checks this script, measures nothing
Exit status 0 when every case is correct and every bar is met, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DECODE_BAR = 0.70
W4A16_BAR = 2.0


def _kernel_ms(timing: tuple[float | None, float]) -> float:
    cold, eager = timing
    return eager if cold is None else cold


def measure_ceilings(torch, device, timed, smoke: bool) -> dict:
    n_bytes = (8 << 20) if smoke else (2 << 30)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    copy_ms = timed.eager(lambda: dst.copy_(src))           # eager: gigabytes, so neither L2 nor launches count
    size = 256 if smoke else 8192
    a = torch.randn(size, size, device=device).to(torch.bfloat16)
    b = torch.randn(size, size, device=device).to(torch.bfloat16)
    mm_ms = timed.eager(lambda: a @ b)
    return {"copy_GBps": 2 * n_bytes / copy_ms / 1e6, "copy_bytes": n_bytes,
            "bf16_matmul_TFLOPs": 2 * size ** 3 / mm_ms / 1e9, "matmul_size": size}


def run_case(case, timed) -> dict:
    row = {"kernel": case.kernel, "case": case.name, "tol": case.tol, **case.info}
    try:
        err = case.check()
        row["error"] = err
        row["ok"] = bool(err <= case.tol)
        cold_ms, row["eager_ms"] = timed(case.run)
        row["graph_timed"] = cold_ms is not None
        ms = row["ms"] = _kernel_ms((cold_ms, row["eager_ms"]))
        if case.bytes:
            row["GBps"] = case.bytes / ms / 1e6
        if case.flops:
            row["TFLOPs"] = case.flops / ms / 1e9
        if case.baseline is not None:
            row["bf16_ms"] = _kernel_ms(timed(case.baseline))
            row["speedup_vs_bf16"] = row["bf16_ms"] / ms
    except Exception as exc:  # noqa: BLE001  one failing case must not hide the others' figures
        row.update(ok=False, exception=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    return row


def evaluate_bars(rows: list[dict], ceilings: dict) -> dict:
    decode = [r for r in rows if r["kernel"] == "decode_attention" and "GBps" in r and r["case"].startswith("llama8b")]
    w4 = [r for r in rows if r["kernel"] == "gemm_w4a16" and r.get("M") == 1 and r.get("model") == "llama8b"
          and "speedup_vs_bf16" in r]
    bars = {}
    if decode:
        best = max(r["GBps"] for r in decode if "kv=bf16" in r["case"])
        bars["decode_attention_bf16_vs_copy"] = {"value": best / ceilings["copy_GBps"], "bar": DECODE_BAR}
    if w4:
        worst = min(r["speedup_vs_bf16"] for r in w4)
        bars["w4a16_batch1_speedup_vs_bf16_min"] = {"value": worst, "bar": W4A16_BAR}
    for bar in bars.values():
        bar["met"] = bool(bar["value"] >= bar["bar"])
    return bars


def print_header(ceilings: dict) -> None:
    print(f"ceilings: copy {ceilings['copy_GBps']:.0f} GB/s, bf16 matmul {ceilings['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    print(f"{'kernel':18} {'case':44} {'ok':3} {'err':>9} {'ms':>9} {'eager':>8} {'GB/s':>8} {'%copy':>6} {'TFLOP/s':>8} {'vs bf16':>7}")


def print_row(r: dict) -> None:
    if "exception" in r:
        print(f"{r['kernel']:18} {r['case']:44} NO  {r['exception']}", flush=True)
        return
    gb, tf = r.get("GBps", 0), r.get("TFLOPs", 0)
    print(f"{r['kernel']:18} {r['case']:44} {'yes' if r['ok'] else 'NO':3} {r['error']:9.2e} {r['ms']:9.4f} {r['eager_ms']:8.4f} "
          f"{gb:8.0f} {r.get('pct_of_copy', 0):6.1f} {tf:8.2f} {r.get('speedup_vs_bf16', 0):7.2f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--smoke", action="store_true", help="CPU + interpreter, tiny shapes (no figures)")
    parser.add_argument("--only", default="", help="comma-separated kernel families to run ('engine': the whole engine)")
    parser.add_argument("--no-engine", action="store_true",
                        help="kernels only: needs nothing but torch and triton (no model, no engine dependencies)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"           # before any kernel module is imported
    sys.path.insert(0, str(ROOT))
    import torch
    import triton

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --smoke on a CPU machine)", file=sys.stderr)
        return 2
    from bench.gpu_cases import all_cases

    started = time.perf_counter()
    device = torch.device("cpu" if args.smoke else "cuda")
    from bench.gpu_timing import Timer
    timed = Timer(args.smoke, device)
    ceilings = measure_ceilings(torch, device, timed, args.smoke)
    report = {
        "machine": {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter smoke run)",
                    "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "triton": triton.__version__},
        "workload": "kernels at SmolLM2-135M and Llama-8B-like sizes, bf16 activations; SmolLM2 engine, greedy",
        "ceilings": ceilings, "cases": [], "bars": {}, "seconds": 0.0,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    wanted = {w for w in args.only.split(",") if w}
    if (not wanted or "engine" in wanted) and not args.no_engine:
        # First: the end-to-end check is bounded (about a minute) and the kernel rows that follow
        # are written case by case, so a timeout cuts the least.
        from bench.gpu_check_engine import run as run_engine

        def emit(section: dict) -> None:
            report["engine"] = section
            report["seconds"] = time.perf_counter() - started
            args.json.write_text(json.dumps(report, indent=2))
        run_engine(device, args.smoke, emit)
    rows = report["cases"]
    print_header(ceilings)
    for case in all_cases(device, small=args.smoke):
        if wanted and case.kernel not in wanted:
            continue
        row = run_case(case, timed)
        if "GBps" in row:
            row["pct_of_copy"] = 100 * row["GBps"] / ceilings["copy_GBps"]
        if "TFLOPs" in row:
            row["pct_of_bf16_matmul"] = 100 * row["TFLOPs"] / ceilings["bf16_matmul_TFLOPs"]
        rows.append(row)
        print_row(row)
        report["seconds"] = time.perf_counter() - started
        args.json.write_text(json.dumps(report, indent=2))     # after every case: a timeout keeps the rest
    bars = report["bars"] = {} if args.smoke else evaluate_bars(rows, ceilings)
    args.json.write_text(json.dumps(report, indent=2))
    for name, bar in bars.items():
        print(f"bar {name}: {bar['value']:.2f} (needs >= {bar['bar']}) {'met' if bar['met'] else 'NOT MET'}")
    failed = [r["case"] for r in rows if not r["ok"]]
    failed += [f"engine {dtype}" for dtype, e in report.get("engine", {}).items() if not e["ok"]]
    print(f"{len(rows)} kernel cases, {len(report.get('engine', {}))} engine checks; failed: "
          f"{', '.join(failed) or 'none'}; {report['seconds']:.0f} s; JSON: {args.json}")
    print("PASS gpu_check" if not failed and all(b["met"] for b in bars.values()) else "FAIL gpu_check")
    return 0 if not failed and all(b["met"] for b in bars.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
