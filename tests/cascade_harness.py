"""One gateway for the cascade and alias tests: two tiny random tiers that answer differently
(`small`, `large`: different seeds; their word-level vocabularies cannot spell JSON, so they
declare no capabilities), the steerable fake upstream as a third (`up`, which has every
capability), and aliases that force each cascade outcome deterministically (a threshold
no answer reaches, or one every answer reaches). In-process, so tests can look at the engines'
KV blocks, the budget store and the spans (in memory) while talking to it over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry.setup import build_telemetry
from policies.config import load_config
from policies.gain_model import GainModel, PrefillWeights
from tests.gateway_harness import InstantUpstream, RunningGateway, shared

SCOPE = "t:default"          # the anonymous tenant's budget scope (auth off)
K = 8                        # tokens each cascade judges
# The gain model of the predicted_gain aliases: text weights none, prefill weights GAIN_WEIGHT each
# over the tiny model's hidden state (64 values) at the last prompt token and GAIN_WEIGHT_BACK each
# over the one GAIN_ROW_BACK rows before it, so a prediction is
# GAIN_BIAS + GAIN_WEIGHT * sum(h[-1]) + GAIN_WEIGHT_BACK * sum(h[-1 - GAIN_ROW_BACK]).
GAIN_BIAS, GAIN_WEIGHT, GAIN_WEIGHT_BACK, GAIN_ROW_BACK, HIDDEN = 0.5, 0.01, -0.03, 3, 64
GAIN_KEEP, GAIN_ESCALATE = 100.0, -100.0     # thresholds no prediction reaches / every one exceeds

_TINY = ("{{model: '{path}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, block_size: 16, "
         "max_num_seqs: 8, max_num_batched_tokens: 256, capabilities: []}}")

CONFIG = """
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  small: {small}
  large: {large}
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
models:
  auto: {{chain: [small, large]}}
  plain-small: {{chain: [small], pinned: true}}
  plain-large: {{chain: [large], pinned: true}}
  with-up: {{chain: [small, up], pinned: true}}
  keep: {{chain: [small], cascade: {{to: large, tokens: {k}, threshold: -.inf}}}}
  escalate: {{chain: [small], cascade: {{to: large, tokens: {k}, threshold: 0}}}}
  keep-entropy: {{chain: [small], cascade: {{to: large, tokens: {k}, signal: mean_entropy, threshold: .inf}}}}
  escalate-entropy: {{chain: [small], cascade: {{to: large, tokens: {k}, signal: mean_entropy, threshold: 0}}}}
  up-first: {{chain: [up], cascade: {{to: large, tokens: {k}, threshold: 0}}}}
  keep-gain: {{chain: [small], cascade: {{to: large, signal: predicted_gain, threshold: {gain_keep}}}}}
  escalate-gain: {{chain: [small], cascade: {{to: large, signal: predicted_gain, threshold: {gain_escalate}}}}}
  up-gain: {{chain: [up], cascade: {{to: large, signal: predicted_gain, threshold: -100}}}}
classification:
  gain_model: {{file: gain.json}}
  rules:
    - {{name: code, profile: memory, when: {{code: true}}}}
routing:
  rules:
    - {{name: code, match: {{needs: [code], model: auto}}, chain: [large]}}
limits: {{tenants: {{by_id: {{default: {{tokens_per_day: 100000000}}}}}}}}
"""


class CascadeGateway:
    def __init__(self, tmp_dir: Path):
        from tests.tiny_models import write_tiny_checkpoint

        write_tiny_checkpoint(tmp_dir / "small", seed=0)
        write_tiny_checkpoint(tmp_dir / "large", seed=1)
        self.upstream = InstantUpstream()
        path = tmp_dir / "gateway.yaml"
        (tmp_dir / "gain.json").write_text(json.dumps(GainModel(
            GAIN_BIAS, {}, prefill=PrefillWeights("tiny", (GAIN_WEIGHT,) * HIDDEN + (GAIN_WEIGHT_BACK,) * HIDDEN,
                                                  (0, GAIN_ROW_BACK))).to_json()))
        path.write_text(CONFIG.format(small=_TINY.format(path=tmp_dir / "small"),
                                      large=_TINY.format(path=tmp_dir / "large"),
                                      upstream=self.upstream.base_url, k=K, gain_keep=GAIN_KEEP,
                                      gain_escalate=GAIN_ESCALATE))
        self.exporter = InMemorySpanExporter()
        self.telemetry = build_telemetry(load_config(path).telemetry, environ={}, exporter=self.exporter)
        self.gw = RunningGateway(path, telemetry=self.telemetry)
        self.base = self.gw.base

    def server_span(self, trace_id: int, timeout_s: float = 10.0):
        """The server span of one trace, once exported."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            self.telemetry.tracing.force_flush()
            for span in self.exporter.get_finished_spans():
                if span.context.trace_id == trace_id and span.kind.name == "SERVER":
                    return span
            time.sleep(0.05)
        raise AssertionError(f"no server span for trace {trace_id:032x}")

    def engine(self, tier: str):
        return self.gw.runtime.tiers[tier].engine.engine

    def used_tokens(self) -> int:
        """Tokens charged to the tenant's daily budget so far."""
        return self._on_loop(self.gw.runtime.limits.budgets.usage(SCOPE)).used_tokens_day

    def settled(self, timeout_s: float = 60) -> None:
        """Until no request is in flight and every engine request has ended (an abort is applied
        before the engine's next step); then nothing may be reserved or hold a KV block."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            busy = self.gw.runtime.limits.in_flight or any(
                self.engine(t).has_unfinished() for t in ("small", "large"))
            if not busy:
                break
            time.sleep(0.02)
        usage = self._on_loop(self.gw.runtime.limits.budgets.usage(SCOPE))
        assert (self.gw.runtime.limits.in_flight, usage.reserved_tokens_day) == (0, 0)
        for tier in ("small", "large"):
            assert self.engine(tier).block_manager.num_used_blocks == 0, f"{tier} holds KV blocks"

    def _on_loop(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.gw.server_loop()).result(timeout=30)

    def stop(self) -> None:
        self.gw.stop()
        self.upstream.stop()


@pytest.fixture(scope="module")
def cg(request, tmp_path_factory) -> CascadeGateway:
    return shared(request, "cascade-gateway", lambda: CascadeGateway(tmp_path_factory.mktemp("cascade")))


@pytest.fixture(scope="module")
def client(cg):
    return openai.OpenAI(base_url=f"{cg.base}/v1", api_key="unused", max_retries=0)
