"""`bench offline --engine-processes N`: the engine alone (no HTTP) in N worker processes of
`--threads` threads each, the way a tier with `engine_processes: N` runs it
(engines/engine_process.py): every request submitted at t=0, spread over the workers by the
same rule, outputs timed as they arrive in this process."""

from __future__ import annotations

import asyncio
import functools
import time

from engines.engine_config import EngineConfig
from engines.engine_process import ProcessEngine
from engines.grammar import GrammarCompiler
from engines.llm_engine import LLMEngine
from engines.loaded_model import LoadedModel, load_model
from engines.sampling_params import SamplingParams
from bench.datasets.sharegpt import BenchRequest


def build_bench_engine(source: str, dtype: str, config: EngineConfig, quantization: str | None = None,
                       dense_prefill: str = "auto") -> LLMEngine:
    """A worker's engine (module level: the worker process unpickles it by name)."""
    loaded = load_model(source, dtype)
    if quantization:
        quantize_in_process(loaded, quantization, dense_prefill)
    return LLMEngine(loaded, config)


def quantize_in_process(loaded: LoadedModel, method: str, dense_prefill: str = "auto") -> None:
    """Quantize as a tier's artifact does, then give block-quantized weights the dense prefill copies
    a tier with that `dense_prefill` setting would get ("auto" or "off")."""
    from engines.loaded_model import dense_prefill_rows
    from engines.quantization.build import quantize_loaded
    from engines.quantization.methods import effective_group_size

    quantize_loaded(loaded, method, effective_group_size(method, 64))
    if dense_prefill == "auto" and loaded.device.type == "cpu":
        loaded.dense_prefill_rows = dense_prefill_rows(loaded.model, loaded.dtype, "auto")


async def _run(engine: ProcessEngine, requests: list[BenchRequest], warmup_ids: list[int]) -> dict:
    from bench.engine.offline import summarise_run

    warm = SamplingParams(max_tokens=2, temperature=0)

    async def drain(request_id: str, ids: list[int], params: SamplingParams, on_output=None) -> None:
        async for out in engine.generate(request_id, ids, params):
            if on_output is not None:
                on_output(out)

    # One warm-up request per worker, at once (so that each goes to a different worker).
    await asyncio.gather(*(drain(f"warmup-{i}", warmup_ids, warm) for i in range(engine.workers)))
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    counts: dict[str, int] = {}

    def record(out) -> None:
        now = time.perf_counter()
        first.setdefault(out.request_id, now)
        last[out.request_id] = now
        counts[out.request_id] = out.completion_tokens

    started = time.perf_counter()
    await asyncio.gather(*(drain(r.request_id, r.prompt_ids,
                                 SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True), record)
                           for r in requests))
    out = summarise_run(requests, started, time.perf_counter() - started, first, last, counts)
    out["engine_stats"] = engine.stats.as_dict()
    return out


def run_in_engine_processes(loaded: LoadedModel, requests: list[BenchRequest], dtype: str, config: EngineConfig,
                            processes: int, threads: int | None, quantization: str | None = None,
                            dense_prefill: str = "auto") -> dict:
    build = functools.partial(build_bench_engine, str(loaded.path), dtype, config, quantization, dense_prefill)
    engine = ProcessEngine(build, GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size),
                           tokenizer=loaded.tokenizer, workers=processes, threads=threads)
    try:
        # A prompt no request shares: the warm-up leaves nothing in the prefix caches to hit.
        warmup_ids = [loaded.tokenizer.eos_token_id_or(0)] * 8
        return asyncio.run(_run(engine, requests, warmup_ids))
    finally:
        engine.shutdown()
