#!/usr/bin/env bash
# The GPU check: first the whole engine on CUDA (SmolLM2 fp32 greedy tokens equal to
# the CPU path's, bf16 agreement, decode tokens/s at batch 1 and 32), then every kernel's
# correctness at real sizes, do_bench timings, GB/s and TFLOP/s next to the chip's measured copy
# bandwidth and bf16 matmul rate. PASS/FAIL lines on stdout, figures in the JSON. CUDA machine only;
# under 5 minutes (the timeout is the budget). Usage: bench/gpu_check.sh [OUT.json] [--no-engine]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
unset TRITON_INTERPRET
exec timeout 300 "$PYTHON" bench/gpu_check.py --json "${1:-gpu_check.json}" "${@:2}"
