"""Traces (OpenTelemetry) and /metrics (Prometheus) for one gateway.

`config` holds the YAML model and its resolution with the OTEL_* environment; `tracing`
builds a TracerProvider per gateway and the span helpers; `metrics` a CollectorRegistry per
gateway and the /metrics endpoint. This package imports nothing from the rest of gateway.
"""
