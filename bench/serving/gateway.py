"""`tiergate bench gateway`: the latency the gateway adds in front of an upstream.

Processes: an instant OpenAI-compatible upstream, the gateway (`tiergate serve`) in front of
it, and this load generator. The same requests go, at the same open-loop rate, straight to the
upstream and through the gateway (auth with hashed keys, classification rules, routing with a
fallback chain, request log on, budgets and rate limits in every scope that never refuse,
circuit breakers), in interleaved phases of one run. The gateway keeps its budgets in memory;
when redis-server is installed a second gateway process keeps them in a local Redis and is
measured in a pass of its own (its own direct phases), so that one variant overloading a small
machine does not spill into the other's figures. Added latency = gateway percentile - direct
percentile of the same pass.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.common import machine_info, percentiles, write_json
from bench.serving.gateway_limits import limits_yaml, start_redis
from bench.serving.loadgen import PhaseResult, build_request, run_phase, wait_http
from bench.processes import cpu_seconds, free_port, loadavg, start_process, stop_processes
from policies.config import hash_api_key

BARS = {"p50": 1.0, "p99": 5.0}
_KEY = "bench-key-interactive"
ADMIN_KEY = "bench-key-admin"     # the console poller's (--console)




def _gateway_config(upstream_port: int, gateway_port: int, redis_url: str | None) -> str:
    base = f"http://127.0.0.1:{upstream_port}/v1"
    return f"""
server: {{host: 127.0.0.1, port: {gateway_port}, log_requests: true}}
auth:
  enabled: true
  keys:
    - {{tenant: app, sha256: {hash_api_key(_KEY)}, name: bench}}
    - {{tenant: batch, sha256: {hash_api_key("bench-key-batch")}}}
  admin_keys:
    - {{sha256: {hash_api_key(ADMIN_KEY)}, name: console}}
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
""" + limits_yaml(["fast", "bulk", "roomy"], redis_url)


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




def _run_loop(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)






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


async def _measure(targets: dict[str, tuple[int, int | None]], payloads: list[bytes], rate: float,
                   seconds: float, rounds: int, console: Console) -> dict[str, dict]:
    """targets: name -> (port, pid whose CPU time is counted). Phases rotate their order per round."""
    for port, _ in targets.values():   # warm-up: connections, caches, the allocator
        await run_phase("127.0.0.1", port, payloads, rate, 2.0)
    results: dict[str, list[PhaseResult]] = {name: [] for name in targets}
    cpu = dict.fromkeys(targets, 0.0)
    names = list(targets)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            port, pid = targets[name]
            before = cpu_seconds(pid) if pid else 0.0
            result = await run_phase("127.0.0.1", port, payloads, rate, seconds)
            results[name].append(result)
            if pid:
                cpu[name] += cpu_seconds(pid) - before
            p = percentiles(result.latencies_ms)
            console.print(f"round {r + 1} {name:14s} p50 {p['p50']:.3f} ms  p99 {p['p99']:.3f} ms  "
                          f"errors {result.errors}")
    return {name: _summary(results[name], cpu[name] if targets[name][1] else None) for name in targets}


def run_gateway_bench(json_out: str, rate: float, seconds: float, rounds: int, stream_share: float,
                      with_console: bool = False, console_concurrency: int = 32, console_tabs: int = 32) -> int:
    """`with_console`: also measure the gateway's throughput with and without an open console
    (bench/serving/console_overhead.py), on the memory-store gateway, after the latency passes."""
    console = Console(stderr=True)
    workdir = Path(tempfile.mkdtemp(prefix="tiergate-bench-gw-"))
    up_port, gw_port, redis_gw_port, redis_port = free_port(), free_port(), free_port(), free_port()
    procs = []
    try:
        procs.append(start_process([sys.executable, "-m", "bench.serving.instant_upstream", "--port", str(up_port)],
                            workdir / "upstream.log"))
        gateways = {"gateway": (gw_port, None)}
        redis = start_redis(redis_port, workdir)
        if redis is not None:
            procs.append(redis)
            gateways["gateway_redis"] = (redis_gw_port, f"redis://127.0.0.1:{redis_port}/0")
        else:
            console.print("[yellow]redis-server not found: measuring the memory-store gateway only")
        targets: dict[str, tuple[int, int | None]] = {"direct": (up_port, None)}
        for name, (port, redis_url) in gateways.items():
            cfg_path = workdir / f"{name}.yaml"
            cfg_path.write_text(_gateway_config(up_port, port, redis_url))
            proc = start_process([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_path)],
                          workdir / f"{name}.log")
            procs.append(proc)
            targets[name] = (port, proc.pid)
        for port, path in [(up_port, "/healthz")] + [(port, "/readyz") for port, _ in gateways.values()]:
            if not asyncio.run(wait_http("127.0.0.1", port, path, 60)):
                console.print(f"[red]server on port {port} did not come up; logs in {workdir}")
                return 1
        console.print(f"upstream :{up_port}, {', '.join(f'{n} :{p}' for n, (p, _) in gateways.items())}; "
                      f"{rounds} rounds x {seconds:.0f} s per side at {rate:.0f} req/s")
        load_before = loadavg()
        # One pass per gateway, each against its own direct phases: an overloaded variant
        # (Redis on a small machine) must not spill into the other's figures.
        passes = {}
        for name in gateways:
            pair = {"direct": targets["direct"], name: targets[name]}
            passes[name] = _run_loop(_measure(pair, _payloads(stream_share), rate, seconds, rounds, console))
        load_after = loadavg()
        console_cost = None
        if with_console:
            from bench.serving.console_overhead import measure_console_cost
            port, pid = targets["gateway"]
            console.print(f"console cost: closed loop, {console_concurrency} clients, {rounds} rounds x "
                          f"{seconds:.0f} s per side")
            console_cost = _run_loop(measure_console_cost(
                "127.0.0.1", port, pid, _payloads(stream_share), concurrency=console_concurrency, seconds=seconds,
                rounds=rounds, key=ADMIN_KEY, tabs=console_tabs, log=console.print))
    finally:
        stop_processes(procs)

    def compared(name: str) -> dict:
        direct, side = passes[name]["direct"], passes[name][name]
        added = {k: round(side["latency_ms"][k] - direct["latency_ms"][k], 3) for k in ("p50", "p90", "p99")}
        return {"direct": direct, "gateway": side, "added_latency_ms": added,
                "meets_bars": {k: added[k] <= bar for k, bar in BARS.items()},
                "ratio_p50": round(side["latency_ms"]["p50"] / direct["latency_ms"]["p50"], 3)}

    results = {name: compared(name) for name in gateways}
    report = {
        "benchmark": "gateway",
        "machine": {**machine_info(), "loadavg_before": load_before, "loadavg_after": load_after},
        "workload": {"rate_per_s": rate, "seconds_per_phase": seconds, "rounds": rounds,
                     "stream_share": stream_share, "requests": "8 short chat requests, max_tokens 16-23, "
                     "2 of 8 with a profile hint; auth with hashed keys, 2 classification rules, "
                     "3 routing rules over 3 upstream tiers, one log line per request",
                     "budgets": "limits in the api key (rpm, tpm), tenant (tokens/day, tokens/month, cost/day, "
                                "concurrency) and tier (tpm, concurrency) scopes, never refusing: one reservation "
                                "+ one reconcile + a breaker permit + its record per request; the top level "
                                "keeps them in memory, `redis` in a local redis-server (its own pass)"},
        **results["gateway"],
        "bars_ms": BARS,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    if "gateway_redis" in results:
        report["redis"] = results["gateway_redis"]
    if console_cost is not None:
        report["console"] = console_cost
    write_json(json_out, report)
    table = Table(title=f"gateway vs direct at {rate:.0f} req/s")
    for col in ("", "p50 ms", "p90 ms", "p99 ms", "errors", "CPU ms/req"):
        table.add_column(col)
    for name, res in results.items():
        for label, side in ((f"direct ({name} pass)", res["direct"]), (name, res["gateway"])):
            lat = side["latency_ms"]
            table.add_row(label, f"{lat['p50']:.3f}", f"{lat['p90']:.3f}", f"{lat['p99']:.3f}", str(side["errors"]),
                          str(side.get("gateway_cpu_ms_per_request", "")))
        extra = res["added_latency_ms"]
        table.add_row(f"added ({name})", f"{extra['p50']:.3f}", f"{extra['p90']:.3f}", f"{extra['p99']:.3f}", "", "")
    console.print(table)
    for name, res in results.items():
        meets = res["meets_bars"]
        console.print(f"{name}: bars p50 <= {BARS['p50']} ms: {meets['p50']}, p99 <= {BARS['p99']} ms: {meets['p99']}; "
                      f"achieved {res['gateway']['achieved_rate']} req/s")
    if console_cost is not None:
        c = console_cost
        console.print(f"console open: {c['throughput_with_console_rps']} req/s vs "
                      f"{c['throughput_without_console_rps']} without (ratio {c['ratio']}); "
                      f"{c['gateway_cpu_ms_per_poll']} ms CPU per poll = {c['cpu_share_of_one_poll_per_s']} of the "
                      f"gateway's CPU at full load; gateway CPU ms per request by tabs open "
                      f"{c['gateway_cpu_ms_per_request']}")
        many = c.get("many_tabs")
        if many:
            console.print(f"{c['tabs']} tabs: throughput x{many['mean_ratio']} (95 % {many['ratio_95']}), so one "
                          f"console costs {many['cost_per_tab']:.4%} (95 % interval {many['cost_per_tab_95'][0]:.3%} "
                          f"to {many['cost_per_tab_95'][1]:.3%}); "
                          f"bar < {c['bar']:.0%}: {c['meets_bar']}")
    console.print(f"wrote {json_out}")
    return 0
