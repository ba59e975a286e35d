"""Build one embedded tier's engine from its YAML settings (runs in a worker thread).

Weights that cannot be quantized as asked, or a KV dtype the engine cannot build on this
device, do not stop the tier: it runs without them and says so at start and in /readyz
(`runs_without`).
"""

from __future__ import annotations

import logging

from engines.engine_config import EngineConfig
from engines.errors import ModelLoadError
from engines.llm_engine import LLMEngine
from engines.dtype_choice import choose_dtype
from engines.loaded_model import LoadedModel, load_model, resolve_checkpoint_dir, resolve_device
from engines.loaders.hf_checkpoint import open_hf_checkpoint
from engines.quantization.artifact_cache import ensure_quantized
from engines.quantization.calibration import CalibrationSource
from engines.spec.config import SpeculativeConfig
from policies.tier_config import EmbeddedTierConfig, SpeculativeSettings

log = logging.getLogger(__name__)

# Tier settings the gateway acts on itself: which weights to load and where, how the tier is named
# and admitted. Every other field of EmbeddedTierConfig is an EngineConfig field, passed on as is.
TIER_ONLY_FIELDS = frozenset({"kind", "model", "served_name", "dtype", "device", "quantization",
                              "quant_group_size", "max_in_flight", "capabilities", "threads",
                              "solo_threads", "engine_processes", "dense_prefill"})
# YAML name -> engine name, where they differ: the YAML takes a size with its unit ("512MiB").
ENGINE_FIELD_NAMES = {"kv_cache_memory": "kv_cache_memory_bytes"}


def _weights_source(name: str, cfg: EmbeddedTierConfig, calibration: CalibrationSource | None,
                    notes: list[str]) -> str:
    if not cfg.quantization:
        return cfg.model
    try:
        return str(ensure_quantized(cfg.model, cfg.quantization, cfg.quant_group_size, calibration=calibration))
    except (ModelLoadError, ValueError, NotImplementedError, RuntimeError) as exc:
        notes.append(f"{cfg.quantization} weights ({exc}): runs unquantized")
        log.warning("tier %s: cannot build %s weights (%s); running unquantized", name, cfg.quantization, exc)
        return cfg.model


def measured_dtype(name: str, cfg: EmbeddedTierConfig, source: str, log_level: int = logging.WARNING) -> str:
    """The dtype this tier's model runs fastest in here, with its weight format and batch size
    (logged at start like the tier's other load lines; a one-shot CLI command logs it at INFO)."""
    model_config = open_hf_checkpoint(resolve_checkpoint_dir(source)).config
    quantization = cfg.quantization if source != cfg.model else None    # None: its quantizing failed
    choice = choose_dtype(model_config, resolve_device(cfg.device), quantization, cfg.quant_group_size,
                          cfg.max_num_seqs)
    log.log(log_level, "tier %s: dtype auto -> %s", name, choice.reason)
    return choice.dtype


def speculative_config(settings: SpeculativeSettings) -> SpeculativeConfig:
    return SpeculativeConfig(**settings.model_dump())


def engine_config(cfg: EmbeddedTierConfig, kv_cache_dtype: str | None,
                  speculative: SpeculativeConfig | None) -> EngineConfig:
    """The engine's settings from the tier's, every shared field copied by name; the KV dtype and
    the speculative settings are the caller's, as the tier may have to run without them."""
    # mode "json": plain values (a ByteSize becomes its int)
    values = cfg.model_dump(mode="json", exclude=set(TIER_ONLY_FIELDS) | {"kv_cache_dtype", "speculative"})
    values = {ENGINE_FIELD_NAMES.get(name, name): value for name, value in values.items()}
    return EngineConfig(**values, kv_cache_dtype=kv_cache_dtype, speculative=speculative)


def load_tier_model(name: str, cfg: EmbeddedTierConfig, calibration: CalibrationSource | None = None,
                    log_level: int = logging.WARNING) -> tuple[LoadedModel, list[str]]:
    """The tier's weights as its settings ask (quantized artifact built or found, dtype measured;
    the dtype's line logged at `log_level`)."""
    notes: list[str] = []
    source = _weights_source(name, cfg, calibration, notes)
    dtype = measured_dtype(name, cfg, source, log_level) if cfg.dtype == "auto" else cfg.dtype
    dense = "auto" if cfg.dense_prefill == "auto" else None
    return load_model(source, dtype, device=cfg.device, dense_prefill=dense), notes


def engine_on(name: str, cfg: EmbeddedTierConfig, loaded: LoadedModel, notes: list[str]) -> LLMEngine:
    """The tier's engine on loaded weights; without its KV dtype (noted) when that cannot be built."""
    spec = None if cfg.speculative is None else speculative_config(cfg.speculative)

    def make(kv_dtype: str | None) -> LLMEngine:
        return LLMEngine(loaded, engine_config(cfg, kv_dtype, spec))

    kv = cfg.kv_cache_dtype
    try:
        return make(kv)
    except (ModelLoadError, ValueError, KeyError, NotImplementedError, TypeError) as exc:
        if kv is None:
            raise
        notes.append(f"{kv} KV cache ({exc}): KV in {loaded.dtype}")
        log.warning("tier %s: cannot build a %s KV cache (%s); KV stays %s", name, kv, exc, loaded.dtype)
        return make(None)


def build_engine(name: str, cfg: EmbeddedTierConfig,
                 calibration: CalibrationSource | None = None) -> tuple[LLMEngine, list[str]]:
    loaded, notes = load_tier_model(name, cfg, calibration)
    return engine_on(name, cfg, loaded, notes), notes


def build_worker_engine(name: str, cfg: EmbeddedTierConfig, source: str, dtype: str,
                        dense_prefill_rows: int | None = None) -> LLMEngine:
    """In an engine process (engines/engine_process.py): the tier's engine on the weights the
    gateway's process chose already (the quantized artifact it found or built, the dtype and the
    dense-prefill threshold it measured), so that every worker runs the same model without
    measuring again."""
    loaded = load_model(source, dtype, device=cfg.device, dense_prefill=dense_prefill_rows)
    return engine_on(name, cfg, loaded, [])
