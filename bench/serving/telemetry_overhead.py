"""Tracing and metrics cost per request, on vs off, through the telemetry helpers.

One simulated request does what the gateway does around a streamed chat call: server span
from a client traceparent, classification and route as attributes, a budget stage span, a
tier span with GenAI attributes, six engine events, traceparent injection, usage, end; and,
in the metrics variants, one metrics observation. No model
runs, so the figures are the telemetry's own cost. "on" exports over OTLP/HTTP to a sink on
loopback; its amortized figure includes the final flush, so export work is counted too.

    python -m bench.serving.telemetry_overhead --requests 2000 --json out.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from bench.common import machine_info, percentiles, write_json
from gateway.telemetry.config import TelemetryConfig, resolve_telemetry
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.tracing import Tracing, build_tracing

HEADERS = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
UNSAMPLED = {}  # no client decision: the local ratio decides


class _Sink(BaseHTTPRequestHandler):
    """Accepts OTLP exports and drops them (a collector's cost is not the gateway's)."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve_sink(ports) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    ports.put(server.server_address[1])
    server.serve_forever()


def one_request(tracing: Tracing, headers: dict, metrics: GatewayMetrics | None, all_stages: bool = False) -> None:
    start = time.perf_counter()
    rt = tracing.start_request("POST", "/v1/chat/completions", headers)
    # Recommended wiring: CPU-only policy steps as attributes, the budget call (Redis) as a span.
    if all_stages:
        with rt.stage("tiergate.classify"):
            rt.classified("latency", ["short_prompt"])
        with rt.stage("tiergate.route"):
            rt.routed("small", ["large"])
    else:
        rt.classified("latency", ["short_prompt"])
        rt.routed("small", ["large"])
    with rt.stage("tiergate.budget"):
        rt.budget("allow", tenant_class="pro")
    with rt.tier_call(tier="small", request_model="SmolLM2-135M", embedded=True, max_tokens=64,
                      temperature=0.7, top_p=0.95, seed=1, stream=True) as ts:
        ts.inject({})
        ts.queued(queue_depth=1)
        ts.scheduled()
        ts.first_token()
        ts.preempted()
        ts.scheduled()
        ts.speculative(3, 4)
        ts.finish(response_id="chatcmpl-x", response_model="SmolLM2-135M", finish_reasons=["stop"],
                  input_tokens=120, output_tokens=64, cache_read_tokens=96)
    rt.end(200)
    if metrics is not None:
        metrics.observe_request(tier="small", profile="latency", tenant_class="pro",
                                duration_s=time.perf_counter() - start, ttft_s=0.01, input_tokens=120,
                                output_tokens=64, cache_read_tokens=96)


def run_variant(tracing: Tracing, headers: dict, metrics: GatewayMetrics | None, n: int,
                all_stages: bool) -> dict:
    for _ in range(200):  # warm up
        one_request(tracing, headers, metrics, all_stages)
    tracing.force_flush()
    per_request = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter_ns()
        one_request(tracing, headers, metrics, all_stages)
        per_request.append((time.perf_counter_ns() - s) / 1000)
        if i % 200 == 199:
            # A loop this tight outruns the exporter's 2048-span queue; flushing keeps every span
            # exported (and its cost counted in the amortized figure) instead of dropped.
            tracing.force_flush()
    tracing.force_flush()
    amortized = (time.perf_counter() - t0) / n * 1e6
    return {"request_path_us": percentiles(per_request), "amortized_us_incl_export": amortized}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    # The sink runs in its own process, like a collector: its parsing must not take our GIL.
    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    sink = ctx.Process(target=_serve_sink, args=(ports,), daemon=True)
    sink.start()
    endpoint = f"http://127.0.0.1:{ports.get(timeout=60)}"
    on = TelemetryConfig(exporter="otlp", endpoint=endpoint)
    off = TelemetryConfig(exporter="none")
    # name: (config, client headers, with metrics, all policy steps as spans)
    variants = {
        "off": (off, HEADERS, False, False),
        "on": (on, HEADERS, False, False),
        "on_all_stage_spans": (on, HEADERS, False, True),
        "on_sampled_out": (TelemetryConfig(exporter="otlp", endpoint=endpoint, sample_ratio=0.0), UNSAMPLED,
                           False, False),
        "metrics_only": (off, HEADERS, True, False),
        "on_with_metrics": (on, HEADERS, True, False),
    }
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleave variants so drift hits all alike
        for name, (cfg, headers, with_metrics, all_stages) in variants.items():
            tracing = build_tracing(resolve_telemetry(cfg, environ={}))
            metrics = GatewayMetrics() if with_metrics else None
            runs[name].append(run_variant(tracing, headers, metrics, args.requests, all_stages))
            tracing.shutdown()
    sink.terminate()
    sink.join(timeout=10)

    report = {"machine": machine_info(), "workload": {
        "requests_per_run": args.requests, "repeats": args.repeats,
        "request": "server span + budget stage span + tier span (16 attributes, 6 events) + inject; "
                   "on_all_stage_spans adds classify and route spans"}}
    for name, results in runs.items():
        report[name] = {
            "request_path_us_p50": statistics.median(r["request_path_us"]["p50"] for r in results),
            "request_path_us_p99": statistics.median(r["request_path_us"]["p99"] for r in results),
            "amortized_us_incl_export": statistics.median(r["amortized_us_incl_export"] for r in results),
        }
    off = report["off"]["amortized_us_incl_export"]
    report["overhead_us_per_request"] = {name: report[name]["amortized_us_incl_export"] - off
                                         for name in variants if name != "off"}
    if args.json:
        write_json(args.json, report)
    for name in variants:
        r = report[name]
        print(f"{name:>16}: p50 {r['request_path_us_p50']:7.1f} us  p99 {r['request_path_us_p99']:7.1f} us  "
              f"amortized incl. export {r['amortized_us_incl_export']:7.1f} us")
    return report


if __name__ == "__main__":
    main()
