"""YAML schema of the `telemetry:` section (traces exporter, sampling, content recording).

Pure pydantic, like the rest of policies/: the gateway resolves it against the OTEL_*
environment and builds tracing and metrics from it (gateway/telemetry/config.py).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from policies.url_check import shown_url

Exporter = Literal["otlp", "console", "none"]
EXPORTERS: tuple[str, ...] = ("otlp", "console", "none")


def http_url_problem(url: str) -> str | None:
    """None for an http(s) URL with a host, else what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown_url(url)!r} is not an http(s) URL with a host"
    return None


class TelemetryConfig(BaseModel):
    """The `telemetry:` section of the gateway's YAML."""

    model_config = ConfigDict(extra="forbid")

    exporter: Exporter = Field(
        "none", description="otlp (OTLP over HTTP/protobuf), console (JSON lines on stdout) or none")
    endpoint: str | None = Field(
        None, description="OTLP/HTTP collector URL, e.g. http://collector:4318; /v1/traces is appended "
                          "unless the path already ends with it")
    headers: dict[str, str] = Field(default_factory=dict, description="sent with every OTLP export")
    timeout_s: float = Field(10.0, gt=0, description="per OTLP export request")
    service_name: str = Field("tiergate", min_length=1)
    sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0,
        description="share of new traces recorded; a client's sampled traceparent is always honoured")
    record_content: bool = Field(
        False, description="allow prompt/completion text in spans for tenants that opt in "
                           "(tenants.<name>.record_content); false: never, whatever a tenant asks")

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            problem = http_url_problem(value)
            if problem:
                raise ValueError(problem)  # pydantic reports it with the field path
        return value
