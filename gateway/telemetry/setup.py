"""One call for the gateway: resolve the settings, build tracing and metrics, stop them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry.sdk.trace.export import SpanExporter

from gateway.telemetry.config import (
    TelemetryConfig,
    TelemetrySettings,
    resolve_telemetry,
)
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Tracing, build_tracing


@dataclass
class Telemetry:
    settings: TelemetrySettings
    tracing: Tracing
    metrics: GatewayMetrics

    def shutdown(self) -> None:
        """Export the spans still queued; call from the app's lifespan shutdown."""
        self.tracing.shutdown()


def build_telemetry(config: TelemetryConfig | None = None, environ: Mapping[str, str] | None = None, *,
                    exporter: SpanExporter | None = None) -> Telemetry:
    """Raises TelemetryConfigError (one line naming the setting) on a bad OTEL_* value.

    `exporter` replaces the configured one and turns tracing on (tests: InMemorySpanExporter)."""
    settings = resolve_telemetry(config, environ)
    return Telemetry(settings, build_tracing(settings, exporter=exporter), GatewayMetrics())
