"""Every Triton kernel launch of the GPU check's cases (SmolLM2 and Llama-8B sizes) compiles
for Hopper (sm_90) through the ptxas that ships with triton, without register spills (no
local memory, no stack frame), specialized as the JIT specializes real launches. No GPU
needed: this covers the compiled branches (native bf16/FP8 dots, hardware casts) the
interpreter never runs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow          # ~30 s of recording and ptxas

ROOT = Path(__file__).resolve().parents[2]


def _kernel_functions() -> set[str]:
    """The names of every @triton.jit function in kernels/triton/ that is launched (a *_kernel)."""
    names = set()
    for path in (ROOT / "kernels" / "triton").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel") and any(
                    ast.unparse(d) == "triton.jit" for d in node.decorator_list):
                names.add(node.name)
    return names


def test_every_launch_compiles_for_sm90_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "compile.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_check.py"), "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert all(v["ok"] and v["local"] == 0 and v["stack"] == 0 and v["reg"] > 0 for v in variants)
    launched = {v["kernel"] for v in variants}
    assert launched == _kernel_functions() and len(launched) >= 13        # none left uncompiled
    # Specialized as real launches are: the batch-1 GEMV of an H200 plan splits K.
    gemv = [v for v in variants if v["kernel"] == "_w4a16_gemv_kernel" and "llama8b" in v["case"]]
    assert gemv and all(v["constexprs"]["SPLIT"] for v in gemv)
    # Weight and KV streams are 16-byte vector loads: the GEMV's INT4 tiles only with its
    # alignment hints (8-byte loads without), and nothing streams bytes one at a time.
    assert all(v["load_bytes"].get("16", 0) >= 2 and "8" not in v["load_bytes"] for v in gemv)
    for v in variants:
        assert "1" not in v["load_bytes"], v
    decode = [v for v in variants if v["kernel"] == "_decode_kernel"]
    assert all(v["load_bytes"]["16"] > sum(v["load_bytes"].values()) / 2 for v in decode)
