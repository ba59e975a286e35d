"""bench/gpu_check.py runs end to end on the CPU (interpreter, tiny shapes): every case's
reference check passes and the JSON report has the fields the GPU run is read by."""

from __future__ import annotations

import json

import pytest

from bench.gpu_check import evaluate_bars, main

pytestmark = pytest.mark.slow          # ~30 s of interpreted kernels, ~15 s of the real model


def test_gpu_check_smoke_run_reports_every_kernel(tmp_path):
    out = tmp_path / "check.json"
    assert main(["--smoke", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    kernels = {row["kernel"] for row in report["cases"]}
    assert kernels == {"store_kv", "decode_attention", "extend_attention", "gemm_w4a16", "gemm_w4a16_tiles",
                       "gemm_w8a16", "gemm_fp8", "add_rms_norm", "silu_mul", "rope"}
    assert all(row["ok"] and row["ms"] > 0 for row in report["cases"])
    assert report["ceilings"]["copy_GBps"] > 0 and report["machine"]["triton"]
    # The whole-engine section ran its script (on the CPU both sides are the CPU path).
    engine = report["engine"]
    assert set(engine) == {"float32", "bfloat16"} and all(e["ok"] for e in engine.values())
    assert all(set(e["decode_tokens_per_s"]) == {"1", "2"} for e in engine.values())


def test_bars_read_the_llama_rows():
    ceilings = {"copy_GBps": 4000.0}
    rows = [{"kernel": "decode_attention", "case": "llama8b B=32 ctx=2048 kv=bf16", "GBps": 3000.0},
            {"kernel": "gemm_w4a16", "case": "llama8b M=1 N=6144 K=4096", "model": "llama8b", "M": 1,
             "speedup_vs_bf16": 2.5},
            {"kernel": "gemm_w4a16", "case": "llama8b M=1 N=4096 K=14336", "model": "llama8b", "M": 1,
             "speedup_vs_bf16": 1.5}]
    bars = evaluate_bars(rows, ceilings)
    assert bars["decode_attention_bf16_vs_copy"] == {"value": 0.75, "bar": 0.7, "met": True}
    assert bars["w4a16_batch1_speedup_vs_bf16_min"]["met"] is False          # the worst shape decides


def test_gpu_sweep_smoke_run_checks_every_configuration(tmp_path):
    from bench.gpu_sweep import main as sweep

    out = tmp_path / "sweep.json"
    assert sweep(["--smoke", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {r["kernel"] for r in report["rows"]} == {"decode_attention", "w4a16_gemv", "w4a16_prefill"}
    assert all(r["ok"] and r["ms"] > 0 for r in report["rows"])
    # Every shape names its best configuration and the dispatcher's own is among those timed.
    assert {b["kernel"] for b in report["best"]} == {"decode_attention", "w4a16_gemv", "w4a16_prefill"}
    assert all(b["current"] is not None and b["best_vs_current"] >= 1.0 for b in report["best"])
