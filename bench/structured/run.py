"""`tiergate bench structured`: what grammar-constrained decoding costs the engine.

Throughput: the same `batch` prompts submitted at once to one engine, plain and then constrained
by a JSON schema (every request; a schema whose answers outrun the output cap, so both sides
emit exactly `max_tokens` tokens per request and only the grammar differs), temperature 1 with a
seed per request, EOS ignored on the plain side. The two sides alternate for `rounds` rounds and
each reports its median round; `constrained_vs_plain_throughput` is their ratio (wall clock), and
`constrained_vs_plain_cpu_throughput` the ratio of their median tokens per CPU second. The time the
sampler spends building and applying masks is reported beside it.

Compile times: `compile_schemas` distinct schemas (renamed copies of bench/structured/schemas.py)
compiled fresh by a new compiler (its tokenizer built first, not counted), then once more each
from the cache (a copy of the compiled matcher per request).
"""

from __future__ import annotations

import statistics
import time

from rich.console import Console

from bench.common import machine_info, percentiles, write_json
from bench.structured.schemas import LONG_LIST, variants
from engines.engine_config import EngineConfig
from engines.grammar import GrammarCompiler, GrammarSpec
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams

_TOPICS = ["fruit", "tools", "animals", "cities", "rivers", "planets", "colours", "metals", "birds", "trees",
           "cheeses", "languages", "instruments", "sports", "dances", "stones"]


def _prompts(loaded, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        topic = _TOPICS[i % len(_TOPICS)]
        messages = [{"role": "user", "content": f"List {topic} (set {i}) as JSON items with a name, a count and a "
                                                f"kind."}]
        out.append(loaded.tokenizer.encode(loaded.chat_template.render(messages)))
    return out


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, grammar: GrammarSpec | None,
         seed: int) -> dict:
    mask_s = [0.0]
    constrain = engine.sampler.constrain

    def timed(logits, seqs):
        started = time.perf_counter()
        out = constrain(logits, seqs)
        mask_s[0] += time.perf_counter() - started
        return out

    engine.sampler.constrain = timed
    params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed + i, ignore_eos=True, grammar=grammar)
              for i in range(len(prompts))]
    steps = engine.stats.steps
    started, cpu_started = time.perf_counter(), time.process_time()
    outs = engine.generate(prompts, params)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    engine.sampler.constrain = constrain
    tokens = sum(len(o) for o in outs)
    if tokens != max_tokens * len(prompts):
        raise RuntimeError(f"expected {max_tokens * len(prompts)} output tokens, got {tokens}: "
                           "the schema's answers must outrun --max-tokens")
    n_steps = engine.stats.steps - steps
    return {"elapsed_s": elapsed, "output_tokens": tokens, "output_tokens_per_s": tokens / elapsed,
            "cpu_s": cpu, "output_tokens_per_cpu_s": tokens / cpu,
            "steps": n_steps, "mask_ms_per_step": mask_s[0] * 1e3 / max(1, n_steps)}


def _median_run(runs: list[dict]) -> dict:
    best = sorted(runs, key=lambda r: r["output_tokens_per_s"])[len(runs) // 2]
    return {**best, "rounds_tokens_per_s": [round(r["output_tokens_per_s"], 2) for r in runs]}


def _compile_times(loaded, n: int) -> dict:
    compiler = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
    started = time.perf_counter()
    compiler.llg_tokenizer                                  # built once per engine: not a compile
    tokenizer_s = time.perf_counter() - started
    specs = [GrammarSpec.json_schema(s) for s in variants(n)]
    fresh, cached = [], []
    for spec in specs:
        started = time.perf_counter()
        compiler.new_state(spec)
        fresh.append((time.perf_counter() - started) * 1e3)
    for spec in specs:
        started = time.perf_counter()
        compiler.new_state(spec)
        cached.append((time.perf_counter() - started) * 1e3)
    return {"schemas": n, "tokenizer_build_s": round(tokenizer_s, 3),
            "compile_ms": percentiles(fresh), "cache_hit_ms": percentiles(cached)}


def run_structured_bench(json_out: str, model: str = "default", dtype: str = "float32", batch: int = 32,
                         max_tokens: int = 128, rounds: int = 3, compile_schemas: int = 100) -> int:
    console = Console(stderr=True)
    loaded = load_model(model, dtype)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=256 * 2**20, max_num_seqs=batch,
                                            max_num_batched_tokens=max(2048, batch), max_model_len=1024,
                                            enable_prefix_caching=False))
    prompts = _prompts(loaded, batch)
    grammar = GrammarSpec.json_schema(LONG_LIST)
    engine.grammars.compile(grammar)                         # the compile is measured below, not here
    _run(engine, prompts[:2], 4, None, 0)                    # warm-up: kernels, allocator
    _run(engine, prompts[:2], 4, grammar, 0)
    plain, constrained = [], []
    for r in range(rounds):
        plain.append(_run(engine, prompts, max_tokens, None, 1000 * r))
        constrained.append(_run(engine, prompts, max_tokens, grammar, 1000 * r))
        console.log(f"round {r + 1}/{rounds}: plain {plain[-1]['output_tokens_per_s']:.1f} tok/s, "
                    f"constrained {constrained[-1]['output_tokens_per_s']:.1f} tok/s")
    plain_m, constrained_m = _median_run(plain), _median_run(constrained)
    compile_stats = _compile_times(loaded, compile_schemas)
    ratio = constrained_m["output_tokens_per_s"] / plain_m["output_tokens_per_s"]
    cpu_ratio = (statistics.median(r["output_tokens_per_cpu_s"] for r in constrained)
                 / statistics.median(r["output_tokens_per_cpu_s"] for r in plain))
    report = {
        "machine": machine_info(),
        "workload": {"model": model, "dtype": dtype, "batch": batch, "max_tokens": max_tokens, "rounds": rounds,
                     "temperature": 1.0, "schema": "LONG_LIST (bench/structured/schemas.py)",
                     "grammar_engine": "llguidance"},
        "plain": plain_m,
        "constrained": constrained_m,
        "constrained_vs_plain_throughput": round(ratio, 4),
        # The same ratio per second of this process's CPU time (all its threads, llguidance's
        # included): steadier than wall time where other work shares the cores.
        "constrained_vs_plain_cpu_throughput": round(cpu_ratio, 4),
        "compile": compile_stats,
        "grammar_compile_ms": compile_stats["compile_ms"],
    }
    write_json(json_out, report)
    console.log(f"constrained / plain = {ratio:.3f}; compile p50 {compile_stats['compile_ms']['p50']:.2f} ms, "
                f"p99 {compile_stats['compile_ms']['p99']:.2f} ms; wrote {json_out}")
    return 0
