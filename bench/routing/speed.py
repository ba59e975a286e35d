"""Each tier's throughput and latency, measured with the project's batching engine in the same
run as the quality scores: prefill and decode tokens/s at batch N (the cost model's input), and
one request at a time the TTFT, TPOT and time to the K-th token that a cascade's hold-back adds.

The machine is shared, so each rate is also given per CPU-second actually received (process
CPU time, all threads), scaled to the threads the engine runs: what the tier does with the
cores it is given, whoever else is running. The runner alternates the tiers and keeps each
one's best round, so both are measured under the same conditions.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields

import torch

from engines.engine_config import EngineConfig
from engines.kv_cache import KVPool
from engines.llm_engine import LLMEngine
from engines.sampling_params import SamplingParams


@dataclass(frozen=True)
class BatchSpeed:
    batch: int
    prefill_tokens_per_s: float            # wall clock
    decode_tokens_per_s: float
    # tokens * threads / process CPU-seconds: the rate with every thread on a core of its own
    prefill_tokens_per_s_full_cpu: float
    decode_tokens_per_s_full_cpu: float
    # process CPU time / (wall time * threads): near 1 on an idle machine
    prefill_cpu_utilisation: float
    decode_cpu_utilisation: float


def best_round(rounds: list[BatchSpeed]) -> BatchSpeed:
    """Each figure's best over rounds (a shared machine only ever slows a round down)."""
    return BatchSpeed(**{f.name: max(getattr(r, f.name) for r in rounds) for f in fields(BatchSpeed)})


@dataclass(frozen=True)
class RequestTiming:
    prompt_tokens: int
    ttft_ms: float
    tpot_ms: float
    time_to_k_ms: float     # until the K-th token: when a cascade that holds K tokens can first answer


def _engine(loaded, prompts: list[list[int]], new_tokens: int, batch: int) -> LLMEngine:
    """An engine with KV room for `batch` of the longest prompts at once, plus a block each: a
    second run over the same prompts shares the first run's full prompt blocks (prefix cache)
    and only recomputes each prompt's partial last block."""
    block = 16
    blocks = batch * (math.ceil((max(len(p) for p in prompts) + new_tokens + 1) / block) + 1) + 8
    per_block = KVPool.bytes_per_block(loaded.config, block, loaded.dtype)
    return LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=blocks * per_block, block_size=block,
                                          max_num_seqs=max(batch, 1), max_num_batched_tokens=max(2048, batch)))


def _greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)


def measure_batch(loaded, prompts: list[list[int]], decode_tokens: int) -> BatchSpeed:
    """Prefill: every prompt with max_tokens=1 on a cold cache. Decode: the same prompts again
    (their prompts now prefix-cache hits, so the prefill is nearly free), timed from the step
    after which every sequence has its first token, so only decode steps are counted."""
    batch = len(prompts)
    threads = torch.get_num_threads()
    engine = _engine(loaded, prompts, decode_tokens + 1, batch)
    engine.generate([prompts[0][:8]], _greedy(2))                       # warm-up (kernels, allocator)
    engine.block_manager.reset_prefix_cache()
    started, cpu_started = time.perf_counter(), time.process_time()
    engine.generate(prompts, _greedy(1))
    prefill_s, prefill_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    for i, prompt in enumerate(prompts):
        engine.add_request(f"decode-{i}", prompt, _greedy(decode_tokens + 1))
    have_first, decoded, decode_started = set(), 0, None
    while engine.has_unfinished():
        outputs = engine.step()
        if decode_started is not None:
            decoded += sum(len(o.token_ids) for o in outputs)
        have_first.update(o.request_id for o in outputs if o.token_ids)
        if decode_started is None and len(have_first) == batch:
            decode_started, cpu_started = time.perf_counter(), time.process_time()
    decode_s, decode_cpu = time.perf_counter() - decode_started, time.process_time() - cpu_started
    prompt_tokens = sum(len(p) for p in prompts)
    return BatchSpeed(batch, prompt_tokens / prefill_s, decoded / decode_s,
                      prompt_tokens * threads / prefill_cpu, decoded * threads / decode_cpu,
                      prefill_cpu / (prefill_s * threads), decode_cpu / (decode_s * threads))


class SingleStreamTimer:
    """Times one request at a time on a cold prefix cache, each token's arrival at its step."""

    def __init__(self, loaded, prompts: list[list[int]], new_tokens: int, k: int):
        if not 1 <= k <= new_tokens or new_tokens < 2:
            raise ValueError("need 1 <= k <= new_tokens and new_tokens >= 2")
        self.new_tokens, self.k = new_tokens, k
        self.engine = _engine(loaded, prompts, new_tokens, 1)
        self.engine.generate([prompts[0][:8]], _greedy(2))
        self._count = 0

    def time(self, prompt: list[int]) -> RequestTiming:
        engine = self.engine
        engine.block_manager.reset_prefix_cache()
        self._count += 1
        started = time.perf_counter()
        engine.add_request(f"latency-{self._count}", prompt, _greedy(self.new_tokens))
        arrivals: list[float] = []
        while engine.has_unfinished():
            outputs = engine.step()
            now = time.perf_counter()
            arrivals.extend(now for o in outputs for _ in o.token_ids)
        return RequestTiming(len(prompt), (arrivals[0] - started) * 1000,
                             (arrivals[-1] - arrivals[0]) * 1000 / (len(arrivals) - 1),
                             (arrivals[self.k - 1] - started) * 1000)
