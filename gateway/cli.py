"""The `tiergate` command line. User errors end with exit 2 and one line, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from engines.errors import ModelLoadError
from policies.config import ConfigError

DEFAULT_CONFIG = "config/default.yaml"


class UsageError(ValueError):
    """Bad command-line input the user can fix."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiergate", description="LLM gateway with embedded inference engines")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the HTTP gateway")
    serve.add_argument("--config", default=DEFAULT_CONFIG)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)

    gen = sub.add_parser("generate", help="answer one chat-templated prompt")
    gen.add_argument("prompt")
    gen.add_argument("--config", default=DEFAULT_CONFIG)
    gen.add_argument("--tier", help="tier of the config to use (default: the config's default tier)")
    gen.add_argument("--model", help="override: 'default', a .gguf file or an HF directory")
    gen.add_argument("--dtype", choices=["float32", "bfloat16"])
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int)

    check = sub.add_parser("check-config", help="validate a YAML config")
    check.add_argument("file")

    quant = sub.add_parser("quantize", help="write a quantized copy of a model")
    quant.add_argument("--method", required=True, choices=["int8", "int4-rtn", "int4-awq", "fp8"])
    quant.add_argument("--group-size", type=int, default=128)
    quant.add_argument("--out", required=True)
    quant.add_argument("--model", default="default", help="'default', a .gguf file or an HF directory")

    ev = sub.add_parser("eval", help="quality evaluations that write JSON")
    ev_sub = ev.add_subparsers(dest="eval", required=True)
    ppl = ev_sub.add_parser("ppl", help="held-out perplexity of each weight and KV-cache variant")
    ppl.add_argument("--json", required=True, dest="json_out")
    ppl.add_argument("--quant", action="append", dest="variants",
                     help="variant to evaluate (repeatable): fp32, bf16, int8, int4-rtn-g64, int4-rtn-g128, "
                          "int4-awq-g64, int4-awq-g128, fp8, kv-bf16, kv-int8, kv-fp8, kv-int4")
    ppl.add_argument("--sequences", type=int, default=24)

    hk = sub.add_parser("hash-key", help="print the SHA-256 digest of an API key, for auth.keys[].sha256")
    hk.add_argument("key")

    bench = sub.add_parser("bench", help="benchmarks that write JSON")
    _add_bench_parsers(bench.add_subparsers(dest="bench", required=True))
    return parser


# ---- bench: one parser and one runner per benchmark; add a new one with both -------------
def _add_bench_parsers(bench_sub) -> None:
    decode = bench_sub.add_parser("decode", help="single-stream decode tokens/s: ours vs transformers")
    decode.add_argument("--json", required=True, dest="json_out")
    decode.add_argument("--new-tokens", type=int, default=128)
    decode.add_argument("--repeats", type=int, default=3)
    decode.add_argument("--dtypes", default="float32,bfloat16")
    decode.set_defaults(run=_bench_decode)
    offline = bench_sub.add_parser("offline", help="engine throughput vs transformers static batching")
    offline.add_argument("--json", required=True, dest="json_out")
    offline.add_argument("--num-requests", type=int, default=128)
    offline.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    offline.add_argument("--hf-batch-sizes", default="8,16")
    offline.add_argument("--max-num-seqs", type=int, default=128)
    offline.add_argument("--max-num-batched-tokens", type=int, default=2048)
    offline.add_argument("--kv-cache-mib", type=int, default=2048)
    offline.set_defaults(run=_bench_offline)
    prefix = bench_sub.add_parser("prefix", help="time to first token, cold vs warm prefix cache")
    prefix.add_argument("--json", required=True, dest="json_out")
    prefix.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    prefix.add_argument("--system-tokens", type=int, default=2000)
    prefix.add_argument("--repeats", type=int, default=8)
    prefix.set_defaults(run=_bench_prefix)
    gw = bench_sub.add_parser("gateway", help="latency the gateway adds in front of an instant upstream")
    gw.add_argument("--json", required=True, dest="json_out")
    gw.add_argument("--rate", type=float, default=500.0, help="requests per second (open loop)")
    gw.add_argument("--seconds", type=float, default=10.0, help="length of each measured phase")
    gw.add_argument("--rounds", type=int, default=3, help="direct/gateway phase pairs, interleaved")
    gw.add_argument("--stream-share", type=float, default=0.0, help="fraction of requests that stream")
    gw.set_defaults(run=_bench_gateway)
    spec = bench_sub.add_parser("spec", help="speculative decoding vs plain decoding, batch 1 and batched")
    spec.add_argument("--json", required=True, dest="json_out")
    spec.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    spec.add_argument("--per-task", type=int, default=4, help="input-grounded prompts per task")
    spec.add_argument("--chat-requests", type=int, default=8)
    spec.add_argument("--max-tokens", type=int, default=128)
    spec.add_argument("--batch-sizes", default="16,32")
    spec.add_argument("--draft-model", help="separate draft model (default: the model's int8 copy)")
    spec.add_argument("--self-group-size", type=int, default=32, choices=[32, 64, 128])
    spec.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    spec.set_defaults(run=_bench_spec)


def _bench_decode(args: argparse.Namespace) -> int:
    from gateway.bench.decode import run_decode_bench
    return run_decode_bench(args.json_out, args.new_tokens, args.repeats, args.dtypes.split(","))


def _bench_offline(args: argparse.Namespace) -> int:
    from gateway.bench.offline import run_offline_bench
    sizes = [int(x) for x in args.hf_batch_sizes.split(",") if x]
    return run_offline_bench(args.json_out, args.num_requests, args.dtype, sizes, args.max_num_seqs,
                             args.max_num_batched_tokens, args.kv_cache_mib)


def _bench_prefix(args: argparse.Namespace) -> int:
    from gateway.bench.prefix import run_prefix_bench
    return run_prefix_bench(args.json_out, args.dtype, args.system_tokens, args.repeats)


def _bench_spec(args: argparse.Namespace) -> int:
    from gateway.bench.spec import run_spec_bench
    if args.per_task < 1 or args.chat_requests < 1 or args.max_tokens < 2:
        raise UsageError("--per-task and --chat-requests must be >= 1, --max-tokens >= 2")
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    except ValueError:
        raise UsageError(f"--batch-sizes must be integers separated by commas, got {args.batch_sizes!r}") from None
    return run_spec_bench(args.json_out, args.dtype, args.per_task, args.chat_requests, args.max_tokens, sizes,
                          args.draft_model, args.self_group_size, args.threads)


def _bench_gateway(args: argparse.Namespace) -> int:
    from gateway.bench.gateway import run_gateway_bench
    if args.rate <= 0 or args.seconds <= 0 or args.rounds < 1 or not 0 <= args.stream_share <= 1:
        raise UsageError("--rate and --seconds must be positive, --rounds >= 1, --stream-share in [0, 1]")
    return run_gateway_bench(args.json_out, args.rate, args.seconds, args.rounds, args.stream_share)



def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except (ModelLoadError, ConfigError, UsageError) as exc:
        print(f"tiergate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _resolve_config(path: str) -> str:
    """The default config is found from the working directory, else from the source tree."""
    if path == DEFAULT_CONFIG and not Path(path).is_file():
        candidate = Path(__file__).resolve().parents[1] / DEFAULT_CONFIG
        if candidate.is_file():
            return str(candidate)
    return path


def _dispatch(args: argparse.Namespace) -> int:
    if hasattr(args, "config"):
        args.config = _resolve_config(args.config)
    if args.command == "serve":
        from gateway.commands import serve
        return serve(args.config, args.host, args.port)
    if args.command == "generate":
        from gateway.commands import generate
        return generate(args)
    if args.command == "check-config":
        from gateway.commands import check_config
        return check_config(args.file)
    if args.command == "quantize":
        from pathlib import Path

        from gateway.quantize_cmd import quantize_to_dir
        if args.group_size not in (32, 64, 128, 256):
            raise UsageError("--group-size must be one of 32, 64, 128, 256")
        out = quantize_to_dir(args.model, args.method, args.group_size, Path(args.out))
        print(f"wrote {args.method} g{args.group_size} artifact to {out}")
        return 0
    if args.command == "eval" and args.eval == "ppl":
        from gateway.eval.ppl import DEFAULT_VARIANTS, run_ppl_eval
        variants = args.variants or list(DEFAULT_VARIANTS)
        unknown = sorted(set(variants) - set(DEFAULT_VARIANTS))
        if unknown:
            raise UsageError(f"unknown variant(s) {unknown}; choose from {list(DEFAULT_VARIANTS)}")
        return run_ppl_eval(args.json_out, variants, args.sequences)
    if args.command == "hash-key":
        from policies.config import hash_api_key
        print(hash_api_key(args.key))
        return 0
    if args.command == "bench":
        return args.run(args)
    raise UsageError(f"unknown command {args.command}")


if __name__ == "__main__":
    # Run gateway.cli's own main: under -m this file is __main__, and errors raised as
    # gateway.cli.UsageError elsewhere would not match __main__.UsageError.
    from gateway.cli import main as cli_main
    sys.exit(cli_main())
