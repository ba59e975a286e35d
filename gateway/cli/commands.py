"""Implementations of the CLI's serve, generate and check-config commands."""

from __future__ import annotations

import argparse
import logging
import sys

from engines.loaded_model import load_model
from engines.sampling_params import InvalidRequestError
from engines.simple_generate import SimpleSampling, generate_tokens
from policies.config import load_config


def check_config(path: str) -> int:
    from gateway.cli.start_checks import check_can_start

    cfg = load_config(path)
    check_can_start(cfg, path)
    print(f"{path}: ok ({len(cfg.tiers)} tiers, default {cfg.default_tier!r})")
    return 0


def generate(args: argparse.Namespace) -> int:
    from gateway.cli.usage_error import UsageError

    cfg = load_config(args.config)
    tier_name = args.tier or cfg.default_tier
    if tier_name not in cfg.tiers:
        raise UsageError(f"no tier {tier_name!r} in {args.config}; tiers: {sorted(cfg.tiers)}")
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    if args.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    tier = cfg.tiers[tier_name]
    if tier.kind != "embedded":
        raise UsageError(f"tier {tier_name!r} is an upstream tier; generate runs embedded tiers only")
    if args.model is None:
        from gateway.cli.start_checks import check_tier_can_start

        settings = tier if args.dtype is None else tier.model_copy(update={"dtype": args.dtype})
        check_tier_can_start(tier_name, settings, args.config)
        return _generate_on_tier(tier_name, settings, args)
    # A model named on the command line runs as given, token by token on a contiguous cache: the
    # tier's quantization and engine settings are not applied.
    dtype = args.dtype or tier.dtype
    if dtype == "auto":
        from gateway.tiers.embedded_load import measured_dtype
        dtype = measured_dtype(tier_name, tier.model_copy(update={"quantization": None}), args.model, logging.INFO)
    loaded = load_model(args.model, dtype, device=tier.device)
    prompt_ids = _chat_ids(loaded, args.prompt)
    sampling = SimpleSampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    eos = loaded.tokenizer.eos_token_ids
    out: list[int] = []
    printed = ""
    try:
        tokens = generate_tokens(loaded.model, prompt_ids, sampling, eos)
    except InvalidRequestError as exc:
        raise UsageError(str(exc)) from None
    for token in tokens:
        if token in eos:
            break
        out.append(token)
        text = loaded.tokenizer.decode(out)
        # Print only whole characters: a byte-level token may end inside a UTF-8 sequence.
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(printed):])
            sys.stdout.flush()
            printed = text
    sys.stdout.write(loaded.tokenizer.decode(out)[len(printed):] + "\n")
    return 0


def _chat_ids(loaded, prompt: str) -> list[int]:
    return loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": prompt}]))


def _generate_on_tier(name: str, settings, args: argparse.Namespace) -> int:
    """The tier's own engine, as `serve` builds it: its weights (quantization, dense prefill,
    dtype), KV dtype, speculative decoding and scheduler settings, so that the answer is the one
    the served tier gives a lone request."""
    from engines.sampling_params import SamplingParams
    from gateway.cli.usage_error import UsageError
    from gateway.tiers.embedded_load import engine_on, load_tier_model

    loaded, notes = load_tier_model(name, settings, log_level=logging.INFO)
    try:
        engine = engine_on(name, settings, loaded, notes)
    except ValueError as exc:
        # The engine refuses settings it cannot run (a KV pool too small for the model as
        # loaded): the tier's configuration, to fix there.
        raise UsageError(f"tier {name!r} cannot start its engine: {exc}") from None
    try:
        try:
            engine.add_request("generate", _chat_ids(loaded, args.prompt),
                               SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                              seed=args.seed))
        except InvalidRequestError as exc:
            raise UsageError(str(exc)) from None
        while engine.has_unfinished():
            for out in engine.step():
                sys.stdout.write(out.text)
                sys.stdout.flush()
    finally:
        engine.shutdown()
    sys.stdout.write("\n")
    return 0


def serve(config_path: str, host: str | None, port: int | None) -> int:
    import logging

    import uvicorn

    from gateway.app import build_app
    from gateway.reload import ConfigReloader
    from gateway.cli.calibration import calibration_source
    from gateway.runtime import RuntimeHolder, build_runtime
    from gateway.cli.listen_check import check_can_listen
    from gateway.cli.start_checks import check_can_start
    from gateway.cli.usage_error import UsageError

    if host is not None and not host.strip():
        raise UsageError("--host is empty; give an address such as 127.0.0.1")
    cfg = load_config(config_path)
    check_can_start(cfg, config_path, host)
    # Options given replace the config's fields; an error names whichever set the value.
    host_flag = "--host" if host is not None else f"{config_path}: server.host"
    port_flag = "--port" if port is not None else f"{config_path}: server.port"
    host = host if host is not None else cfg.server.host
    port = port if port is not None else cfg.server.port
    check_can_listen(host, port, host_flag, port_flag)
    # Model loads, tier readiness and per-request decisions are worth seeing at start.
    for name in ("engines", "gateway", "tiergate.requests"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger("tiergate.requests").disabled = not cfg.server.log_requests
    # Background threads (the span exporter encoding a batch, engine steps) hold the GIL in
    # slices of this length; at Python's 5 ms each export showed up as a 10-15 ms p99.
    sys.setswitchinterval(cfg.server.gil_switch_interval_ms / 1000)
    calibration = calibration_source()
    holder = RuntimeHolder(build_runtime(cfg, calibration=calibration), config_path, calibration)
    app = build_app(holder, ConfigReloader(holder, config_path, host))
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False,
                timeout_graceful_shutdown=cfg.server.shutdown_grace_s)
    return 0
