"""A gateway whose spans land in an InMemorySpanExporter, in front of a tiny embedded tier and
of an upstream that records the headers it receives (to see the traceparent passed on).

Real HTTP throughout: uvicorn for the gateway (tests/gateway_harness.py) and for the upstream.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from pathlib import Path

import uvicorn
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gateway.telemetry.setup import build_telemetry
from policies.config import hash_api_key, load_config
from tests.gateway_harness import RunningGateway, free_port

UPSTREAM_TEXT = ["Recorded", " answer", " from", " upstream."]
UPSTREAM_ID = "up-resp-7"
APP_KEY = "sk-telemetry-app-0123456789"
AUDITED_KEY = "sk-telemetry-audited-0123456789"
LIMITED_KEY = "sk-telemetry-limited-0123456789"


class RecordingUpstream:
    """An OpenAI-compatible server (chat + completions, JSON or SSE with usage) that keeps the
    headers of every request it gets."""

    def __init__(self):
        self.requests: list[dict] = []
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        app = Starlette(routes=[Route("/v1/chat/completions", self._answer, methods=["POST"]),
                                Route("/v1/completions", self._answer, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, name="recording-upstream", daemon=True)
        self.thread.start()
        deadline = time.time() + 120
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("recording upstream did not start")
            time.sleep(0.05)

    async def _answer(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        chat = request.url.path.endswith("/chat/completions")
        prompt_tokens, completion_tokens = 11, len(UPSTREAM_TEXT)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 3}}
        head = {"id": UPSTREAM_ID, "created": 0, "model": body["model"] + "-served"}
        if not body.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(UPSTREAM_TEXT)},
                       "finish_reason": "stop"} if chat else
                      {"index": 0, "text": "".join(UPSTREAM_TEXT), "finish_reason": "stop"})
            return JSONResponse({**head, "object": "chat.completion" if chat else "text_completion",
                                 "choices": [choice], "usage": usage})

        def event(choices: list, **extra) -> bytes:
            obj = "chat.completion.chunk" if chat else "text_completion"
            return b"data: " + json.dumps({**head, "object": obj, "choices": choices, **extra}).encode() + b"\n\n"

        def piece(text: str, reason: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": reason}
            return {"index": 0, "text": text, "finish_reason": reason}

        async def events():
            for text in UPSTREAM_TEXT:
                yield event([piece(text, None)])
            yield event([piece("", "stop")])
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event([], usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def gateway_config(tiny_dir: Path, upstream_url: str, dead_port: int, telemetry: str) -> str:
    tiny = (f"{{model: '{tiny_dir}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, "
            "max_num_seqs: 8, max_num_batched_tokens: 256}")
    return f"""
server: {{reload_poll_s: 0}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(APP_KEY)}}}
    - {{tenant: audited, sha256: {hash_api_key(AUDITED_KEY)}}}
    - {{tenant: limited, sha256: {hash_api_key(LIMITED_KEY)}}}
tenants:
  app: {{class: interactive}}
  audited: {{class: audited, record_content: true}}
  limited: {{class: trial}}
telemetry: {telemetry}
limits:
  tenants: {{by_id: {{limited: {{rpm: 1}}}}}}
  retry: {{min_retries_per_window: 1000}}      # every fallback in these tests is allowed
  breakers: {{by_name: {{flaky: {{min_calls: 2, failure_rate: 0.5, open_s: 600}}}}}}
tiers:
  tiny: {tiny}
  broken: {{model: '{tiny_dir}/missing', dtype: float32}}
  dead: {{kind: upstream, base_url: "http://127.0.0.1:{dead_port}/v1", model: nobody, connect_timeout_s: 1}}
  flaky: {{kind: upstream, base_url: "http://127.0.0.1:{dead_port}/v1", model: nobody, connect_timeout_s: 1}}
  up: {{kind: upstream, base_url: "{upstream_url}", model: upstream-model}}
models:
  tiny: {{chain: [broken, tiny]}}
  remote: {{chain: [dead, up]}}
  direct: {{chain: [up]}}
  flaky-first: {{chain: [flaky, up]}}
"""


class TracedGateway:
    """RunningGateway with an in-memory span exporter (or, traced=False, no exporter at all)."""

    def __init__(self, tmp_dir: Path, upstream: RecordingUpstream, traced: bool = True,
                 telemetry_yaml: str = "{record_content: true}"):
        from tests.tiny_models import write_tiny_checkpoint

        tiny = tmp_dir / "tiny"
        if not tiny.exists():
            write_tiny_checkpoint(tiny)
        path = tmp_dir / ("traced.yaml" if traced else "untraced.yaml")
        path.write_text(gateway_config(tiny, upstream.base_url, free_port(), telemetry_yaml))
        self.exporter = InMemorySpanExporter() if traced else None
        self.telemetry = build_telemetry(load_config(path).telemetry, environ={}, exporter=self.exporter)
        self.gw = RunningGateway(path, wait_ready=False, telemetry=self.telemetry)
        self.gw.wait_loaded()
        self.base = self.gw.base

    def spans_of(self, trace_id: int, *, count: int | None = None, timeout_s: float = 10.0) -> list:
        """The finished spans of one trace, once its server span (and `count` spans) arrived."""
        deadline = time.time() + timeout_s
        while True:
            self.telemetry.tracing.force_flush()
            spans = [s for s in self.exporter.get_finished_spans() if s.context.trace_id == trace_id]
            done = any(s.kind.name == "SERVER" for s in spans) and (count is None or len(spans) >= count)
            if done or time.time() > deadline:
                return spans
            time.sleep(0.05)

    def stop(self) -> None:
        self.gw.stop()


def client_traceparent() -> tuple[int, int, str]:
    """A fresh sampled W3C traceparent: (trace id, parent span id, header value)."""
    trace_id, span_id = secrets.randbits(128) or 1, secrets.randbits(64) or 1
    return trace_id, span_id, f"00-{trace_id:032x}-{span_id:016x}-01"
