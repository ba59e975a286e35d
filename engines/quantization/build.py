"""Quantize a loaded model by method name, and write the result as a loadable artifact."""

from __future__ import annotations

from pathlib import Path

from engines.loaded_model import load_model
from engines.loaders.gguf_cache import converted_from
from engines.model.fused_decoder import attach_fused_decoder
from engines.quantization import quantize_model
from engines.quantization.artifact import save_artifact
from engines.quantization.awq import awq_quantize
from engines.quantization.calibration import CalibrationSource, calibration_sequences
from engines.quantization.gguf_int4 import REST_METHOD, install_gguf_int4
from engines.quantization.gguf_w4a8 import install_gguf_w4a8
from engines.quantization.gptq_model import gptq_quantize_model
from engines.quantization.methods import ARTIFACT_METHODS, CALIBRATED_METHODS, effective_group_size

# Part of the cache key and the artifact's config: bump a method's version whenever its algorithm
# changes, so an artifact an older version built is never reused (AWQ 2: the Gram-matrix searches;
# int4-gguf 2: Q4_1 tensors load as stored too).
ALGORITHM_VERSIONS = {"int8": 1, "int4-rtn": 1, "int4-awq": 2, "int4-gptq": 1, "fp8": 1, "int4-gguf": 2, "w8a8": 1, "w4a8": 1,
                      "w4a8-gguf": 1}
AWQ_CALIBRATION = {"n": 16, "max_tokens": 256}
# GPTQ fits each layer to its calibration inputs: with 16 x 256 tokens it over-fits them (its error on
# other text was ~3x its error on the calibration text), so it reads more text than AWQ.
GPTQ_CALIBRATION = {"n": 64, "max_tokens": 512}
GPTQ_OPTIONS = {"act_order": True, "damp": 0.1}


def check_method(method: str, calibration: CalibrationSource | None) -> None:
    if method not in ARTIFACT_METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {list(ARTIFACT_METHODS)}")
    if method in CALIBRATED_METHODS and calibration is None:
        raise ValueError(f"{method} needs calibration text and none was given")


def method_settings(method: str, calibration: CalibrationSource | None) -> dict:
    """Everything besides the source and group size that decides a method's output: recorded in
    the artifact's config and hashed into its cache key, so a changed setting builds a new one."""
    check_method(method, calibration)
    settings: dict = {"algorithm_version": ALGORITHM_VERSIONS[method]}
    if method == "int4-gguf":
        settings["rest"] = REST_METHOD            # how the linears that are not Q4_K are quantized
    elif method == "int4-awq":
        settings["calibration"] = {**AWQ_CALIBRATION, "records_from": calibration.name}
    elif method == "int4-gptq":
        settings["calibration"] = {**GPTQ_CALIBRATION, "records_from": calibration.name}
        settings["gptq"] = {**GPTQ_OPTIONS, "sequential": False, "clip_search": True}
    return settings


def quantize_loaded(loaded, method: str, group_size: int, calibration: CalibrationSource | None = None) -> dict:
    """Quantize a loaded model in place; returns what the artifact's config records about it."""
    settings = method_settings(method, calibration)
    if method == "int4-awq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template, calibration, **AWQ_CALIBRATION)
        awq_quantize(loaded.model, calib, group_size)
    elif method == "int4-gptq":
        calib = calibration_sequences(loaded.tokenizer, loaded.chat_template, calibration, **GPTQ_CALIBRATION)
        gptq_quantize_model(loaded.model, calib, group_size, **GPTQ_OPTIONS)
    elif method in ("int4-gguf", "w4a8-gguf"):
        gguf_path = converted_from(loaded.path)
        if gguf_path is None:
            raise ValueError(f"{method} reads the 4-bit blocks of a GGUF file: the source must be a .gguf file or "
                             f"a bundled model, not {loaded.name!r}")
        settings["linears"] = (install_gguf_int4(loaded.model, gguf_path, settings["rest"]) if method == "int4-gguf"
                               else install_gguf_w4a8(loaded.model, gguf_path))
    else:
        quantize_model(loaded.model, method, group_size)
    attach_fused_decoder(loaded.model)
    return settings


def quantize_to_dir(source: str, method: str, group_size: int, out_dir: Path,
                    calibration: CalibrationSource | None = None) -> Path:
    """Quantize `source` (bf16 activations) and write a loadable artifact into `out_dir`."""
    check_method(method, calibration)
    group_size = effective_group_size(method, group_size)
    loaded = load_model(source, "bfloat16")
    extra = {"source": str(loaded.path), **quantize_loaded(loaded, method, group_size, calibration)}
    save_artifact(loaded.model, loaded.path, out_dir, method, group_size, extra)
    return out_dir
