"""Settings that policies restates from engines (policies never imports engines) agree with them
exactly: the YAML schema of speculative decoding and of an embedded tier against the engine's
dataclasses, the quantization method names, the INT4 group sizes and the KV dtypes. The gateway's
conversion from the one to the other carries every shared field."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from pydantic import ValidationError
from pydantic_core import PydanticUndefined

from engines.engine_config import EngineConfig
from engines.kv_cache import KV_CACHE_DTYPES
from engines.quantization import build
from engines.quantization.methods import ARTIFACT_METHODS, CALIBRATED_METHODS, GGUF_METHODS, INT4_GROUP_SIZES, LAYER_METHODS
from engines.spec.build import SELF_DRAFT_QUANTIZATIONS
from engines.spec.config import SpeculativeConfig
from gateway.tiers.embedded_load import ENGINE_FIELD_NAMES, TIER_ONLY_FIELDS, engine_config, speculative_config
from policies.tier_config import EmbeddedTierConfig, SpeculativeSettings

REQUIRED = "<required>"

# EngineConfig fields a YAML file does not set, and why.
ENGINE_ONLY_FIELDS = {
    "headroom_fraction": "tests set 0 to fill the KV pool exactly; a served tier keeps the engine's 1%",
    "seed": "a served tier samples unseeded requests at random; a request that wants repeatable "
            "output sends its own seed",
}
# Shared fields whose tier default deliberately differs from the engine's, and why.
TIER_DEFAULTS_DIFFER = {
    "max_model_len": "a served tier caps the context by default so its KV pool holds many sequences; "
                     "the engine alone defaults to the model's full context (None: max_position_embeddings)",
}


def _schema_defaults(model) -> dict:
    return {name: REQUIRED if f.default is PydanticUndefined else f.default for name, f in model.model_fields.items()}


def _engine_defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = REQUIRED
    return out


def _members(annotation) -> tuple[tuple, bool]:
    """(the Literal's values, whether None is allowed) of `Literal[...]`, `Literal[...] | None`, `str | None`."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) \
        else (annotation,)
    nullable = type(None) in args
    literals = tuple(v for a in args if typing.get_origin(a) is typing.Literal for v in typing.get_args(a))
    return literals, nullable


def _schema_members(model, name: str) -> tuple[tuple, bool]:
    return _members(model.model_fields[name].annotation)


def _shared_tier_fields() -> dict[str, str]:
    """Tier field -> engine field, for every tier field the engine takes."""
    return {name: ENGINE_FIELD_NAMES.get(name, name) for name in EmbeddedTierConfig.model_fields
            if name not in TIER_ONLY_FIELDS}


# --- methods, group sizes, KV dtypes -----------------------------------------------------------

def test_quantization_method_lists_are_consistent():
    assert not set(LAYER_METHODS) & set(CALIBRATED_METHODS)
    assert not set(GGUF_METHODS) & set(LAYER_METHODS + CALIBRATED_METHODS)
    assert sorted(ARTIFACT_METHODS) == sorted(LAYER_METHODS + CALIBRATED_METHODS + GGUF_METHODS)
    assert list(build.ALGORITHM_VERSIONS) == list(ARTIFACT_METHODS)
    # a self-draft is quantized in-process, so only by a method that needs no calibration
    assert sorted(SELF_DRAFT_QUANTIZATIONS) == sorted(LAYER_METHODS)


def test_schema_methods_group_sizes_and_kv_dtypes_are_the_engines():
    for model, name in ((EmbeddedTierConfig, "quantization"), (SpeculativeSettings, "draft_quantization")):
        assert _schema_members(model, name) == (ARTIFACT_METHODS, True), name
    for model, name in ((EmbeddedTierConfig, "quant_group_size"), (SpeculativeSettings, "draft_group_size")):
        assert _schema_members(model, name) == (INT4_GROUP_SIZES, False), name
    for model, name in ((EmbeddedTierConfig, "kv_cache_dtype"), (SpeculativeSettings, "draft_kv_cache_dtype")):
        assert _schema_members(model, name) == (tuple(KV_CACHE_DTYPES), True), name


def test_cli_quantize_takes_the_engines_methods_and_group_sizes(tmp_path, capsys):
    from gateway.cli.main import _build_parser, main

    sub = next(a for a in _build_parser()._actions if a.dest == "command")
    method = next(a for a in sub.choices["quantize"]._actions if a.dest == "method")
    assert tuple(method.choices) == ARTIFACT_METHODS
    assert main(["quantize", "--method", "int8", "--group-size", "48", "--out", str(tmp_path)]) == 2
    assert "--group-size must be one of " + ", ".join(map(str, INT4_GROUP_SIZES)) in capsys.readouterr().err


# --- speculative decoding ----------------------------------------------------------------------

def test_speculative_fields_and_defaults_agree():
    assert list(SpeculativeSettings.model_fields) == [f.name for f in dataclasses.fields(SpeculativeConfig)]
    assert _schema_defaults(SpeculativeSettings) == _engine_defaults(SpeculativeConfig)


def test_speculative_allowed_values_agree():
    hints = typing.get_type_hints(SpeculativeConfig)
    for name in SpeculativeSettings.model_fields:
        schema_values, schema_nullable = _schema_members(SpeculativeSettings, name)
        engine_values, engine_nullable = _members(hints[name])
        assert schema_nullable == engine_nullable, name
        if engine_values:                       # the engine names its values: the same ones
            assert schema_values == engine_values, name


# Values at and around each bound of the engine's checks and the schema's.
PROBES = {
    "num_tokens": [-1, 0, 1, 16, 17],
    "ngram_max": [0, 1, 4, 5],
    "ngram_min": [0, 1, 4, 5],
    "max_batch": [-1, 0, 1, 8],
    "verify_cost": [-1.0, -1e-9, 0.0, 0.05, 1.0, 1e6],
    "draft_group_size": [16, 32, 48, 64, 128, 256, 512],
    "method": ["ngram", "draft", "self", "eagle"],
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_speculative_schema_accepts_only_what_the_engine_accepts(name):
    """A file the schema passes never fails when its engine starts: every probe the schema accepts,
    the engine accepts; every probe the engine refuses, the schema refuses at load."""
    accepted = 0
    for value in PROBES[name]:
        for method in ("ngram", "self", "draft"):
            raw = {"method": method, "draft_model": "a.gguf" if method == "draft" else None, name: value}
            try:
                settings = SpeculativeSettings(**raw)
            except ValidationError:
                continue
            speculative_config(settings)          # must not raise
            accepted += 1
    assert accepted


def test_speculative_cross_field_rules_agree():
    for raw in ({"method": "draft"}, {"method": "ngram", "ngram_min": 3, "ngram_max": 2}):
        with pytest.raises(ValidationError):
            SpeculativeSettings(**raw)
        with pytest.raises(ValueError):
            SpeculativeConfig(**raw)


def test_every_speculative_setting_reaches_the_engine():
    values = {"method": "self", "num_tokens": 7, "draft_model": "draft.gguf", "draft_quantization": "int8",
              "draft_kv_cache_dtype": "fp8", "ngram_max": 6, "ngram_min": 2, "adaptive": False, "max_batch": 3,
              "verify_cost": 0.2, "draft_group_size": 64}
    assert set(values) == set(SpeculativeSettings.model_fields)     # a new field needs a value here
    defaults = _schema_defaults(SpeculativeSettings)
    assert all(values[n] != defaults[n] for n in values if n != "method")
    assert dataclasses.asdict(speculative_config(SpeculativeSettings(**values))) == values


# --- embedded tier vs engine -------------------------------------------------------------------

def test_every_tier_field_is_tier_only_or_an_engine_field():
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert TIER_ONLY_FIELDS <= set(EmbeddedTierConfig.model_fields)
    assert set(ENGINE_FIELD_NAMES) <= set(_shared_tier_fields())
    shared = set(_shared_tier_fields().values())
    assert shared <= engine_fields
    assert engine_fields - shared == set(ENGINE_ONLY_FIELDS)


def test_tier_defaults_are_the_engines_but_the_listed_ones():
    tier, engine = _schema_defaults(EmbeddedTierConfig), _engine_defaults(EngineConfig)
    differ = {name for name, engine_name in _shared_tier_fields().items() if tier[name] != engine[engine_name]}
    assert differ == set(TIER_DEFAULTS_DIFFER)


def test_every_tier_engine_setting_reaches_the_engine():
    values = {"max_model_len": 512, "kv_cache_memory": "3MiB", "block_size": 32, "max_num_seqs": 4,
              "max_num_batched_tokens": 64, "enable_prefix_caching": False, "kv_cache_dtype": "int8",
              "speculative": {"method": "ngram", "num_tokens": 3}}
    assert set(values) == set(_shared_tier_fields())            # a new field needs a value here
    cfg = EmbeddedTierConfig(**values)
    spec = speculative_config(cfg.speculative)
    engine = engine_config(cfg, cfg.kv_cache_dtype, spec)
    expected = {**values, "kv_cache_memory": 3 * 2**20, "speculative": spec}
    for name, engine_name in _shared_tier_fields().items():
        assert getattr(engine, engine_name) == expected[name], name
    assert type(engine.kv_cache_memory_bytes) is int
    defaults = _engine_defaults(EngineConfig)
    assert all(getattr(engine, name) == defaults[name] for name in ENGINE_ONLY_FIELDS)


def test_the_caller_decides_kv_dtype_and_speculation():
    """A tier falls back to the model's KV dtype, or to plain decoding, when the engine cannot run them."""
    cfg = EmbeddedTierConfig(kv_cache_dtype="int4", speculative={"method": "ngram"})
    engine = engine_config(cfg, None, None)
    assert engine.kv_cache_dtype is None and engine.speculative is None
