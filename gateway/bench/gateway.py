"""`tiergate bench gateway`: the latency the gateway adds in front of an upstream.

Three processes: an instant OpenAI-compatible upstream, the gateway (`tiergate serve`) in
front of it, and this load generator. The same requests go, at the same open-loop rate, once
straight to the upstream and once through the gateway (auth with hashed keys, classification
rules, routing with a fallback chain, request log on), in interleaved phases of one run.
Added latency = gateway percentile - direct percentile.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gateway.bench.common import machine_info, percentiles, write_json
from gateway.bench.gateway_loadgen import PhaseResult, build_request, run_phase, wait_http
from policies.config import hash_api_key

BARS = {"p50": 1.0, "p99": 5.0}
_KEY = "bench-key-interactive"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gateway_config(upstream_port: int, gateway_port: int) -> str:
    base = f"http://127.0.0.1:{upstream_port}/v1"
    return f"""
server: {{host: 127.0.0.1, port: {gateway_port}, log_requests: true}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(_KEY)}, name: bench}}
    - {{tenant: batch, sha256: {hash_api_key("bench-key-batch")}}}
tenants:
  app: {{class: interactive, allow_profile_hint: true}}
  batch: {{class: batch, allow_profile_hint: false}}
tiers:
  fast: {{kind: upstream, base_url: "{base}", model: instant}}
  bulk: {{kind: upstream, base_url: "{base}", model: instant}}
  roomy: {{kind: upstream, base_url: "{base}", model: instant, max_model_len: 8192}}
models:
  bench-model: {{chain: [bulk, fast]}}
classification:
  default_profile: throughput
  rules:
    - {{name: long-prompt, profile: memory, when: {{prompt_tokens: {{gte: 2000}}}}}}
    - {{name: interactive, profile: latency, when: {{tenant_class: interactive, max_tokens: {{lte: 256}}}}}}
routing:
  rules:
    - {{name: latency, match: {{profile: latency}}, chain: [fast, bulk]}}
    - {{name: memory, match: {{profile: memory}}, chain: [roomy, bulk]}}
    - {{name: throughput, match: {{profile: throughput}}, chain: [bulk, fast]}}
"""


def _payloads(stream_share: float) -> list[bytes]:
    questions = ["What is the capital of France?", "Write a haiku about the sea.",
                 "Summarise the plot of Hamlet in two sentences.", "List three prime numbers.",
                 "Explain what a hash table is.", "Translate 'good morning' into Spanish.",
                 "Give me a synonym for 'fast'.", "Why is the sky blue?"]
    streams = round(stream_share * len(questions))
    out = []
    for i, q in enumerate(questions):
        body = {"model": "bench-model", "messages": [{"role": "user", "content": q}], "max_tokens": 16 + i,
                "temperature": 0.7}
        if i < streams:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        headers = {"authorization": f"Bearer {_KEY}"}
        if i % 4 == 3:
            headers["x-tiergate-profile"] = "memory"
        out.append(build_request("/v1/chat/completions", json.dumps(body).encode(), headers))
    return out


def _loadavg() -> list[float]:
    # The CPU is shared: other work on the machine shows up here and in the tails.
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _run_loop(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(cmd: list[str], log_path: Path) -> subprocess.Popen:
    log = open(log_path, "w")  # noqa: SIM115 - the child writes to it until terminated
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])


def _summary(results: list[PhaseResult], cpu_s: float | None) -> dict:
    lat = [x for r in results for x in r.latencies_ms]
    over = [x for r in results for x in r.overhead_ms]
    sent = sum(r.sent for r in results)
    wall = sum(r.wall_s for r in results)
    kinds: dict[str, int] = {}
    for r in results:
        for kind, count in {**r.error_kinds, **{f"http {s}": c for s, c in r.statuses.items() if s != 200}}.items():
            kinds[kind] = kinds.get(kind, 0) + count
    out = {"requests": sent, "errors": sum(r.errors for r in results), "error_kinds": kinds,
           "achieved_rate": round(sent / wall, 1) if wall else None,
           "latency_ms": {k: round(v, 3) for k, v in percentiles(lat).items()}}
    if over:
        out["self_reported_overhead_ms"] = {k: round(v, 3) for k, v in percentiles(over).items()}
    if cpu_s is not None and sent:
        out["gateway_cpu_ms_per_request"] = round(cpu_s * 1000 / sent, 3)
    return out


async def _measure(upstream: int, gateway: int, payloads: list[bytes], rate: float, seconds: float,
                   rounds: int, gateway_pid: int, console: Console) -> tuple[dict, dict]:
    for port in (upstream, gateway):   # warm-up: connections, caches, the allocator
        await run_phase("127.0.0.1", port, payloads, rate, 2.0)
    direct: list[PhaseResult] = []
    through: list[PhaseResult] = []
    cpu = 0.0
    for r in range(rounds):
        order = [("direct", upstream), ("gateway", gateway)]
        for name, port in order if r % 2 == 0 else order[::-1]:
            before = _cpu_seconds(gateway_pid)
            result = await run_phase("127.0.0.1", port, payloads, rate, seconds)
            (direct if name == "direct" else through).append(result)
            if name == "gateway":
                cpu += _cpu_seconds(gateway_pid) - before
            p = percentiles(result.latencies_ms)
            console.print(f"round {r + 1} {name:8s} p50 {p['p50']:.3f} ms  p99 {p['p99']:.3f} ms  "
                          f"errors {result.errors}")
    return _summary(direct, None), _summary(through, cpu)


def run_gateway_bench(json_out: str, rate: float, seconds: float, rounds: int, stream_share: float) -> int:
    console = Console(stderr=True)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-gw-"))
    up_port, gw_port = _free_port(), _free_port()
    cfg_path = workdir / "gateway.yaml"
    cfg_path.write_text(_gateway_config(up_port, gw_port))
    procs = []
    try:
        procs.append(_start([sys.executable, "-m", "gateway.bench.gateway_upstream", "--port", str(up_port)],
                            workdir / "upstream.log"))
        procs.append(_start([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_path)],
                            workdir / "gateway.log"))
        for port, path in ((up_port, "/healthz"), (gw_port, "/readyz")):
            if not asyncio.run(wait_http("127.0.0.1", port, path, 60)):
                console.print(f"[red]server on port {port} did not come up; logs in {workdir}")
                return 1
        console.print(f"upstream :{up_port}, gateway :{gw_port}; {rounds} rounds x {seconds:.0f} s per side "
                      f"at {rate:.0f} req/s")
        load_before = _loadavg()
        direct, through = _run_loop(_measure(up_port, gw_port, _payloads(stream_share), rate, seconds, rounds,
                                               procs[1].pid, console))
        load_after = _loadavg()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    added = {k: round(through["latency_ms"][k] - direct["latency_ms"][k], 3) for k in ("p50", "p90", "p99")}
    meets = {k: added[k] <= bar for k, bar in BARS.items()}
    report = {
        "benchmark": "gateway",
        "machine": {**machine_info(), "loadavg_before": load_before, "loadavg_after": load_after},
        "workload": {"rate_per_s": rate, "seconds_per_phase": seconds, "rounds": rounds,
                     "stream_share": stream_share, "requests": "8 short chat requests, max_tokens 16-23, "
                     "2 of 8 with a profile hint; auth with hashed keys, 2 classification rules, "
                     "3 routing rules over 3 upstream tiers, one log line per request",
                     "budgets": "not wired yet (issue #8)"},
        "direct": direct,
        "gateway": through,
        "added_latency_ms": added,
        "bars_ms": BARS,
        "meets_bars": meets,
        "ratio_p50": round(through["latency_ms"]["p50"] / direct["latency_ms"]["p50"], 3),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    write_json(json_out, report)
    table = Table(title=f"gateway vs direct at {rate:.0f} req/s")
    for col in ("", "p50 ms", "p90 ms", "p99 ms", "errors"):
        table.add_column(col)
    for name, side in (("direct", direct), ("gateway", through)):
        lat = side["latency_ms"]
        table.add_row(name, f"{lat['p50']:.3f}", f"{lat['p90']:.3f}", f"{lat['p99']:.3f}", str(side["errors"]))
    table.add_row("added", f"{added['p50']:.3f}", f"{added['p90']:.3f}", f"{added['p99']:.3f}", "")
    console.print(table)
    console.print(f"bars p50 <= {BARS['p50']} ms: {meets['p50']}, p99 <= {BARS['p99']} ms: {meets['p99']}; "
                  f"wrote {json_out}")
    return 0
