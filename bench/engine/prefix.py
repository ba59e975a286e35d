"""`tiergate bench prefix`: time to first token with a shared ~2,000-token system prompt,
cold (prefix cache emptied before each request) against warm (the prompt cached by an
earlier request), on the same engine in one command."""

from __future__ import annotations

import statistics
import time

from rich.console import Console

from engines.engine_config import EngineConfig
from engines.llm_engine import LLMEngine
from engines.loaded_model import load_model
from engines.sampling_params import SamplingParams
from bench.common import machine_info, percentiles, write_json
from bench.datasets.sharegpt import iter_sharegpt_records

QUESTIONS = [
    "How do I reset my password?", "What are your opening hours?", "Can I change my delivery address?",
    "Do you ship to Canada?", "How long does a refund take?", "Is there a student discount?",
    "How do I cancel my subscription?", "Where can I find my invoice?",
]


def _system_prompt(tokenizer, target_tokens: int) -> str:
    """Real prose from ShareGPT answers, cut to about `target_tokens` tokens."""
    text = "You are the support assistant of an online shop. Use the following knowledge base.\n\n"
    for record in iter_sharegpt_records():
        for turn in record.get("conversations", []):
            if turn.get("from") == "gpt" and turn.get("value"):
                text += turn["value"] + "\n\n"
        if len(tokenizer.encode(text)) >= target_tokens:
            break
    ids = tokenizer.encode(text)[:target_tokens]
    return tokenizer.decode(ids)


def _ttft(engine: LLMEngine, rid: str, prompt_ids: list[int]) -> tuple[float, int]:
    started = time.perf_counter()
    engine.add_request(rid, prompt_ids, SamplingParams(max_tokens=1, temperature=0))
    while True:
        for out in engine.step():
            if out.request_id == rid and out.token_ids:
                ttft = time.perf_counter() - started
                while engine.has_unfinished():
                    engine.step()
                return ttft, out.cached_tokens


def run_prefix_bench(json_out: str, dtype: str, system_tokens: int, repeats: int) -> int:
    console = Console(stderr=True)
    loaded = load_model("default", dtype)
    system = _system_prompt(loaded.tokenizer, system_tokens)
    engine = LLMEngine(loaded, EngineConfig(kv_cache_memory_bytes=512 * 2**20, max_num_batched_tokens=4096))

    def prompt(q: str) -> list[int]:
        return loaded.tokenizer.encode(loaded.chat_template.render(
            [{"role": "system", "content": system}, {"role": "user", "content": q}]))

    questions = (QUESTIONS * (repeats // len(QUESTIONS) + 1))[:repeats]
    _ttft(engine, "warmup", prompt("Hello"))
    cold, warm, cached = [], [], []
    for i, q in enumerate(questions):
        console.log(f"question {i + 1}/{len(questions)}")
        engine.block_manager.reset_prefix_cache()
        t, _ = _ttft(engine, f"cold-{i}", prompt(q))
        cold.append(t * 1e3)
        # The cold request left the system prompt cached; a different question reuses it.
        t, hit = _ttft(engine, f"warm-{i}", prompt(q + " Please answer briefly."))
        warm.append(t * 1e3)
        cached.append(hit)
    prompt_len = len(prompt(questions[0]))
    report = {
        "benchmark": "prefix",
        "machine": machine_info(),
        "workload": {"dtype": dtype, "system_prompt_tokens": len(loaded.tokenizer.encode(system)),
                     "prompt_tokens": prompt_len, "requests_each": len(questions)},
        "cold": {"ttft_ms": percentiles(cold)},
        "warm": {"ttft_ms": percentiles(warm), "cached_tokens_p50": statistics.median(cached)},
        "ratio_warm_over_cold_p50": statistics.median(warm) / statistics.median(cold),
    }
    write_json(json_out, report)
    console.print(f"TTFT p50: cold {report['cold']['ttft_ms']['p50']:.1f} ms, warm "
                  f"{report['warm']['ttft_ms']['p50']:.1f} ms, warm/cold = "
                  f"{report['ratio_warm_over_cold_p50'] * 100:.1f} % ({statistics.median(cached)} cached tokens)")
    return 0
