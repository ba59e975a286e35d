"""`tiergate bench routing`, `routing-labels` and `routing-train`: the learned router's three commands.

Each runner imports its benchmark lazily, as bench/cli.py's do.
"""

from __future__ import annotations

import argparse

from gateway.cli.output_paths import check_output_file
from gateway.cli.usage_error import UsageError
from policies.cascade import PER_TOKEN_SIGNALS


def add_routing_parsers(bench_sub) -> None:
    routing = bench_sub.add_parser("routing", help="is routing worth it: quality gap recovered per share of calls "
                                                   "to the large tier, tiergate's router vs random and the oracle")
    routing.add_argument("--json", required=True, dest="json_out")
    routing.add_argument("--report", dest="report_dir", help="also write DIR/report.md with PNG plots")
    routing.add_argument("--num-prompts", type=int, default=300)
    routing.add_argument("--small", default="default", help="small tier's model (source name or path)")
    routing.add_argument("--large", default="qwen", help="large tier's model (source name or path)")
    routing.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    routing.add_argument("--probe-tokens", type=int, default=8, help="K: the cascade's held-back tokens")
    routing.add_argument("--signal", choices=list(PER_TOKEN_SIGNALS), default="mean_logprob",
                         help="the cascade's confidence signal")
    routing.add_argument("--max-prompt-tokens", type=int, default=512, help="skip longer templated prompts "
                                                                            "(small tier's tokens)")
    routing.add_argument("--max-reference-tokens", type=int, default=256, help="cut longer reference answers")
    routing.add_argument("--min-reference-tokens", type=int, default=8, help="skip shorter reference answers")
    routing.add_argument("--slice", choices=["heldout", "tuning"], default="heldout", dest="slice_name",
                         help="heldout: records 15,000+ (the judged run); tuning: 10,000-12,000 (choose thresholds)")
    routing.add_argument("--seed", type=int, default=0, help="the sampled random router")
    routing.add_argument("--speed-batch", type=int, default=32, help="batch of the throughput (cost) measurement")
    routing.add_argument("--speed-decode-tokens", type=int, default=32)
    routing.add_argument("--speed-rounds", type=int, default=2, help="alternating small/large throughput rounds "
                                                                     "(each tier's best is kept)")
    routing.add_argument("--latency-prompts", type=int, default=8, help="prompts timed one at a time")
    routing.add_argument("--latency-tokens", type=int, default=24, help="tokens of each timed request (>= K)")
    routing.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    routing.add_argument("--gain-model", default="smollm2-qwen2.5-coder",
                         help="tiergate's router: a learned gain model (bundled name or path); 'none' judges the "
                              "hand-written rules with the cascade instead")
    routing.set_defaults(run=_bench_routing)
    labels = bench_sub.add_parser("routing-labels", help="score training prompts on both tiers (bits per byte of "
                                                         "the reference): the labels a learned router is fitted on")
    labels.add_argument("--out", required=True, help="JSON lines, one per prompt; a rerun continues the file")
    labels.add_argument("--num-prompts", type=int, default=3000)
    labels.add_argument("--small", default="default", help="small tier's model (source name or path)")
    labels.add_argument("--large", default="qwen", help="large tier's model (source name or path)")
    labels.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    labels.add_argument("--slice", choices=["training", "tuning"], default="training", dest="slice_name",
                        help="training: records 0-15,000 (everything before the held-out slice)")
    labels.add_argument("--max-prompt-tokens", type=int, default=512)
    labels.add_argument("--max-reference-tokens", type=int, default=256)
    labels.add_argument("--min-reference-tokens", type=int, default=8)
    labels.set_defaults(run=_bench_routing_labels)
    train = bench_sub.add_parser("routing-train", help="fit the learned router's gain model on routing-labels' "
                                                       "output (cross-validated; the held-out slice is never read)")
    train.add_argument("--labels", required=True, help="the JSON lines routing-labels wrote")
    train.add_argument("--out", required=True, help="the gain model file to write (JSON)")
    train.add_argument("--share", type=float, default=0.30, help="share of calls to large the written threshold "
                                                                  "gives on the training prompts")
    train.add_argument("--folds", type=int, default=5)
    train.add_argument("--min-prompts-per-feature", type=int, default=3)
    train.add_argument("--prefill-model", default="default",
                       help="the small tier's model, whose prompt hidden states join the text features; 'none': "
                            "a text-only model (routes at classification, with no small-tier work)")
    train.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    train.add_argument("--prefill-rows", default=None,
                       help="prompt rows the model reads, counted back from the last prompt token, e.g. '0,5' "
                            "(default: the last token and the one that closes the user's turn)")
    train.add_argument("--prefill-cache", default=None,
                       help="an .npz file keeping the prompt hidden states for reruns")
    train.set_defaults(run=_bench_routing_train)


def _bench_routing_labels(args: argparse.Namespace) -> int:
    from bench.routing.labels import LabelFileError, LabelOptions, collect_labels
    from bench.routing.workload import WorkloadCaps, WorkloadError
    if args.num_prompts < 1:
        raise UsageError("--num-prompts must be >= 1")
    check_output_file(args.out, "--out")
    if not 1 <= args.min_reference_tokens <= args.max_reference_tokens or args.max_prompt_tokens < 1:
        raise UsageError("need 1 <= --min-reference-tokens <= --max-reference-tokens and --max-prompt-tokens >= 1")
    caps = WorkloadCaps(args.max_prompt_tokens, args.max_reference_tokens, args.min_reference_tokens)
    options = LabelOptions(num_prompts=args.num_prompts, small=args.small, large=args.large, dtype=args.dtype,
                           caps=caps, slice_name=args.slice_name)
    try:
        # it reads the labels already in --out first, before any model is loaded
        return collect_labels(args.out, options)
    except LabelFileError as exc:
        raise UsageError(f"--out: {exc} (a rerun continues the label file it names)") from None
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None


def _bench_routing_train(args: argparse.Namespace) -> int:
    from bench.routing.labels import LabelFileError
    from bench.routing.train_router import TrainOptions, run_train
    from bench.routing.workload import WorkloadError
    if not 0 < args.share < 1 or args.folds < 2 or args.min_prompts_per_feature < 1:
        raise UsageError("need 0 < --share < 1, --folds >= 2 and --min-prompts-per-feature >= 1")
    if not args.labels.strip():
        raise UsageError("--labels is empty; give the file routing-labels wrote")
    check_output_file(args.out, "--out")
    rows = None
    if args.prefill_rows:
        try:
            rows = tuple(int(r) for r in args.prefill_rows.split(","))
        except ValueError:
            raise UsageError("--prefill-rows takes offsets like '0,5'") from None
        from policies.gain_model import GainModelError, check_prefill_rows
        try:
            check_prefill_rows(rows)
        except GainModelError as exc:
            raise UsageError(f"--prefill-rows: {exc}") from None
    options = TrainOptions(min_prompts_per_feature=args.min_prompts_per_feature, folds=args.folds, share=args.share,
                           prefill_rows=rows)
    try:
        return run_train(args.labels, args.out, options,
                         None if args.prefill_model.lower() == "none" else args.prefill_model, args.dtype,
                         args.prefill_cache)
    except LabelFileError as exc:       # read first, before any model is loaded
        raise UsageError(f"--labels: {exc}") from None
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None


def _bench_routing(args: argparse.Namespace) -> int:
    from bench.routing.runner import RoutingOptions, run_routing_bench
    from bench.routing.workload import WorkloadCaps, WorkloadError
    if min(args.num_prompts, args.probe_tokens, args.speed_batch, args.speed_decode_tokens, args.speed_rounds,
           args.latency_prompts) < 1:
        raise UsageError("--num-prompts, --probe-tokens, --speed-batch, --speed-decode-tokens, --speed-rounds and "
                         "--latency-prompts must be >= 1")
    if args.latency_tokens < max(2, args.probe_tokens):
        raise UsageError("--latency-tokens must be >= 2 and >= --probe-tokens")
    if not 1 <= args.min_reference_tokens <= args.max_reference_tokens or args.max_prompt_tokens < 1:
        raise UsageError("need 1 <= --min-reference-tokens <= --max-reference-tokens and --max-prompt-tokens >= 1")
    gain_model = None if args.gain_model.lower() == "none" else args.gain_model
    if gain_model is not None:
        _check_gain_model(gain_model)
    if args.threads is not None:
        if args.threads < 1:
            raise UsageError("--threads must be >= 1")
        import torch
        torch.set_num_threads(args.threads)
    caps = WorkloadCaps(args.max_prompt_tokens, args.max_reference_tokens, args.min_reference_tokens)
    options = RoutingOptions(num_prompts=args.num_prompts, small=args.small, large=args.large, dtype=args.dtype,
                             probe_tokens=args.probe_tokens, signal=args.signal, caps=caps, slice_name=args.slice_name,
                             seed=args.seed, speed_batch=args.speed_batch, speed_decode_tokens=args.speed_decode_tokens,
                             speed_rounds=args.speed_rounds,
                             latency_prompts=args.latency_prompts, latency_tokens=args.latency_tokens,
                             gain_model=gain_model)
    try:
        return run_routing_bench(args.json_out, args.report_dir, options)
    except WorkloadError as exc:
        raise UsageError(str(exc)) from None


def _check_gain_model(name: str) -> None:
    """Read before the benchmark loads its models: a misspelt name fails in a moment."""
    from policies.gain_model import BUNDLED_DIR, GainModelError, load_gain_model, resolve_gain_model_path
    try:
        load_gain_model(resolve_gain_model_path(name))
    except GainModelError as exc:
        bundled = ", ".join(sorted(p.stem for p in BUNDLED_DIR.glob("*.json")))
        raise UsageError(f"--gain-model {name!r}: {exc} (bundled: {bundled}; or a path, or 'none')") from None
