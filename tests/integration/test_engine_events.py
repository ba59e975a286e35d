"""Per-request engine facts (admission, preemptions, speculative acceptance) on the real model,
carried on every RequestOutput and turned into events on a real tier span (in-memory exporter):
each request is scheduled once, every preemption the engine counted shows up on the request it
hit, and the acceptance counts add up to the engine's own counters."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.sampling_params import SamplingParams
from engines.spec.config import SpeculativeConfig
from gateway.telemetry.config import TelemetrySettings
from gateway.telemetry.tracing import build_tracing
from gateway.tiers.engine_events import EngineEvents

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Repeat exactly: the cat sat on the mat, the cat sat on the mat.",
             "Name a color.", "Who wrote Hamlet?",
             "Fix the typo and repeat the sentence: 'The quikc brown fox jumps over the lazy dog.'"]
PER_BLOCK_FP32 = 2 * 30 * 16 * 3 * 64 * 4      # K+V bytes of one 16-token block, all layers


def _run_traced(engine: LLMEngine, prompts, params):
    """Step the engine to the end; every request's outputs feed its own tier span."""
    exporter = InMemorySpanExporter()
    tracing = build_tracing(TelemetrySettings(), exporter=exporter)
    calls, observers, outputs = {}, {}, {}
    started = time.time_ns()
    for i, prompt in enumerate(prompts):
        rt = tracing.start_request("POST", "/v1/chat/completions", {})
        tier_span = rt.tier_call(tier="t", request_model=f"r{i}", embedded=True, stream=True)
        calls[f"r{i}"] = (rt, tier_span)
        observers[f"r{i}"] = EngineEvents(tier_span)
        outputs[f"r{i}"] = []
        engine.add_request(f"r{i}", prompt, params)
    while engine.has_unfinished():
        for out in engine.step():
            observers[out.request_id].observe(out)
            outputs[out.request_id].append(out)
    for rt, tier_span in calls.values():
        tier_span.end()
        rt.end(200)
    assert tracing.force_flush()
    finished = {s.name: s for s in exporter.get_finished_spans()}
    return {rid: finished[f"chat {rid}"] for rid in calls}, outputs, started


def _prompts(loaded):
    return [loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": q}])) for q in QUESTIONS]


def _names(span) -> list[str]:
    return [e.name.removeprefix("tiergate.engine.") for e in span.events]


def test_preemptions_show_up_on_the_requests_they_hit(real_fp32):
    prompts = _prompts(real_fp32)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    blocks = sum(-(-len(p) // 16) for p in prompts) + 2       # every prompt fits, their answers do not
    engine = LLMEngine(real_fp32, EngineConfig(kv_cache_memory_bytes=PER_BLOCK_FP32 * blocks, headroom_fraction=0.0,
                                               max_num_batched_tokens=256, max_num_seqs=32))
    spans, outputs, started = _run_traced(engine, prompts, params)
    assert engine.stats.preemptions > 0
    seen = 0
    for rid, span in spans.items():
        outs = outputs[rid]
        counts = [o.num_preemptions for o in outs]
        assert counts == sorted(counts)                        # cumulative, never going back
        assert all(o.scheduled_at == outs[0].scheduled_at is not None for o in outs)   # the first admission
        names = _names(span)
        assert names.count("scheduled") == 1 and names[0] == "scheduled"
        assert names.count("preempted") == counts[-1]
        scheduled = span.events[0].timestamp
        assert started <= scheduled <= span.end_time
        assert all(scheduled <= e.timestamp <= span.end_time for e in span.events if e.name.endswith("preempted"))
        assert "speculative" not in names                       # no speculation configured
        seen += counts[-1]
    assert seen == engine.stats.preemptions


def test_speculative_acceptance_adds_up_to_the_engine_counters(real_fp32):
    prompts = _prompts(real_fp32)
    spec = SpeculativeConfig(method="ngram", num_tokens=4, max_batch=32)
    engine = LLMEngine(real_fp32, EngineConfig(kv_cache_memory_bytes=64 * 2**20, max_num_batched_tokens=256,
                                               max_num_seqs=32, speculative=spec))
    spans, outputs, _ = _run_traced(engine, prompts, SamplingParams(max_tokens=32, temperature=0))
    stats = engine.stats.spec["ngram"]
    assert stats.proposed_tokens > 0
    proposed = accepted = 0
    for rid, span in spans.items():
        last = outputs[rid][-1]
        assert last.finished and 0 <= last.spec_accepted <= last.spec_proposed
        events = [e for e in span.events if e.name == "tiergate.engine.speculative"]
        if last.spec_proposed:
            (event,) = events
            assert event.attributes["tiergate.spec.proposed_tokens"] == last.spec_proposed
            assert event.attributes["tiergate.spec.accepted_tokens"] == last.spec_accepted
        else:
            assert events == []
        proposed += last.spec_proposed
        accepted += last.spec_accepted
    assert (proposed, accepted) == (stats.proposed_tokens, stats.accepted_tokens)
