"""The small tier's first greedy tokens of every prompt, as the gateway's cascade sees them:
each token's logprob and the entropy of the model's distribution it came from, from the
project's batching engine (the embedded tier's own path), computed once and swept offline."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from engines.engine_config import EngineConfig
from engines.kv_cache import KVPool
from engines.llm_engine import LLMEngine
from engines.sampling_params import SamplingParams


@dataclass(frozen=True)
class Probe:
    logprobs: tuple[float, ...]      # shorter than asked when the model ended its answer first
    entropies: tuple[float, ...]     # nats


def probe_first_tokens(loaded, prompts: list[list[int]], tokens: int, batch: int = 32,
                       on_done: Callable[[int], None] | None = None) -> list[Probe]:
    """Greedy decode of up to `tokens` tokens per prompt, `batch` sequences at a time (in fp32
    batching leaves greedy tokens and their logprobs unchanged). `on_done(n)`: n more finished."""
    block = 16
    longest = max(len(p) for p in prompts) + tokens
    blocks = batch * (math.ceil(longest / block) + 1) + 8
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=blocks * KVPool.bytes_per_block(
        loaded.config, block, loaded.dtype), block_size=block, max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch), enable_prefix_caching=False))
    params = SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=True, entropy=True)
    logprobs: dict[str, list[float]] = {}
    entropies: dict[str, list[float]] = {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        # Admit up to the batch size, so the pool never has to preempt.
        while pending and engine.num_requests < batch:
            index, prompt = pending.pop(0)
            engine.add_request(str(index), prompt, params)
            logprobs[str(index)], entropies[str(index)] = [], []
        finished = 0
        for out in engine.step():
            for lp in out.logprobs or ():
                logprobs[out.request_id].append(lp.logprob)
                entropies[out.request_id].append(lp.entropy)
            finished += out.finished
        if finished and on_done:
            on_done(finished)
    return [Probe(tuple(logprobs[str(i)]), tuple(entropies[str(i)])) for i in range(len(prompts))]
