"""`tiergate eval ppl`: perplexity, greedy agreement with fp32, weight bytes, KV bytes per
token and decode speed (batch 1, 8, 32) of each weight and KV-cache variant, on the fixed
held-out ShareGPT slice, in one command."""

from __future__ import annotations

import math
import time

import torch
from rich.console import Console
from rich.table import Table

from engines.attention.contiguous import ContiguousAttention
from engines.attention.paged import build_step_metadata
from engines.engine_config import EngineConfig
from engines.errors import ModelLoadError
from engines.llm_engine import LLMEngine
from engines.loaded_model import gguf_source_path, load_model
from engines.quantization import weight_bytes
from engines.sampling_params import SamplingParams
from engines.sequence import Sequence
from bench.common import machine_info, write_json
from bench.datasets.sharegpt import calibration_source
from bench.eval.heldout import HELDOUT_START, VALIDATION_START, heldout_sequences
from engines.quantization.build import quantize_loaded
from engines.quantization.gguf_int4 import install_gguf_int4

DEFAULT_VARIANTS = ("fp32", "bf16", "int8", "w8a8", "int4-rtn-g64", "int4-rtn-g128", "int4-awq-g64", "int4-awq-g128", "fp8",
                    "kv-bf16", "kv-int8", "kv-fp8", "kv-int4")
# Selectable with --quant, left out of the default run: GPTQ (7 more minutes, not better than AWQ on
# SmolLM2), and for a GGUF with Q4_K tensors (--model qwen) INT4 as loaded: the file's own Q4_K
# nibbles, the other linears int8 (int4-gguf) or INT4 RTN g32 (int4-gguf-rtn).
ALL_VARIANTS = (*DEFAULT_VARIANTS, "int4-gptq-g64", "int4-gptq-g128", "int4-gguf", "int4-gguf-rtn", "w4a8-gguf")
# KV variants: bf16 weights, logits computed through the paged KV pool of that dtype.
KV_VARIANTS = {"kv-bf16": None, "kv-int8": "int8", "kv-fp8": "fp8", "kv-int4": "int4"}
DECODE_BATCHES = (1, 8, 32)


def _load_variant(name: str, model: str = "default"):
    if name in ("fp32", "bf16") or name in KV_VARIANTS:
        return load_model(model, "float32" if name == "fp32" else "bfloat16")
    loaded = load_model(model, "bfloat16")
    if name.startswith("int4-gguf"):
        gguf_path = gguf_source_path(model)
        if gguf_path is None:
            raise ModelLoadError(f"{name} needs a GGUF model, not {model!r}")
        linears = install_gguf_int4(loaded.model, gguf_path, "int4-rtn" if name == "int4-gguf-rtn" else "int8")
        if not linears["as_stored"]:
            raise ModelLoadError(f"{model!r} has no Q4_K or Q4_1 decoder tensors: {name} would not load any INT4 "
                                 "as stored")
        return loaded
    method, _, group = name.rpartition("-g") if name.startswith("int4") else (name, "", "128")
    quantize_loaded(loaded, method, int(group), calibration_source())
    return loaded


def _logits(model, ids: list[int]) -> torch.Tensor:
    attn = ContiguousAttention(model.config, len(ids), model.dtype)
    attn.begin_step(0, len(ids))
    hidden = model(torch.tensor(ids), torch.arange(len(ids)), attn)
    return model.compute_logits(hidden)


def _paged_logits(engine: LLMEngine, ids: list[int]) -> torch.Tensor:
    """All positions' logits of one prefill through the engine's paged pool (so K/V are
    stored, and read back, in the pool's dtype)."""
    seq = Sequence("eval", list(ids), SamplingParams())
    if not engine.block_manager.try_admit(seq):
        raise RuntimeError("KV pool too small for an evaluation sequence")
    try:
        attn = engine.runner.attn
        attn.prepare(build_step_metadata(engine.pool.block_size, [(seq.block_table, 0, len(ids))]))
        model = engine.loaded.model
        return model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids)), attn))
    finally:
        engine.block_manager.free(seq)


def _decode_speed(loaded, prompts: list[list[int]], batch: int, new_tokens: int = 64, runs: int = 2,
                  kv: str | None = None) -> float:
    """Output tokens/s of the batching engine; the best of `runs` (the machine is shared)."""
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=256 * 2**20, max_num_seqs=batch, kv_cache_dtype=kv))
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    batch_prompts = [p[:128] for p in (prompts * batch)[:batch]]
    engine.generate(batch_prompts[:1], SamplingParams(max_tokens=2, temperature=0))   # warm-up
    best = 0.0
    for _ in range(runs):
        engine.block_manager.reset_prefix_cache()
        started = time.perf_counter()
        engine.generate(batch_prompts, params)
        best = max(best, batch * new_tokens / (time.perf_counter() - started))
    return best


def _evaluate(name: str, loaded, sequences: list[list[int]], ref_top1: list[torch.Tensor], speed: bool = True) -> dict:
    kv_engine = None
    if name in KV_VARIANTS:
        kv_engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=64 * 2**20, enable_prefix_caching=False,
                                                   kv_cache_dtype=KV_VARIANTS[name]))
    nll, count, agree = 0.0, 0, 0
    for ids, top1 in zip(sequences, ref_top1):
        logits = (_paged_logits(kv_engine, ids) if kv_engine else _logits(loaded.model, ids))[:-1]
        targets = torch.tensor(ids[1:])
        nll += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
        agree += int((logits.argmax(-1) == top1).sum())
    entry = {
        "perplexity": math.exp(nll / count),
        "top1_agreement_with_fp32": agree / count,
        "weight_bytes": weight_bytes(loaded.model),
        "decode_tokens_per_s": {f"batch_{b}": _decode_speed(loaded, sequences, b, kv=KV_VARIANTS.get(name))
                                if speed else None for b in DECODE_BATCHES},
    }
    if kv_engine:
        entry["kv_bytes_per_token"] = kv_engine.pool.nbytes // kv_engine.pool.capacity_tokens
    return entry


def run_ppl_eval(json_out: str, variants: list[str], n_sequences: int, validation: bool = False,
                 speed: bool = True, model: str = "default") -> int:
    """validation: the tuning slice (records 8,000+) instead of the held-out one; speed: measure
    decode tokens/s (most of the run time; null when off); model: a bundled model's name
    ("default" SmolLM2, "qwen"), a .gguf file or an HF directory."""
    console = Console(stderr=True)
    started = time.perf_counter()
    reference = load_model(model, "float32")
    sequences = heldout_sequences(reference.tokenizer, reference.chat_template, n=n_sequences,
                                  start=VALIDATION_START if validation else HELDOUT_START)
    ref_top1 = [_logits(reference.model, ids)[:-1].argmax(-1) for ids in sequences]
    report = {"benchmark": "ppl", "machine": machine_info(), "model": model,
              "workload": {"sequences": len(sequences), "tokens": sum(len(s) for s in sequences),
                           "source": f"ShareGPT V3 {'validation' if validation else 'held-out'} records (index >= "
                                     f"{VALIDATION_START if validation else HELDOUT_START}), first exchange, "
                                     "chat-templated",
                           "decode": "batching engine, 64 new tokens per sequence, prompts cut to 128 tokens, "
                                     "best of 2 runs"},
              "variants": {}}
    for i, name in enumerate(variants, 1):
        t0 = time.perf_counter()
        console.log(f"[{i}/{len(variants)}] {name}: loading")
        loaded = reference if name == "fp32" else _load_variant(name, model)
        console.log(f"[{i}/{len(variants)}] {name}: perplexity and decode speed")
        report["variants"][name] = entry = _evaluate(name, loaded, sequences, ref_top1, speed)
        console.log(f"[{i}/{len(variants)}] {name}: ppl {entry['perplexity']:.3f}, "
                    f"{_speed(entry['decode_tokens_per_s']['batch_1'])} tok/s at batch 1 "
                    f"({time.perf_counter() - t0:.0f} s; {time.perf_counter() - started:.0f} s in all)")
    _add_ratios(report["variants"])
    report["wall_s"] = time.perf_counter() - started
    write_json(json_out, report)
    console.print(_table(report, len(sequences)))
    return 0


def _add_ratios(variants: dict) -> None:
    """Perplexity vs fp32; tokens held per KV byte vs bf16 KV; batch-1 speed vs bf16 weights."""
    base = variants.get("fp32", {}).get("perplexity")
    kv_base = variants.get("kv-bf16", {}).get("kv_bytes_per_token")
    speed_base = variants.get("bf16", {}).get("decode_tokens_per_s", {}).get("batch_1")
    for entry in variants.values():
        if base:
            entry["ppl_increase_vs_fp32"] = entry["perplexity"] / base - 1
        if kv_base and "kv_bytes_per_token" in entry:
            entry["kv_tokens_vs_bf16"] = kv_base / entry["kv_bytes_per_token"]
        if speed_base and entry["decode_tokens_per_s"]["batch_1"]:
            entry["batch_1_speed_vs_bf16"] = entry["decode_tokens_per_s"]["batch_1"] / speed_base


def _table(report: dict, n: int) -> Table:
    table = Table(title=f"{report['model']}: held-out perplexity ({n} conversations)")
    for col in ("variant", "ppl", "vs fp32", "top-1 agree", "weights MB", "KV B/token",
                *(f"tok/s b{b}" for b in DECODE_BATCHES)):
        table.add_column(col)
    for name, e in report["variants"].items():
        speeds = e["decode_tokens_per_s"]
        table.add_row(name, f"{e['perplexity']:.3f}", f"{e.get('ppl_increase_vs_fp32', 0) * 100:+.2f} %",
                      f"{e['top1_agreement_with_fp32'] * 100:.1f} %", f"{e['weight_bytes'] / 1e6:.0f}",
                      str(e.get("kv_bytes_per_token", "")), *(_speed(speeds[f"batch_{b}"]) for b in DECODE_BATCHES))
    return table


def _speed(tokens_per_s: float | None) -> str:
    return "-" if tokens_per_s is None else f"{tokens_per_s:.1f}"
