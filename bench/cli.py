"""`tiergate bench ...`: one parser and one runner per benchmark; add a new one with both.

Runners import their benchmark lazily so `tiergate serve` never pays for benchmark imports. The
learned router's three commands keep their parsers and runners in bench/routing/cli.py.
"""

from __future__ import annotations

import argparse

from bench.routing.cli import add_routing_parsers
from engines.quantization.methods import GGUF_METHODS, LAYER_METHODS
from gateway.cli.arg_types import (dtype_list, non_negative_int, positive_float, positive_int, positive_int_list,
                                   positive_int_list_or_empty, positive_rate)
from gateway.cli.usage_error import UsageError

# Methods that quantize a loaded model in-process, without calibration text.
QUANTIZATION_CHOICES = (*LAYER_METHODS, *GGUF_METHODS)


def add_bench_parsers(bench_sub) -> None:
    decode = bench_sub.add_parser("decode", help="single-stream decode tokens/s: ours vs transformers")
    decode.add_argument("--json", required=True, dest="json_out")
    decode.add_argument("--new-tokens", type=positive_int, default=128)
    decode.add_argument("--repeats", type=positive_int, default=3)
    decode.add_argument("--dtypes", type=dtype_list, default="float32,bfloat16",
                        help="comma list of float32 and bfloat16, each measured in turn")
    decode.set_defaults(run=_bench_decode)
    offline = bench_sub.add_parser("offline", help="engine throughput vs transformers static batching")
    offline.add_argument("--json", required=True, dest="json_out")
    offline.add_argument("--num-requests", type=positive_int, default=128)
    offline.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    offline.add_argument("--hf-batch-sizes", type=positive_int_list_or_empty, default="8,16",
                         help="transformers batch sizes to compare with ('': the engine alone)")
    offline.add_argument("--max-num-seqs", type=positive_int, default=128)
    offline.add_argument("--max-num-batched-tokens", type=positive_int, default=2048)
    offline.add_argument("--kv-cache-mib", type=positive_int, default=2048)
    offline.add_argument("--engine-processes", type=non_negative_int, default=0,
                         help="run the engine in N worker processes (a tier's engine_processes), "
                              "each with --max-num-seqs and --kv-cache-mib of its own; 0: in this process")
    offline.add_argument("--threads", type=positive_int, help="CPU threads of each engine process (default: torch's)")
    offline.add_argument("--quantization", choices=QUANTIZATION_CHOICES,
                         help="tiergate's weights quantized in-process, as a tier's `quantization` (default: dense)")
    offline.add_argument("--kv-cache-dtype", choices=["int8"],
                         help="the KV cache's storage, as a tier's `kv_cache_dtype` (default: the model's dtype)")
    offline.add_argument("--dense-prefill", choices=["auto", "off"], default="auto",
                         help="block-quantized weights: dense copies for prefill-sized steps where measured faster, "
                              "as a tier's `dense_prefill` (default: auto, a tier's default)")
    offline.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    offline.set_defaults(run=_reported("offline", _bench_offline))
    prefix = bench_sub.add_parser("prefix", help="time to first token, cold vs warm prefix cache")
    prefix.add_argument("--json", required=True, dest="json_out")
    prefix.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    prefix.add_argument("--system-tokens", type=positive_int, default=2000)
    prefix.add_argument("--repeats", type=positive_int, default=8)
    prefix.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    prefix.set_defaults(run=_reported("prefix", _bench_prefix))
    gw = bench_sub.add_parser("gateway", help="latency the gateway adds in front of an instant upstream")
    gw.add_argument("--json", required=True, dest="json_out")
    gw.add_argument("--rate", type=positive_float, default=500.0, help="requests per second (open loop)")
    gw.add_argument("--seconds", type=positive_float, default=10.0, help="length of each measured phase")
    gw.add_argument("--rounds", type=int, default=3, help="direct/gateway phase pairs, interleaved")
    gw.add_argument("--stream-share", type=float, default=0.0, help="fraction of requests that stream")
    gw.add_argument("--console", action="store_true", help="also measure throughput (closed loop) with and without "
                                                           "an operator console polling the gateway once a second")
    gw.add_argument("--console-concurrency", type=int, default=32, help="clients of the closed-loop throughput phases")
    gw.add_argument("--console-tabs", type=int, default=32,
                    help="also measure with this many console tabs open: one tab's cost is theirs divided by it "
                         "(1: one tab only)")
    gw.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    gw.set_defaults(run=_reported("gateway", _bench_gateway))
    spec = bench_sub.add_parser("spec", help="speculative decoding vs plain decoding, batch 1 and batched")
    spec.add_argument("--json", required=True, dest="json_out")
    spec.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    spec.add_argument("--per-task", type=int, default=4, help="input-grounded prompts per task")
    spec.add_argument("--chat-requests", type=int, default=8)
    spec.add_argument("--max-tokens", type=int, default=128)
    spec.add_argument("--batch-sizes", type=positive_int_list_or_empty, default="16,32")
    spec.add_argument("--draft-model", help="separate draft model (default: the model's int8 copy)")
    spec.add_argument("--self-group-size", type=int, default=32, choices=[32, 64, 128])
    spec.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    spec.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    spec.set_defaults(run=_reported("spec", _bench_spec))
    serve = bench_sub.add_parser("serve", help="load generator for any OpenAI-compatible URL (ShareGPT prompts)")
    serve.add_argument("--json", required=True, dest="json_out")
    serve.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI base URL, ending in /v1")
    serve.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    serve.add_argument("--num-requests", type=int, default=64)
    arrivals = serve.add_mutually_exclusive_group()
    arrivals.add_argument("--request-rate", type=positive_rate, default=float("inf"),
                          help="Poisson arrivals at this many requests/s (default inf: all at once)")
    arrivals.add_argument("--concurrency", help="fixed number of requests in flight instead; a comma list "
                                                 "(1,8,32) runs each level in turn")
    serve.add_argument("--max-prompt-tokens", type=int, default=512)
    serve.add_argument("--max-tokens", type=int, default=128, help="cap on each request's output tokens")
    serve.add_argument("--api-key", help="bearer key (default: $TIERGATE_API_KEY, else none)")
    serve.add_argument("--seed", type=int, default=0)
    serve.add_argument("--ignore-eos", action="store_true", help="ask the server to always emit --max-tokens")
    serve.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                       help="extra request header (repeatable), e.g. 'x-tiergate-profile: latency'")
    serve.add_argument("--compare-header", action="append", default=[], metavar="NAME:VALUE",
                       help="extra request header for the --compare server (repeatable; --header goes to the "
                            "first server only)")
    serve.add_argument("--compare", metavar="URL", help="a second OpenAI-compatible server (base URL ending in "
                                                         "/v1) run on the same requests in the same command")
    serve.add_argument("--compare-model", help="model name for --compare (default: the first it lists)")
    serve.add_argument("--compare-api-key", help="bearer key for --compare (default: none)")
    serve.add_argument("--warmup", type=int, default=4, help="unmeasured requests per server before a "
                                                             "--compare or multi-level run")
    serve.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    serve.set_defaults(run=_reported("serve", _bench_serve))
    soak = bench_sub.add_parser("soak", help="a long run at a share of measured capacity: RSS growth and p99 drift")
    soak.add_argument("--json", required=True, dest="json_out")
    soak.add_argument("--config", default="config/default.yaml", help="the config `tiergate serve` runs")
    soak.add_argument("--minutes", type=positive_float, default=30.0, help="length of the measured period")
    soak.add_argument("--load", type=float, default=0.7, help="offered load as a share of measured capacity")
    soak.add_argument("--concurrency", type=int, default=16, help="requests in flight while measuring capacity")
    soak.add_argument("--capacity-seconds", type=positive_float, default=60.0)
    soak.add_argument("--window-seconds", type=positive_float, default=60.0, help="length of each reported window")
    soak.add_argument("--pool-size", type=int, default=128, help="distinct ShareGPT prompts, cycled")
    soak.add_argument("--max-prompt-tokens", type=int, default=256)
    soak.add_argument("--max-tokens", type=int, default=32, help="output tokens of every request (EOS ignored)")
    soak.add_argument("--seed", type=int, default=0)
    soak.set_defaults(run=_bench_soak)
    prof = bench_sub.add_parser("profile", help="where a decode step's time goes (GEMMs, attention, norms, "
                                                "sampling, scheduling...) at several batch sizes")
    prof.add_argument("--json", required=True, dest="json_out")
    prof.add_argument("--batch-sizes", type=positive_int_list, default="1,8,32,128")
    prof.add_argument("--model", default="default", help="'default', 'qwen', a .gguf file or an HF directory")
    prof.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    prof.add_argument("--quantization", choices=QUANTIZATION_CHOICES,
                      help="weights quantized in-process before profiling (default: unquantized)")
    prof.add_argument("--steps", type=int, default=16, help="decode steps timed per batch size")
    prof.add_argument("--max-prompt-tokens", type=int, default=256)
    prof.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    prof.set_defaults(run=_reported("profile", _bench_profile))
    ladder = bench_sub.add_parser("ladder", help="the optimisation stack one rung at a time: batching, INT4 AWQ, "
                                                 "prefix cache, INT8 KV, speculative decoding")
    ladder.add_argument("--json", required=True, dest="json_out")
    ladder.add_argument("--num-requests", type=int, default=32)
    ladder.add_argument("--latency-requests", type=int, default=4, help="requests of the one-at-a-time view")
    ladder.add_argument("--max-tokens", type=int, default=64, help="cap on each request's output tokens")
    ladder.add_argument("--kv-cache-mib", type=int, default=96, help="KV budget of every rung")
    ladder.add_argument("--group-size", type=int, default=64, choices=[64, 128])
    ladder.add_argument("--threads", type=positive_int, help="torch threads (default: torch's choice)")
    ladder.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    ladder.set_defaults(run=_reported("ladder", _bench_ladder))
    structured = bench_sub.add_parser("structured", help="grammar-constrained vs plain decoding throughput on the "
                                                         "same prompts, and grammar compile times")
    structured.add_argument("--json", required=True, dest="json_out")
    structured.add_argument("--model", default="default", help="bundled model name or path")
    structured.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    structured.add_argument("--batch", type=int, default=32, help="requests submitted at once, every one constrained")
    structured.add_argument("--max-tokens", type=int, default=128)
    structured.add_argument("--rounds", type=int, default=3, help="plain/constrained pairs, alternated")
    structured.add_argument("--compile-schemas", type=int, default=100, help="distinct schemas compiled fresh")
    structured.add_argument("--report", dest="report_dir", help="also write DIR/report.md")
    structured.set_defaults(run=_bench_structured)
    add_routing_parsers(bench_sub)


def _reported(kind: str, run):
    """`run`, then --report DIR drawn from the JSON it wrote (bench/bench_reports.py)."""
    def run_then_report(args: argparse.Namespace) -> int:
        code = run(args)
        if code == 0 and args.report_dir is not None:
            from bench.bench_reports import write_report
            print(f"wrote {write_report(kind, args.json_out, args.report_dir)}")
        return code
    return run_then_report


def _bench_profile(args: argparse.Namespace) -> int:
    from bench.engine.profile import run_profile_bench
    if args.steps < 1 or args.max_prompt_tokens < 1:
        raise UsageError("--steps and --max-prompt-tokens must be >= 1")
    return run_profile_bench(args.json_out, args.batch_sizes, args.model, args.dtype, args.quantization, args.steps,
                             args.max_prompt_tokens)


def _bench_structured(args: argparse.Namespace) -> int:
    if args.batch < 1 or args.max_tokens < 1 or args.rounds < 1 or args.compile_schemas < 1:
        raise UsageError("--batch, --max-tokens, --rounds and --compile-schemas must be at least 1")
    from bench.structured.report import write_structured_report
    from bench.structured.run import run_structured_bench
    code = run_structured_bench(args.json_out, args.model, args.dtype, args.batch, args.max_tokens, args.rounds,
                                args.compile_schemas)
    if code == 0 and args.report_dir is not None:
        print(f"wrote {write_structured_report(args.json_out, args.report_dir)}")
    return code


def _bench_decode(args: argparse.Namespace) -> int:
    from bench.engine.decode import run_decode_bench
    return run_decode_bench(args.json_out, args.new_tokens, args.repeats, args.dtypes)


def _bench_offline(args: argparse.Namespace) -> int:
    from bench.engine.offline import run_offline_bench
    return run_offline_bench(args.json_out, args.num_requests, args.dtype, args.hf_batch_sizes, args.max_num_seqs,
                             args.max_num_batched_tokens, args.kv_cache_mib, args.engine_processes, args.threads,
                             args.quantization, args.kv_cache_dtype, args.dense_prefill)


def _bench_prefix(args: argparse.Namespace) -> int:
    from bench.engine.prefix import run_prefix_bench
    return run_prefix_bench(args.json_out, args.dtype, args.system_tokens, args.repeats)


def _bench_spec(args: argparse.Namespace) -> int:
    from bench.engine.spec import run_spec_bench
    if args.per_task < 1 or args.chat_requests < 1 or args.max_tokens < 2:
        raise UsageError("--per-task and --chat-requests must be >= 1, --max-tokens >= 2")
    return run_spec_bench(args.json_out, args.dtype, args.per_task, args.chat_requests, args.max_tokens,
                          args.batch_sizes, args.draft_model, args.self_group_size, args.threads)


def _bench_gateway(args: argparse.Namespace) -> int:
    from bench.serving.gateway import run_gateway_bench
    if args.rate <= 0 or args.seconds <= 0 or args.rounds < 1 or not 0 <= args.stream_share <= 1:
        raise UsageError("--rate and --seconds must be positive, --rounds >= 1, --stream-share in [0, 1]")
    if args.console_concurrency < 1 or not 1 <= args.console_tabs <= 256:
        raise UsageError("--console-concurrency must be >= 1, --console-tabs in [1, 256]")
    return run_gateway_bench(args.json_out, args.rate, args.seconds, args.rounds, args.stream_share,
                             args.console, args.console_concurrency, args.console_tabs)


def _bench_serve(args: argparse.Namespace) -> int:
    import os

    from bench.serving.serve import run_serve_bench
    from bench.serving.server_url import check_server_url
    if args.num_requests < 1 or args.request_rate <= 0 or args.max_tokens < 1 or args.max_prompt_tokens < 1:
        raise UsageError("--num-requests, --request-rate, --max-tokens and --max-prompt-tokens must be positive")
    levels = _concurrency_levels(args.concurrency)
    if args.warmup < 0:
        raise UsageError("--warmup must be >= 0")
    api_key = args.api_key or os.environ.get("TIERGATE_API_KEY")
    headers = _parse_headers(args.header, "--header")
    compare_headers = _parse_headers(args.compare_header, "--compare-header")
    if args.compare and levels is None:
        raise UsageError("--compare runs closed loop: give --concurrency (a level or a comma list)")
    check_server_url(args.base_url, "--base-url")
    if args.compare:
        check_server_url(args.compare, "--compare")
    if args.compare or (levels is not None and len(levels) > 1):
        from bench.serving.compare import Target, run_sweep_bench
        primary = Target(args.base_url, args.model, api_key, headers)
        compare = (Target(args.compare, args.compare_model, args.compare_api_key, compare_headers)
                   if args.compare else None)
        return run_sweep_bench(args.json_out, primary, compare, levels, args.num_requests, args.max_prompt_tokens,
                               args.max_tokens, args.seed, args.ignore_eos, args.warmup)
    return run_serve_bench(args.json_out, args.base_url, args.model, args.num_requests, args.request_rate,
                           levels[0] if levels else None, args.max_prompt_tokens, args.max_tokens, api_key,
                           args.seed, args.ignore_eos, headers)


def _parse_headers(items: list[str], flag: str) -> dict[str, str]:
    headers = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise UsageError(f"{flag} must look like 'name: value', got {item!r}")
        headers[name.strip()] = value.strip()
    return headers


def _concurrency_levels(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--concurrency takes a number or a comma list of numbers, not {text!r}") from None
    if not levels or min(levels) < 1:
        raise UsageError("--concurrency levels must be >= 1")
    return levels


def _bench_ladder(args: argparse.Namespace) -> int:
    from bench.engine.ladder import run_ladder_bench
    if args.num_requests < 1 or args.max_tokens < 2 or args.kv_cache_mib < 1:
        raise UsageError("--num-requests and --kv-cache-mib must be >= 1, --max-tokens >= 2")
    if not 1 <= args.latency_requests <= args.num_requests:
        raise UsageError("--latency-requests must lie in [1, --num-requests]")
    return run_ladder_bench(args.json_out, args.num_requests, args.latency_requests, args.max_tokens,
                            args.kv_cache_mib, args.group_size, args.threads)


def _bench_soak(args: argparse.Namespace) -> int:
    from bench.serving.soak import run_soak_bench
    if args.minutes <= 0 or not 0 < args.load <= 1 or args.capacity_seconds <= 0 or args.window_seconds <= 0:
        raise UsageError("--minutes, --capacity-seconds and --window-seconds must be positive, --load in (0, 1]")
    if args.concurrency < 1 or args.pool_size < 1 or args.max_tokens < 1 or args.max_prompt_tokens < 1:
        raise UsageError("--concurrency, --pool-size, --max-tokens and --max-prompt-tokens must be >= 1")
    if args.window_seconds * 3 > args.minutes * 60:
        raise UsageError("the measured period must hold at least three windows (--minutes vs --window-seconds)")
    return run_soak_bench(args.json_out, args.config, args.minutes, args.load, args.concurrency,
                          args.capacity_seconds, args.window_seconds, args.pool_size, args.max_prompt_tokens,
                          args.max_tokens, args.seed)
