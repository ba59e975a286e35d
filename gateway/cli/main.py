"""The `tiergate` command line. User errors end with exit 2 and one line, never a traceback."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from engines.errors import ModelLoadError
from engines.quantization.methods import ARTIFACT_METHODS, INT4_GROUP_SIZES
from gateway.cli.arg_types import non_negative_float, port_number, positive_int
from gateway.cli.output_paths import check_file_outside_dir, check_output_dir, check_output_file
from gateway.cli.usage_error import UsageError
from policies.config import ConfigError

DEFAULT_CONFIG = "config/default.yaml"


class _OneLineParser(argparse.ArgumentParser):
    """argparse's errors, without the usage text before them: one line, as every other CLI error.
    Subparsers are built from the parent's class, so every command gets it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="tiergate", description="LLM gateway with embedded inference engines")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the HTTP gateway")
    serve.add_argument("--config", default=DEFAULT_CONFIG)
    serve.add_argument("--host")
    serve.add_argument("--port", type=port_number)

    gen = sub.add_parser("generate", help="answer one chat-templated prompt")
    gen.add_argument("prompt")
    gen.add_argument("--config", default=DEFAULT_CONFIG)
    gen.add_argument("--tier", help="tier of the config whose engine to run, as serve builds it: its weights "
                                    "quantized as it serves them, its KV dtype, speculative decoding and "
                                    "scheduler (default: the config's default tier)")
    gen.add_argument("--model", help="instead of the tier's weights: 'default', a .gguf file or an HF directory, "
                                     "run as given (the tier's quantization is not applied)")
    gen.add_argument("--dtype", choices=["float32", "bfloat16"])
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=non_negative_float, default=0.0)
    gen.add_argument("--seed", type=int)

    check = sub.add_parser("check-config", help="validate a YAML config")
    check.add_argument("file")

    quant = sub.add_parser("quantize", help="write a quantized copy of a model")
    quant.add_argument("--method", required=True, choices=list(ARTIFACT_METHODS))
    quant.add_argument("--group-size", type=int, default=128)
    quant.add_argument("--out", required=True)
    quant.add_argument("--model", default="default", help="'default', a .gguf file or an HF directory")

    ev = sub.add_parser("eval", help="quality evaluations that write JSON")
    ev_sub = ev.add_subparsers(dest="eval", required=True)
    ppl = ev_sub.add_parser("ppl", help="held-out perplexity of each weight and KV-cache variant")
    ppl.add_argument("--json", required=True, dest="json_out")
    ppl.add_argument("--quant", action="append", dest="variants",
                     help="variant to evaluate (repeatable): fp32, bf16, int8, int4-rtn-g64, int4-rtn-g128, "
                          "int4-awq-g64, int4-awq-g128, int4-gptq-g64, int4-gptq-g128, fp8, kv-bf16, kv-int8, "
                          "kv-fp8, kv-int4, int4-gguf, int4-gguf-rtn (a GGUF's own Q4_K blocks), w4a8-gguf (the same "
                          "blocks with int8 activations)")
    ppl.add_argument("--sequences", type=positive_int, default=24)
    ppl.add_argument("--validation", action="store_true",
                     help="the tuning slice (records 8,000+) instead of the held-out one (12,000+)")
    ppl.add_argument("--no-speed", action="store_true", help="skip the decode tokens/s figures (most of the time)")
    ppl.add_argument("--model", default="default",
                     help="'default' (SmolLM2), 'qwen' (Qwen2.5-Coder-0.5B), a .gguf file or an HF directory")

    hk = sub.add_parser("hash-key", help="print the SHA-256 digest of an API key, for auth.keys[].sha256")
    hk.add_argument("key")

    from bench.cli import add_bench_parsers   # argparse only: each benchmark is imported when it runs

    bench = sub.add_parser("bench", help="benchmarks that write JSON")
    add_bench_parsers(bench.add_subparsers(dest="bench", required=True))
    return parser


def _calibration():
    from gateway.cli.calibration import calibration_source
    return calibration_source()


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
        candidate = Path(__file__).resolve().parents[2] / DEFAULT_CONFIG
        if candidate.is_file():
            return str(candidate)
    return path


def _check_outputs(args: argparse.Namespace) -> None:
    """Every command writes its --json and --report at the end, after the work: refuse a path it
    could not write before the work starts."""
    # `is not None`, not truthiness: an empty path given is a mistake to refuse, not an option left out.
    json_out, report_dir = getattr(args, "json_out", None), getattr(args, "report_dir", None)
    if json_out is not None:
        check_output_file(json_out, "--json")
    if report_dir is not None:
        check_output_dir(report_dir, "--report")
        if json_out is not None:
            check_file_outside_dir(json_out, "--json", report_dir, "--report")
    if args.command == "quantize":
        check_output_dir(args.out, "--out")


def _dispatch(args: argparse.Namespace) -> int:
    if hasattr(args, "config"):
        args.config = _resolve_config(args.config)
    _check_outputs(args)
    if args.command == "serve":
        from gateway.cli.commands import serve
        return serve(args.config, args.host, args.port)
    if args.command == "generate":
        from gateway.cli.commands import generate
        return generate(args)
    if args.command == "check-config":
        from gateway.cli.commands import check_config
        return check_config(args.file)
    if args.command == "quantize":
        from pathlib import Path

        from engines.quantization.build import quantize_to_dir
        if args.group_size not in INT4_GROUP_SIZES:
            raise UsageError(f"--group-size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}")
        out = quantize_to_dir(args.model, args.method, args.group_size, Path(args.out), _calibration())
        print(f"wrote {args.method} g{args.group_size} artifact to {out}")
        return 0
    if args.command == "eval" and args.eval == "ppl":
        from bench.eval.ppl import ALL_VARIANTS, DEFAULT_VARIANTS, run_ppl_eval
        variants = args.variants or list(DEFAULT_VARIANTS)
        unknown = sorted(set(variants) - set(ALL_VARIANTS))
        if unknown:
            raise UsageError(f"unknown variant(s) {unknown}; choose from {list(ALL_VARIANTS)}")
        return run_ppl_eval(args.json_out, variants, args.sequences, validation=args.validation,
                            speed=not args.no_speed, model=args.model)
    if args.command == "hash-key":
        from policies.config import hash_api_key
        try:
            args.key.encode()
        except UnicodeEncodeError:
            # Bytes that are not UTF-8 reach argv as lone surrogates, which have no UTF-8 form.
            raise UsageError("the key is not valid UTF-8 text") from None
        if not args.key.strip():
            raise UsageError("the key is empty")
        # Surrounding whitespace is dropped, as from configured and presented keys.
        print(hash_api_key(args.key))
        return 0
    if args.command == "bench":
        return args.run(args)
    raise UsageError(f"unknown command {args.command}")

