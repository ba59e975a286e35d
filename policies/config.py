"""The gateway's YAML configuration as pydantic models.

A bad file fails at start with the field path and the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)


class EmbeddedTier(_Strict):
    kind: Literal["embedded"] = "embedded"
    model: str = Field("default", description="'default' (bundled SmolLM2), a .gguf file or an HF directory")
    served_name: str | None = Field(None, description="model id shown to clients; defaults to the tier name")
    dtype: Literal["float32", "bfloat16"] = "bfloat16"
    max_model_len: int = Field(2048, gt=0)
    kv_cache_memory: ByteSize = Field(ByteSize(512 * 2**20), description="KV pool size, e.g. '512MiB'")
    block_size: int = Field(16, gt=0, le=256)
    max_num_seqs: int = Field(128, gt=0)
    max_num_batched_tokens: int = Field(2048, gt=0)
    enable_prefix_caching: bool = True
    quantization: Literal["int8", "int4-rtn", "int4-awq", "fp8"] | None = Field(
        None, description="weight quantization; the artifact is built and cached on first start")
    quant_group_size: Literal[32, 64, 128, 256] = 128
    kv_cache_dtype: Literal["int8"] | None = Field(None, description="None: the model dtype")

    @model_validator(mode="after")
    def _budget_covers_batch(self) -> "EmbeddedTier":
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        return self


class GatewayConfig(_Strict):
    server: ServerConfig = ServerConfig()
    tiers: dict[str, EmbeddedTier]
    default_tier: str | None = None

    @model_validator(mode="after")
    def _default_tier_exists(self) -> "GatewayConfig":
        if not self.tiers:
            raise ValueError("at least one tier is required")
        if self.default_tier is None:
            self.default_tier = next(iter(self.tiers))
        elif self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of the tiers {sorted(self.tiers)}")
        return self


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})".replace("\n", " ")) from None
    try:
        return GatewayConfig.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{path}: {where}: {first['msg']}{more}") from None
