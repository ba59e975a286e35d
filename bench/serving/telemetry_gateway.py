"""Tracing cost per request through the real gateway: tracing off vs on, same load, same run.

Processes: the instant upstream, an OTLP/HTTP sink (accepts exports, drops them: a collector's
cost is not the gateway's), two `tiergate serve` gateways with the config of `tiergate bench
gateway` (auth, classification and routing rules, request log), one with the exporter `none`
and one exporting every request's spans over OTLP (OTEL_TRACES_EXPORTER=otlp; no client
traceparent, so the gateway samples each request itself at ratio 1.0), and this open-loop load
generator. Phases alternate between the two gateways so drift on the shared CPU hits both
alike. Metrics (/metrics instruments) are on in both: the difference is the tracing.

    python -m bench.serving.telemetry_gateway --rate 200 --seconds 5 --rounds 4 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_info, percentiles, write_json
from bench.serving.loadgen import PhaseResult, build_request, run_phase, wait_http
from bench.processes import cpu_seconds, free_port, loadavg, start_process, stop_processes
from bench.serving.telemetry_overhead import _serve_sink
from policies.config import hash_api_key

_KEY = "bench-key-tracing"




def _gateway_config(upstream_port: int, gateway_port: int) -> str:
    """Auth with a hashed key, two classification rules, three routing rules over three upstream
    tiers, one log line per request: what a request goes through besides telemetry."""
    base = f"http://127.0.0.1:{upstream_port}/v1"
    return f"""
server: {{host: 127.0.0.1, port: {gateway_port}, log_requests: true, reload_poll_s: 0}}
auth:
  enabled: true
  keys: [{{tenant: app, sha256: {hash_api_key(_KEY)}, name: bench}}]
tenants:
  app: {{class: interactive}}
tiers:
  fast: {{kind: upstream, base_url: "{base}", model: instant}}
  bulk: {{kind: upstream, base_url: "{base}", model: instant}}
  roomy: {{kind: upstream, base_url: "{base}", model: instant, max_model_len: 8192}}
models:
  bench-model: {{chain: [bulk, fast]}}
classification:
  rules:
    - {{name: long-prompt, profile: memory, when: {{prompt_tokens: {{gte: 2000}}}}}}
    - {{name: interactive, profile: latency, when: {{tenant_class: interactive, max_tokens: {{lte: 256}}}}}}
routing:
  rules:
    - {{name: latency, match: {{profile: latency}}, chain: [fast, bulk]}}
    - {{name: memory, match: {{profile: memory}}, chain: [roomy, bulk]}}
"""


def _payloads() -> list[bytes]:
    """Eight short chat requests, every other one streamed with include_usage."""
    out = []
    for i, question in enumerate(["What is the capital of France?", "Write a haiku about the sea.",
                                  "List three prime numbers.", "Explain what a hash table is.",
                                  "Give me a synonym for 'fast'.", "Why is the sky blue?",
                                  "Translate 'good morning' into Spanish.", "Name a large mammal."]):
        body = {"model": "bench-model", "messages": [{"role": "user", "content": question}],
                "max_tokens": 16 + i, "temperature": 0.7}
        if i % 2:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        out.append(build_request("/v1/chat/completions", json.dumps(body).encode(),
                                 {"authorization": f"Bearer {_KEY}"}))
    return out








def _summary(results: list[PhaseResult], cpu_s: float) -> dict:
    lat = [x for r in results for x in r.latencies_ms]
    sent = sum(r.sent for r in results)
    return {"requests": sent, "errors": sum(r.errors for r in results),
            "latency_ms": {k: round(v, 3) for k, v in percentiles(lat).items()},
            "gateway_cpu_ms_per_request": round(cpu_s * 1000 / sent, 4) if sent else None}


async def _measure(ports: dict[str, int], pids: dict[str, int], payloads: list[bytes], rate: float,
                   seconds: float, rounds: int) -> dict[str, dict]:
    for port in ports.values():   # warm-up: connections, caches, the exporter's first batches
        await run_phase("127.0.0.1", port, payloads, rate, 2.0)
    results: dict[str, list[PhaseResult]] = {name: [] for name in ports}
    cpu = dict.fromkeys(ports, 0.0)
    names = list(ports)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            before = cpu_seconds(pids[name])
            result = await run_phase("127.0.0.1", ports[name], payloads, rate, seconds)
            await asyncio.sleep(0.5)   # the batch exporter's last export of the phase counts too
            cpu[name] += cpu_seconds(pids[name]) - before
            results[name].append(result)
            p = percentiles(result.latencies_ms)
            print(f"round {r + 1} tracing {name:3s} p50 {p['p50']:.3f} ms  p99 {p['p99']:.3f} ms  "
                  f"errors {result.errors}", file=sys.stderr)
    return {name: _summary(results[name], cpu[name]) for name in ports}


def run(json_out: str | None, rate: float, seconds: float, rounds: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-tracing-"))
    spawn = multiprocessing.get_context("spawn")
    sink_port = spawn.Queue()
    sink = spawn.Process(target=_serve_sink, args=(sink_port,), daemon=True)
    sink.start()
    endpoint = f"http://127.0.0.1:{sink_port.get(timeout=60)}"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    envs = {"off": base_env, "on": {**base_env, "OTEL_TRACES_EXPORTER": "otlp",
                                    "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}}
    up_port = free_port()
    ports = {name: free_port() for name in envs}
    procs = [start_process([sys.executable, "-m", "bench.serving.instant_upstream", "--port", str(up_port)],
                    workdir / "upstream.log", base_env)]
    pids = {}
    try:
        for name, env in envs.items():
            cfg = workdir / f"gateway-{name}.yaml"
            cfg.write_text(_gateway_config(up_port, ports[name]))
            proc = start_process([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
                          workdir / f"gateway-{name}.log", env)
            procs.append(proc)
            pids[name] = proc.pid
        for port, path in ((up_port, "/healthz"), *((p, "/readyz") for p in ports.values())):
            if not asyncio.run(wait_http("127.0.0.1", port, path, 60)):
                raise RuntimeError(f"server on port {port} did not come up; logs in {workdir}")
        load_before = loadavg()
        sides = asyncio.run(_measure(ports, pids, _payloads(), rate, seconds, rounds))
        load_after = loadavg()
    finally:
        stop_processes(procs)
        sink.terminate()
        sink.join(timeout=10)
    off, on = sides["off"], sides["on"]
    report = {
        "benchmark": "tracing overhead through the gateway",
        "machine": {**machine_info(), "loadavg_before": load_before, "loadavg_after": load_after},
        "workload": {"rate_per_s": rate, "seconds_per_phase": seconds, "rounds": rounds,
                     "requests": "8 short chat requests (half streamed) to upstream tiers, the config of "
                                 "`tiergate bench gateway`; tracing on: every request sampled, OTLP/HTTP export "
                                 "to a sink on loopback"},
        "off": off, "on": on,
        "added_latency_ms": {k: round(on["latency_ms"][k] - off["latency_ms"][k], 3) for k in ("p50", "p90", "p99")},
        "added_cpu_ms_per_request": round(on["gateway_cpu_ms_per_request"] - off["gateway_cpu_ms_per_request"], 4),
        "cpu_ratio": round(on["gateway_cpu_ms_per_request"] / off["gateway_cpu_ms_per_request"], 3),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if json_out:
        write_json(json_out, report)
    for name in ("off", "on"):
        side = report[name]
        lat = side["latency_ms"]
        print(f"tracing {name:3s}: p50 {lat['p50']:.3f} ms  p90 {lat['p90']:.3f} ms  p99 {lat['p99']:.3f} ms  "
              f"gateway CPU {side['gateway_cpu_ms_per_request']:.4f} ms/request  errors {side['errors']}")
    print(f"added by tracing: latency {report['added_latency_ms']}, CPU {report['added_cpu_ms_per_request']} "
          f"ms/request (x{report['cpu_ratio']})")
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second, open loop")
    ap.add_argument("--seconds", type=float, default=5.0, help="per phase")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    run(args.json, args.rate, args.seconds, args.rounds)


if __name__ == "__main__":
    main()
