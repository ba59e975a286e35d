"""Launch-parameter sweep for the two kernels whose GPU bars depend on tuning: paged decode
attention (splits of the context, warps, pipeline stages) and the batch-1 W4A16 GEMV
(column tile, programs per SM, K step, warps), at the Llama-8B sizes gpu_check judges; and
W4A16 at 16-512 rows, tensor-core tiles against dequantize + dense GEMM (DEQUANTIZE_MIN_ROWS).
Each configuration is checked against the torch reference once and timed by CUDA graph
replays with a cold L2 (bench/gpu_timing.py: the kernels' GPU time); the JSON lists every row and the best per shape, next to
the configuration the dispatcher picks today.

  python bench/gpu_sweep.py --json OUT.json          CUDA machine, about two minutes
  python bench/gpu_sweep.py --smoke --json OUT.json  CPU, interpreter, tiny shapes: checks the script
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timer(smoke: bool, device):
    """One figure per call: the cold-L2 graph time (bench/gpu_timing.py), eager where capture fails."""
    from bench.gpu_timing import Timer
    timer = Timer(smoke, device)

    def timed(fn) -> float:
        cold, eager = timer(fn)
        return eager if cold is None else cold
    return timed


def decode_rows(torch, device, timed, smoke: bool, copy_gbps: float) -> list[dict]:
    from bench.gpu_cases import MODELS, _attn_check, _kv_bytes, _paged_step
    from kernels.triton._common import cdiv, num_sms
    from kernels.triton.attention_common import pages_per_step
    from kernels.triton.decode_attention import MAX_SPLITS, choose_splits, launch_decode

    m = MODELS["llama8b"]
    shapes = [(2, 300)] if smoke else [(32, 2048), (1, 8192), (8, 4096)]
    rows = []
    for batch, ctx in shapes:
        g = torch.Generator().manual_seed(2)
        q, k, v, tables, seq, ctx_lens, scales = _paged_step(m, torch.bfloat16, [1] * batch, [ctx - 1] * batch,
                                                             device, g)
        bs = k.shape[3]
        block_n = pages_per_step(bs) * bs
        sms = num_sms(device)
        steps = cdiv(tables.shape[1] * bs, block_n)
        current = choose_splits(batch, m["hkv"], tables.shape[1] * bs, block_n, sms)
        splits = sorted({current} | {max(1, min(steps, MAX_SPLITS, cdiv(w * sms, batch * m["hkv"])))
                                     for w in ((1, 2) if smoke else (1, 2, 4, 8))})
        warps, stages = ((4,), (None,)) if smoke else ((4, 8), (None, 4))     # None: Triton's default
        bytes_moved = _kv_bytes(batch * ctx, m, torch.bfloat16) + 2 * batch * m["hq"] * m["d"] * 2
        for n_splits, nw, ns in itertools.product(splits, warps, stages):
            opts = {"num_warps": nw} | ({"num_stages": ns} if ns else {})
            run = lambda s=n_splits, o=opts: launch_decode(q, k, v, tables, seq, ctx_lens, m["d"] ** -0.5, None, s, **o)
            row = {"kernel": "decode_attention", "shape": f"B={batch} ctx={ctx}", "splits": n_splits,
                   "num_warps": nw, "num_stages": ns, "current": n_splits == current and nw == 4 and ns is None}
            rows.append(_measure(row, run, _attn_check(lambda *a, r=run: r(), (q, k, v, tables, seq, ctx_lens,
                                                                               m["d"] ** -0.5, None)),
                                 2e-2, timed, bytes_moved, copy_gbps))
    return rows


def _w4_shapes(smoke: bool) -> list[tuple[int, int]]:
    """(N, K) of Llama-8B's fused qkv, gate_up and down projections."""
    return [(96, 64)] if smoke else [(6144, 4096), (28672, 4096), (4096, 14336)]


def _w4_group(smoke: bool) -> int:
    return 32 if smoke else 128


def _w4_weight(torch, n: int, k: int, group: int, device):
    """A random INT4 weight (nibbles, scales, zeros) and the generator, seeded, for the inputs."""
    g = torch.Generator().manual_seed(4)
    q4 = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8).to(device)
    s4 = (torch.rand(n, k // group, generator=g) * 0.01 + 0.005).to(device)
    z4 = (torch.randn(n, k // group, generator=g) * 0.01).to(device)
    return g, (q4, s4, z4)


def gemv_rows(torch, device, timed, smoke: bool, copy_gbps: float) -> list[dict]:
    import torch.nn.functional as F

    from kernels.reference_gemm import w4a16_linear_ref
    from kernels.triton._common import cdiv, num_sms
    from kernels.triton.gemm_common import split_k_plan
    from kernels.triton.gemm_weight_only import w4a16_linear, w4a16_plan

    group = _w4_group(smoke)
    sms = num_sms(device)
    rows = []
    for n, k in _w4_shapes(smoke):
        g, (q4, s4, z4) = _w4_weight(torch, n, k, group, device)
        x = torch.randn(1, k, generator=g).to(torch.bfloat16).to(device)
        w16 = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device)
        bf16_ms = timed(lambda: F.linear(x, w16))
        want = w4a16_linear_ref(x, q4, s4, z4, group)
        current = w4a16_plan(1, n, k, group, device)
        bytes_moved = q4.numel() + 8 * s4.numel() + 2 * (k + n)
        grid = (((32, 64), (4, 8), (32,), (4,)) if smoke
                else ((32, 64, 128), (4, 8, 16), (64, 128), (4,)))
        plans = {current} | {split_k_plan(1, bn, bk, k, cdiv(pps * sms, cdiv(n, bn)), nw)
                             for bn, pps, bk, nw in itertools.product(*grid)}
        for plan in sorted(plans, key=lambda p: (p.block_n, p.block_k, p.split_k, p.num_warps)):
            run = lambda p=plan: w4a16_linear(x, q4, s4, z4, group, plan=p)
            row = {"kernel": "w4a16_gemv", "shape": f"N={n} K={k}", "block_n": plan.block_n,
                   "block_k": plan.block_k, "split_k": plan.split_k, "num_warps": plan.num_warps,
                   "current": plan == current, "bf16_ms": bf16_ms}
            row = _measure(row, run, lambda r=run: _rel_err(r(), want), 1e-2, timed, bytes_moved, copy_gbps)
            if "ms" in row:
                row["speedup_vs_bf16"] = bf16_ms / row["ms"]
            rows.append(row)
    return rows


def prefill_rows(torch, device, timed, smoke: bool, copy_gbps: float) -> list[dict]:
    """W4A16 at several row counts: the tensor-core tiles against dequantize-then-dense-GEMM,
    the choice that DEQUANTIZE_MIN_ROWS makes."""
    import torch.nn.functional as F

    from kernels.reference_gemm import w4a16_linear_ref
    from kernels.triton.gemm_weight_only import DEQUANTIZE_MIN_ROWS, dequantize_w4, w4a16_linear, w4a16_plan

    rows_list = (4, 8) if smoke else (16, 32, 64, 128, 256, 512)
    group = _w4_group(smoke)
    out = []
    for n, k in _w4_shapes(smoke):
        g, (q4, s4, z4) = _w4_weight(torch, n, k, group, device)
        for m in rows_list:
            x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
            want = w4a16_linear_ref(x, q4, s4, z4, group)
            plan = w4a16_plan(m, n, k, group, device)
            paths = {"tiles": lambda x=x, p=plan: w4a16_linear(x, q4, s4, z4, group, plan=p),
                     "dequantize": lambda x=x: F.linear(x, dequantize_w4(q4, s4, z4, group, k, x.dtype))}
            chosen = "dequantize" if m >= DEQUANTIZE_MIN_ROWS else "tiles"
            for path, run in paths.items():
                row = {"kernel": "w4a16_prefill", "shape": f"M={m} N={n} K={k}", "path": path,
                       "current": path == chosen}
                row = _measure(row, run, lambda r=run: _rel_err(r(), want), 1e-2, timed,
                               q4.numel() + 8 * s4.numel() + 2 * m * (k + n), copy_gbps)
                if "ms" in row:
                    row["TFLOPs"] = 2 * m * n * k / row["ms"] / 1e9
                out.append(row)
    return out


def _rel_err(got, want) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()


def _measure(row: dict, run, check, tol: float, timed, bytes_moved: int, copy_gbps: float) -> dict:
    try:
        row["error"] = check()
        row["ok"] = bool(row["error"] <= tol)
        row["ms"] = timed(run)
        row["GBps"] = bytes_moved / row["ms"] / 1e6
        row["pct_of_copy"] = 100 * row["GBps"] / copy_gbps
    except Exception as exc:  # noqa: BLE001  a configuration that does not compile or fit is a row, not a stop
        row.update(ok=False, exception=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    shown = {k: v for k, v in row.items() if k not in ("kernel", "bf16_ms")}
    print(f"{row['kernel']:17} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in shown.items()), flush=True)
    return row


def best_per_shape(rows: list[dict]) -> list[dict]:
    out = []
    for key in sorted({(r["kernel"], r["shape"]) for r in rows}):
        group = [r for r in rows if (r["kernel"], r["shape"]) == key and r.get("ok")]
        current = next((r for r in rows if (r["kernel"], r["shape"]) == key and r["current"]), None)
        if group:
            best = min(group, key=lambda r: r["ms"])
            out.append({"kernel": key[0], "shape": key[1], "best": best, "current": current,
                        "best_vs_current": (current["ms"] / best["ms"]) if current and "ms" in current else None})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("gpu_sweep.json"))
    parser.add_argument("--smoke", action="store_true", help="CPU + interpreter, tiny shapes (no figures)")
    parser.add_argument("--only", default="", help="comma-separated families: decode, gemv, prefill")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT))
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("gpu_sweep: no CUDA device (use --smoke on a CPU machine)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    timed = _timer(args.smoke, device)
    src = torch.empty((4 << 20) if args.smoke else (1 << 30), dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    from bench.gpu_timing import Timer
    copy_gbps = 2 * 2 * src.numel() / Timer(args.smoke, device).eager(lambda: dst.copy_(src)) / 1e6
    started = time.perf_counter()
    report = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (smoke)",
              "copy_GBps": copy_gbps, "rows": [], "best": []}
    families = {"decode": decode_rows, "gemv": gemv_rows, "prefill": prefill_rows}
    for name in args.only.split(",") if args.only else families:
        family = families[name]
        report["rows"] += family(torch, device, timed, args.smoke, copy_gbps)
        report["best"] = best_per_shape(report["rows"])
        report["seconds"] = time.perf_counter() - started
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    for b in report["best"]:
        cfg = {k: v for k, v in b["best"].items() if k in ("splits", "num_warps", "num_stages", "block_n",
                                                             "block_k", "split_k", "path")}
        print(f"best {b['kernel']} {b['shape']}: {b['best']['ms']:.4f} ms ({b['best']['pct_of_copy']:.0f} % of copy) "
              f"{cfg}; {b['best_vs_current'] or 0:.2f}x the current choice")
    return 0


if __name__ == "__main__":
    sys.exit(main())
