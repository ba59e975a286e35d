"""`tiergate bench serve`: a load generator for any OpenAI-compatible server.

ShareGPT prompts (the first human turn of each conversation) are sent as streamed chat
completions, either with Poisson arrivals at a fixed request rate or with a fixed number
of requests in flight. Per request it records time to first token, time per output token
(the gaps between content chunks after the first) and end-to-end latency; the report has
their percentiles and the throughput, as JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.common import machine_info, percentiles, samples, write_json
from gateway.cli.usage_error import UsageError

REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ServeRequest:
    request_id: str
    question: str
    max_tokens: int


@dataclass
class ServeResult:
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    chunk_gaps_s: tuple[float, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str = ""
    served_by: str | None = None        # the gateway's x-tiergate-tier header, when the server sends it
    connection_dropped: bool = False    # the server closed the connection before any answer came


def load_serve_requests(n: int, max_prompt_tokens: int, max_tokens: int, seed: int) -> list[ServeRequest]:
    """ShareGPT first turns, sized with the bundled model's tokenizer (no weights are loaded)."""
    from engines.chat_template import ChatTemplate
    from engines.loaded_model import resolve_checkpoint_dir
    from engines.loaders.hf_checkpoint import open_hf_checkpoint
    from engines.tokenizer import TextTokenizer
    from bench.datasets.sharegpt import load_sharegpt_requests

    ckpt = open_hf_checkpoint(resolve_checkpoint_dir("default"))
    tok = TextTokenizer.from_file(ckpt.tokenizer_json, ckpt.tokenizer_config, ckpt.end_of_generation_ids)
    template = ChatTemplate(ckpt.tokenizer_config.get("chat_template"), tok.bos_token, tok.eos_token)
    # The template around an empty question is the least any prompt takes: below it, scanning the
    # dataset could only find nothing.
    overhead = len(tok.encode(template.render([{"role": "user", "content": ""}])))
    if overhead >= max_prompt_tokens:
        raise UsageError(f"no prompt of the workload fits --max-prompt-tokens {max_prompt_tokens} (the chat "
                         f"template alone takes {overhead} tokens)")
    picked = load_sharegpt_requests(tok, template, n, max_prompt_tokens, max_tokens, seed=seed)
    if not picked:
        raise UsageError(f"no prompt of the workload fits --max-prompt-tokens {max_prompt_tokens}")
    return [ServeRequest(r.request_id, r.question, r.output_len) for r in picked]


async def _one(session: aiohttp.ClientSession, url: str, model: str, req: ServeRequest,
               ignore_eos: bool) -> ServeResult:
    """One request; sent again once when the server closed the connection before answering
    (llama.cpp's server may, under load): that attempt never reached it."""
    result = await _attempt(session, url, model, req, ignore_eos)
    if result.connection_dropped:
        result = await _attempt(session, url, model, req, ignore_eos)
    return result


async def _attempt(session: aiohttp.ClientSession, url: str, model: str, req: ServeRequest,
                   ignore_eos: bool) -> ServeResult:
    body = {"model": model, "messages": [{"role": "user", "content": req.question}],
            "max_tokens": req.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True   # vLLM's extension; servers without it may reject the field
    started = time.perf_counter()
    first = last = None
    gaps: list[float] = []
    usage = None
    answered = False
    try:
        async with session.post(url, json=body) as resp:
            answered = True
            served_by = resp.headers.get("x-tiergate-tier")
            if resp.status != 200:
                text = (await resp.read()).decode(errors="replace")
                return ServeResult(False, error=f"HTTP {resp.status}: {text[:200]}")
            async for line in resp.content:      # one SSE line at a time
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if not any(c.get("delta", {}).get("content") for c in chunk.get("choices") or ()):
                    continue
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    except aiohttp.ClientConnectionError as exc:
        return ServeResult(False, error=f"{type(exc).__name__}: {exc}", connection_dropped=not answered)
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        return ServeResult(False, error=f"{type(exc).__name__}: {exc}")
    end = time.perf_counter()
    if first is None:
        return ServeResult(False, error="no content chunk in the stream")
    usage = usage or {}
    return ServeResult(True, first - started, end - started, tuple(gaps),
                       usage.get("prompt_tokens", 0), usage.get("completion_tokens", len(gaps) + 1),
                       served_by=served_by)


async def run_load(base_url: str, model: str | None, requests: list[ServeRequest], *, request_rate: float,
                   concurrency: int | None, api_key: str | None, seed: int, ignore_eos: bool,
                   progress: bool = True, extra_headers: dict[str, str] | None = None) -> dict:
    """Send every request; arrivals are Poisson at request_rate (inf: all at once), in-flight capped by concurrency."""
    headers = {**(extra_headers or {}), **({"authorization": f"Bearer {api_key}"} if api_key else {})}
    base = base_url.rstrip("/")
    # aiohttp rather than httpx: at 32 streams of ~20 tokens/s each, httpx's per-chunk machinery
    # took ~9 % of a core, CPU that a 2-core machine takes from the server being measured. A
    # connection per request (force_close): llama.cpp's server closes idle kept-alive connections
    # under load, and a request written into one fails without reaching it.
    connector = aiohttp.TCPConnector(limit=concurrency or 1000, force_close=True)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout) as session:
        if model is None:
            model = await _first_model(session, base)
        gate = asyncio.Semaphore(concurrency) if concurrency else None
        rng = random.Random(seed)
        columns = (TextColumn("bench serve"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=Console(stderr=True), disable=not progress) as bar:
            task = bar.add_task("requests", total=len(requests))

            async def guarded(req: ServeRequest) -> ServeResult:
                if gate is None:
                    result = await _one(session, f"{base}/chat/completions", model, req, ignore_eos)
                else:
                    async with gate:
                        result = await _one(session, f"{base}/chat/completions", model, req, ignore_eos)
                bar.advance(task)
                return result

            started = time.perf_counter()
            tasks = []
            for req in requests:
                tasks.append(asyncio.create_task(guarded(req)))
                if request_rate != float("inf"):
                    await asyncio.sleep(rng.expovariate(request_rate))
            results = await asyncio.gather(*tasks)
            elapsed = time.perf_counter() - started
    return summarize(model, results, elapsed)


async def _first_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model the server lists; a server that lists none is told apart from a failed run."""
    try:
        async with session.get(f"{base}/models") as listed:
            listed.raise_for_status()
            return (await listed.json(content_type=None))["data"][0]["id"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, LookupError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"could not read a model name from {base}/models ({reason}); give --model") from None


def summarize(model: str, results: list[ServeResult], elapsed: float) -> dict:
    done = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens for r in done)
    ttft = [r.ttft_s * 1e3 for r in done]
    # Per output token, not per chunk: a speculative server sends several tokens in one chunk.
    tpot = [(r.e2e_s - r.ttft_s) / (r.completion_tokens - 1) * 1e3 for r in done if r.completion_tokens > 1]
    return {
        "model": model,
        "requests": len(results),
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "elapsed_s": elapsed,
        "request_throughput_per_s": len(done) / elapsed if elapsed else 0.0,
        "input_tokens": sum(r.prompt_tokens for r in done),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / elapsed if elapsed else 0.0,
        "ttft_ms": percentiles(ttft),
        # TPOT per request: (end - first content chunk) / (output tokens - 1); ITL: the gaps
        # between content chunks
        "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles([g * 1e3 for r in done for g in r.chunk_gaps_s]),
        "e2e_ms": percentiles([r.e2e_s * 1e3 for r in done]),
        "served_by": dict(Counter(r.served_by for r in done if r.served_by)),
        "samples": {"ttft_ms": samples(ttft), "tpot_ms": samples(tpot)},
    }


def run_serve_bench(json_out: str, base_url: str, model: str | None, num_requests: int, request_rate: float,
                    concurrency: int | None, max_prompt_tokens: int, max_tokens: int, api_key: str | None,
                    seed: int, ignore_eos: bool, extra_headers: dict[str, str] | None = None) -> int:
    requests = load_serve_requests(num_requests, max_prompt_tokens, max_tokens, seed)
    report = asyncio.run(run_load(base_url, model, requests, request_rate=request_rate, concurrency=concurrency,
                                  api_key=api_key, seed=seed, ignore_eos=ignore_eos, extra_headers=extra_headers))
    full = {
        "machine": machine_info(),
        "workload": {"source": "ShareGPT V3 first human turns", "num_requests": num_requests,
                     "request_rate": "inf" if request_rate == float("inf") else request_rate,
                     "concurrency": concurrency, "max_prompt_tokens": max_prompt_tokens,
                     "max_tokens": max_tokens, "temperature": 0, "seed": seed, "base_url": base_url,
                     "headers": sorted(extra_headers or ())},
        "server": report,
    }
    write_json(json_out, full)
    Console(stderr=True).print(
        f"{report['completed']}/{report['requests']} ok, {report['output_tokens_per_s']:.1f} output tok/s, "
        f"TTFT p50 {report['ttft_ms']['p50']:.1f} ms, TPOT p50 {report['tpot_ms']['p50']:.1f} ms, "
        f"E2E p99 {report['e2e_ms']['p99']:.1f} ms -> {json_out}")
    return 0 if report["failed"] == 0 else 1
