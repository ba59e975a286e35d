"""Time per output token divides a request's decode time by the tokens of one sequence: a
/v1/completions request with several prompts decodes prompts x n sequences side by side, and
both /metrics and the console count it so. A client that left shows as such (499,
client_disconnected) whether its answer was a stream cut short or a whole answer never sent."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gateway.console.recorder import ConsoleRecorder
from gateway.context import RequestContext
from gateway.schema import CompletionRequest, parse_body
from gateway.telemetry.request import start_request
from gateway.telemetry.setup import build_telemetry
from gateway.tiers.base import TierCall
from gateway.token_bounds import sequences

DECODE_S = 0.035        # per token, per sequence
TOKENS = 24             # per sequence


def _body(prompts, n: int = 1) -> CompletionRequest:
    return parse_body(CompletionRequest, json.dumps({"model": "m", "prompt": prompts, "n": n}).encode())


def _finished(body: CompletionRequest) -> RequestContext:
    ctx = RequestContext("req-1", "completions", model="m", profile="latency", tier="small", tenant="acme",
                         tenant_class="interactive", chain=("small",))
    ctx.first_token_at = ctx.started + 0.1
    ctx.finished_at = ctx.first_token_at + (TOKENS - 1) * DECODE_S
    ctx.usage.completion_tokens = TOKENS * sequences(body)
    return ctx


def _tier():
    return SimpleNamespace(name="small", kind="embedded", address=None, port=None, config=SimpleNamespace(model="m"))


def _observed_tpot(body: CompletionRequest) -> float:
    telemetry = build_telemetry(None, environ={})
    ctx = _finished(body)
    request = start_request(telemetry, {"path": "/v1/completions", "method": "POST"}, None, None)
    request.tier_span(ctx, TierCall(ctx, body, "m"), _tier()).end()
    request.finish(ctx)
    registry = telemetry.metrics.registry
    labels = {"tier": "small", "profile": "latency", "tenant_class": "interactive"}
    total = registry.get_sample_value("gen_ai_server_time_per_output_token_seconds_sum", labels)
    return total / registry.get_sample_value("gen_ai_server_time_per_output_token_seconds_count", labels)


@pytest.mark.parametrize("prompts,n", [("once", 1), (["once"] * 4, 1), ("once", 4), (["a", "b"], 3)])
def test_metrics_tpot_is_per_sequence(prompts, n):
    assert _observed_tpot(_body(prompts, n)) == pytest.approx(DECODE_S)


@pytest.mark.parametrize("prompts,n", [(["once"] * 4, 1), (["a", "b"], 3)])
def test_console_tpot_is_per_sequence(prompts, n):
    body = _body(prompts, n)
    rt = SimpleNamespace(limits=None, tiers={})
    recorder = ConsoleRecorder(SimpleNamespace(current=rt), replica="test:1")
    limits = SimpleNamespace(call=SimpleNamespace(body=body), limits=SimpleNamespace(active=False))
    recorder.request_ended(rt, _finished(body), limits)
    recorder.series.sample({"small": {}})
    view = recorder.series.view("small")
    assert dict(zip(view["fields"], view["points"][-1]))["tpot_ms"] == pytest.approx(DECODE_S * 1000)


@pytest.mark.parametrize("status,disconnected", [(200, True), (499, False)])
def test_a_client_that_left_shows_as_499_in_console_log_and_metrics(status, disconnected):
    telemetry = build_telemetry(None, environ={})
    body = _body("once")
    ctx = _finished(body)
    ctx.status = status
    request = start_request(telemetry, {"path": "/v1/completions", "method": "POST"}, None, None)
    request.tier_span(ctx, TierCall(ctx, body, "m"), _tier()).end()
    request.finish(ctx, disconnected)
    errors = telemetry.metrics.registry.get_sample_value("tiergate_request_errors_total",
                                                        {"tier": "small", "reason": "client_disconnected"})
    rt = SimpleNamespace(limits=None, tiers={})
    recorder = ConsoleRecorder(SimpleNamespace(current=rt), replica="test:1")
    recorder.request_ended(rt, ctx, None)
    decision = recorder.decisions.recent(1)[0]
    assert errors == 1 and decision["status"] == 499 and decision["client_disconnected"] is True
    assert ctx.log_fields()["status"] == 499
