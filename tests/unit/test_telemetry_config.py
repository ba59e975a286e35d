"""TelemetryConfig (YAML) resolved against the OTEL_* environment: environment wins."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.telemetry.config import (
    TelemetryConfig,
    TelemetryConfigError,
    resolve_telemetry,
)


def test_defaults_trace_nothing_and_record_no_content():
    s = resolve_telemetry(TelemetryConfig(), environ={})
    assert s.exporter == "none" and not s.enabled
    assert s.record_content is False
    assert s.traces_endpoint == "http://localhost:4318/v1/traces"
    assert (s.sampler, s.sampler_arg) == ("parentbased_traceidratio", 1.0)
    assert s.service_name == "tiergate"


def test_yaml_values_are_used_without_environment():
    cfg = TelemetryConfig(exporter="otlp", endpoint="http://collector:4318/", headers={"X-Token": "a"},
                          service_name="edge", sample_ratio=0.25, record_content=True, timeout_s=3)
    s = resolve_telemetry(cfg, environ={})
    assert s.exporter == "otlp"
    assert s.traces_endpoint == "http://collector:4318/v1/traces"
    assert dict(s.headers) == {"x-token": "a"}
    assert (s.service_name, s.timeout_s, s.record_content) == ("edge", 3, True)
    assert (s.sampler, s.sampler_arg) == ("parentbased_traceidratio", 0.25)
    # An endpoint that already names the traces path is not extended twice.
    assert resolve_telemetry(TelemetryConfig(endpoint="https://c/v1/traces"), {}).traces_endpoint == "https://c/v1/traces"


def test_unknown_key_and_bad_values_fail_with_the_field():
    with pytest.raises(ValidationError, match="exporterr"):
        TelemetryConfig.model_validate({"exporterr": "otlp"})
    with pytest.raises(ValidationError, match="exporter"):
        TelemetryConfig.model_validate({"exporter": "zipkin"})
    with pytest.raises(ValidationError, match="endpoint"):
        TelemetryConfig.model_validate({"endpoint": "collector:4318"})
    with pytest.raises(ValidationError, match="sample_ratio"):
        TelemetryConfig.model_validate({"sample_ratio": 1.5})


def test_environment_overrides_yaml():
    cfg = TelemetryConfig(exporter="console", endpoint="http://yaml:4318", headers={"a": "yaml", "b": "keep"},
                          service_name="yaml", sample_ratio=0.5, record_content=False)
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=env,c=x%3Dy%2Cz",
        "OTEL_SERVICE_NAME": "env-name",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
    }
    s = resolve_telemetry(cfg, environ=env)
    assert s.exporter == "otlp"
    assert s.traces_endpoint == "http://env:4318/v1/traces"
    assert dict(s.headers) == {"a": "env", "b": "keep", "c": "x=y,z"}
    assert s.service_name == "env-name"
    # The ARG applies to the YAML's parent-based ratio sampler when no sampler is named.
    assert (s.sampler, s.sampler_arg) == ("parentbased_traceidratio", 0.1)
    assert s.timeout_s == 2.5
    assert s.record_content is True


def test_signal_specific_variables_beat_the_generic_ones():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:9999/custom/path",
           "OTEL_EXPORTER_OTLP_HEADERS": "k=generic", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "k=traces",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500"}
    s = resolve_telemetry(TelemetryConfig(exporter="otlp"), environ=env)
    assert s.traces_endpoint == "http://traces:9999/custom/path"  # used as given, no /v1/traces
    assert dict(s.headers) == {"k": "traces"}
    assert s.timeout_s == 0.5


def test_sdk_disabled_wins_over_everything():
    env = {"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}
    assert resolve_telemetry(TelemetryConfig(exporter="console"), environ=env).exporter == "none"
    # Any other value leaves tracing as configured, like the SDK.
    assert resolve_telemetry(TelemetryConfig(exporter="console"), {"OTEL_SDK_DISABLED": "false"}).exporter == "console"


def test_exporter_none_from_env_turns_off_yaml_otlp():
    assert resolve_telemetry(TelemetryConfig(exporter="otlp"), {"OTEL_TRACES_EXPORTER": "none"}).enabled is False


@pytest.mark.parametrize("sampler, arg, expected", [
    ("always_on", "", ("always_on", None)),
    ("always_off", "0.3", ("always_off", None)),
    ("traceidratio", "", ("traceidratio", 1.0)),
    ("traceidratio", "0.3", ("traceidratio", 0.3)),
    ("parentbased_always_off", "", ("parentbased_always_off", None)),
    ("ParentBased_TraceIdRatio", "0", ("parentbased_traceidratio", 0.0)),
])
def test_sampler_from_environment(sampler, arg, expected):
    env = {"OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": arg}
    s = resolve_telemetry(TelemetryConfig(sample_ratio=0.9), environ=env)
    assert (s.sampler, s.sampler_arg) == expected


@pytest.mark.parametrize("env, message", [
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: 'zipkin' is not one of otlp, console, none"),
    ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER: 'otlp,console': tiergate takes one"),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER: 'sometimes' is not one of"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
     "OTEL_TRACES_SAMPLER_ARG: 'half' is not a number"),
    ({"OTEL_TRACES_SAMPLER_ARG": "2"}, "OTEL_TRACES_SAMPLER_ARG: '2' must be within [0, 1]"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' is not"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-5"}, "OTEL_EXPORTER_OTLP_TIMEOUT: '-5' must be a positive"),
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' is not supported"),
    ({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "maybe"}, "CAPTURE_MESSAGE_CONTENT: 'maybe'"),
])
def test_bad_environment_values_fail_with_the_variable_name(env, message):
    with pytest.raises(TelemetryConfigError) as info:
        resolve_telemetry(TelemetryConfig(), environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_header_entry_does_not_echo_the_secret():
    with pytest.raises(TelemetryConfigError) as info:
        resolve_telemetry(TelemetryConfig(), {"OTEL_EXPORTER_OTLP_HEADERS": "ok=1,s3cr3t-token"})
    assert str(info.value) == "OTEL_EXPORTER_OTLP_HEADERS: entry 2 is not key=value"
    # Nor does the resolved settings' repr show header values.
    s = resolve_telemetry(TelemetryConfig(headers={"authorization": "Bearer s3cr3t"}), {})
    assert "s3cr3t" not in repr(s)


def test_http_protobuf_protocol_is_accepted():
    s = resolve_telemetry(TelemetryConfig(exporter="otlp"), {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert s.exporter == "otlp"


def test_environ_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-process-env")
    assert resolve_telemetry(TelemetryConfig()).service_name == "from-process-env"


def test_build_telemetry_gives_each_gateway_its_own_parts():
    from gateway.telemetry.setup import build_telemetry

    a = build_telemetry(TelemetryConfig(exporter="console"), environ={"OTEL_TRACES_EXPORTER": "none"})
    b = build_telemetry(TelemetryConfig(exporter="none"), environ={})
    assert not a.tracing.enabled and a.settings.exporter == "none"
    assert a.metrics.registry is not b.metrics.registry
    a.shutdown()
    with pytest.raises(TelemetryConfigError, match="OTEL_TRACES_SAMPLER"):
        build_telemetry(TelemetryConfig(), environ={"OTEL_TRACES_SAMPLER": "nope"})


def test_config_model_imports_only_pydantic():
    """GatewayConfig embeds TelemetryConfig from policies/: importing it must pull in neither OTel
    nor the gateway (policies never imports the gateway); of policies/ only the URL checks, which
    import nothing but the standard library."""
    import subprocess
    import sys

    code = ("import sys, policies.telemetry_config; "
            "bad = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'prometheus_client', "
            "'starlette', 'engines', 'gateway')) or (m.startswith('policies.') and m not in "
            "('policies.telemetry_config', 'policies.url_check'))); print(bad); assert not bad")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gateway_config_has_the_section_and_tenants_the_opt_in():
    from gateway.telemetry.config import TelemetryConfig as Reexported
    from policies.config import ConfigError, parse_config

    cfg = parse_config("""
auth: {enabled: false}
tenants: {default: {}, a: {record_content: true}, b: {}}
tiers: {up: {kind: upstream, base_url: "http://127.0.0.1:9/v1", model: m}}
telemetry: {exporter: otlp, endpoint: "http://collector:4318", record_content: true}
""")
    assert isinstance(cfg.telemetry, Reexported) and cfg.telemetry.exporter == "otlp"
    assert cfg.tenants["a"].record_content is True and cfg.tenants["b"].record_content is False
    assert parse_config('auth: {enabled: false}\n'
                        'tiers: {up: {kind: upstream, base_url: "http://h/v1", model: m}}').telemetry.exporter == "none"
    with pytest.raises(ConfigError, match=r"telemetry\.endpoint: .*not an http\(s\) URL"):
        parse_config('tiers: {up: {kind: upstream, base_url: "http://h/v1", model: m}}\n'
                     'telemetry: {endpoint: "collector:4318"}')
    with pytest.raises(ConfigError, match=r"telemetry\.exporterr"):
        parse_config('tiers: {up: {kind: upstream, base_url: "http://h/v1", model: m}}\n'
                     'telemetry: {exporterr: otlp}')
    assert issubclass(TelemetryConfigError, ConfigError)  # the CLI turns it into exit 2 + one line
