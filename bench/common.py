"""Helpers shared by the benchmarks: machine description, percentiles, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any

import torch

from gateway.finite_json import finite


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    if len(values) == 1:
        return {"p50": values[0], "p90": values[0], "p99": values[0]}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p90": q[89], "p99": q[98]}


def samples(values: list[float], digits: int = 2) -> list[float]:
    """Per-request figures as the JSON keeps them (for the CDFs of `--report`), rounded."""
    return [round(v, digits) for v in values]


def write_json(path: str | Path, report: dict[str, Any]) -> None:
    """NaN and infinities (the percentiles of no sample) are written as null (gateway/finite_json.py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(report), indent=2, allow_nan=False) + "\n")

