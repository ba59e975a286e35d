"""Telemetry settings: the `telemetry:` YAML section, resolved against the OTEL_* environment.

Precedence: environment over YAML. The YAML file ships with the image; the standard OTEL_*
variables are how a deployment points the same image at its own collector, so they win,
key by key (headers merge, an env header replacing a YAML header of the same name).
OTEL_SDK_DISABLED=true always wins and turns tracing off.

The pydantic model itself lives in policies/telemetry_config.py (GatewayConfig embeds it and
policies never imports the gateway); this module adds the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from policies.config import ConfigError
from policies.telemetry_config import EXPORTERS, Exporter, TelemetryConfig, http_url_problem

__all__ = ["EXPORTERS", "SAMPLERS", "Exporter", "TelemetryConfig", "TelemetryConfigError", "TelemetrySettings",
           "resolve_telemetry"]

SAMPLERS: tuple[str, ...] = ("always_on", "always_off", "traceidratio",
                             "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio")
DEFAULT_OTLP_BASE = "http://localhost:4318"
TRACES_PATH = "/v1/traces"
# Values of the GenAI instrumentations' content switch; anything but these two turns it on.
_CONTENT_OFF = ("false", "no_content")
_CONTENT_ON = ("true", "span_only", "event_only", "span_and_event")


class TelemetryConfigError(ConfigError):
    """A telemetry setting (YAML or OTEL_* variable) is invalid; the message names it.

    A ConfigError, so `tiergate serve` ends with exit 2 and this one line."""


@dataclass(frozen=True)
class TelemetrySettings:
    """What the tracing module builds from: YAML and environment, resolved."""

    exporter: Exporter = "none"
    traces_endpoint: str = DEFAULT_OTLP_BASE + TRACES_PATH
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold credentials
    timeout_s: float = 10.0
    service_name: str = "tiergate"
    sampler: str = "parentbased_always_on"
    sampler_arg: float | None = None
    record_content: bool = False

    @property
    def enabled(self) -> bool:
        return self.exporter != "none"


def resolve_telemetry(config: TelemetryConfig | None = None,
                      environ: Mapping[str, str] | None = None) -> TelemetrySettings:
    """Combine the YAML section with OTEL_* variables (environment wins).

    `environ` defaults to os.environ; tests pass a dict. Raises TelemetryConfigError.
    """
    cfg = config or TelemetryConfig()
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if k.startswith("OTEL_")}

    exporter = _exporter(cfg, env)
    _check_protocol(env)
    sampler, sampler_arg = _sampler(cfg, env)
    return TelemetrySettings(
        exporter=exporter,
        traces_endpoint=_traces_endpoint(cfg, env),
        headers=_headers(cfg, env),
        timeout_s=_timeout(cfg, env),
        service_name=env.get("OTEL_SERVICE_NAME", "").strip() or cfg.service_name,
        sampler=sampler,
        sampler_arg=sampler_arg,
        record_content=_record_content(cfg, env),
    )


def _exporter(cfg: TelemetryConfig, env: Mapping[str, str]) -> Exporter:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        return cfg.exporter
    if "," in raw:
        raise TelemetryConfigError(f"OTEL_TRACES_EXPORTER: {raw!r}: tiergate takes one exporter, one of "
                                   f"{', '.join(EXPORTERS)}")
    if raw not in EXPORTERS:
        raise TelemetryConfigError(f"OTEL_TRACES_EXPORTER: {raw!r} is not one of {', '.join(EXPORTERS)}")
    return raw  # type: ignore[return-value]


def _check_protocol(env: Mapping[str, str]) -> None:
    # Only the HTTP/protobuf exporter is installed; a grpc request must not silently become HTTP.
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(name, "").strip()
        if value:
            if value != "http/protobuf":
                raise TelemetryConfigError(f"{name}: {value!r} is not supported; tiergate exports http/protobuf")
            return


def _traces_endpoint(cfg: TelemetryConfig, env: Mapping[str, str]) -> str:
    exact = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if exact:  # the signal-specific variable is used as given (OTLP exporter spec)
        _check_http_url(exact, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        return exact
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if base:
        _check_http_url(base, "OTEL_EXPORTER_OTLP_ENDPOINT")
        return base.rstrip("/") + TRACES_PATH
    if cfg.endpoint:
        url = cfg.endpoint.rstrip("/")
        return url if url.endswith(TRACES_PATH) else url + TRACES_PATH
    return DEFAULT_OTLP_BASE + TRACES_PATH


def _headers(cfg: TelemetryConfig, env: Mapping[str, str]) -> dict[str, str]:
    headers = {k.lower(): v for k, v in cfg.headers.items()}
    for name in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        headers.update(_parse_headers(name, env.get(name, "")))
    return headers


def _parse_headers(name: str, raw: str) -> dict[str, str]:
    """W3C-baggage-like `k1=v1,k2=v2` with URL-encoded values. Values are secrets: never echoed."""
    out: dict[str, str] = {}
    for i, item in enumerate(raw.split(","), start=1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = unquote(key).strip().lower()
        if not sep or not key:
            raise TelemetryConfigError(f"{name}: entry {i} is not key=value")
        out[key] = unquote(value).strip()
    return out


def _timeout(cfg: TelemetryConfig, env: Mapping[str, str]) -> float:
    for name in ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"):
        raw = env.get(name, "").strip()
        if raw:
            millis = _number(name, raw)
            if millis <= 0:
                raise TelemetryConfigError(f"{name}: {raw!r} must be a positive number of milliseconds")
            return millis / 1000.0
    return cfg.timeout_s


def _sampler(cfg: TelemetryConfig, env: Mapping[str, str]) -> tuple[str, float | None]:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    raw_arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if name and name not in SAMPLERS:
        raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER: {name!r} is not one of {', '.join(SAMPLERS)}")
    if not name:
        # YAML's ratio, parent-based so a client's sampling decision is kept end to end.
        name = "parentbased_traceidratio"
        arg = cfg.sample_ratio
    else:
        arg = 1.0
    if not name.endswith("traceidratio"):
        return name, None
    if raw_arg:
        arg = _number("OTEL_TRACES_SAMPLER_ARG", raw_arg)
        if not 0.0 <= arg <= 1.0:
            raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER_ARG: {raw_arg!r} must be within [0, 1]")
    return name, arg


def _record_content(cfg: TelemetryConfig, env: Mapping[str, str]) -> bool:
    name = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    raw = env.get(name, "").strip().lower()
    if not raw:
        return cfg.record_content
    if raw in _CONTENT_OFF:
        return False
    if raw in _CONTENT_ON:
        return True
    raise TelemetryConfigError(f"{name}: {raw!r} is not one of {', '.join(_CONTENT_OFF + _CONTENT_ON)}")


def _number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise TelemetryConfigError(f"{name}: {raw!r} is not a number") from None


def _check_http_url(url: str, where: str) -> None:
    problem = http_url_problem(url)
    if problem:
        raise TelemetryConfigError(f"{where}: {problem}")
