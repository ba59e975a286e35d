"""Implementations of the CLI's serve, generate and check-config commands."""

from __future__ import annotations

import argparse
import sys

from engines.loaded_model import load_model
from engines.simple_generate import SimpleSampling, generate_tokens
from policies.config import load_config


def check_config(path: str) -> int:
    cfg = load_config(path)
    print(f"{path}: ok ({len(cfg.tiers)} tiers, default {cfg.default_tier!r})")
    return 0


def generate(args: argparse.Namespace) -> int:
    from gateway.cli import UsageError

    cfg = load_config(args.config)
    tier_name = args.tier or cfg.default_tier
    if tier_name not in cfg.tiers:
        raise UsageError(f"no tier {tier_name!r} in {args.config}; tiers: {sorted(cfg.tiers)}")
    if args.max_tokens < 1:
        raise UsageError("--max-tokens must be at least 1")
    if args.temperature < 0:
        raise UsageError("--temperature must be >= 0")
    tier = cfg.tiers[tier_name]
    loaded = load_model(args.model or tier.model, args.dtype or tier.dtype)
    prompt_ids = loaded.tokenizer.encode(loaded.chat_template.render([{"role": "user", "content": args.prompt}]))
    sampling = SimpleSampling(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    eos = loaded.tokenizer.eos_token_ids
    out: list[int] = []
    printed = ""
    for token in generate_tokens(loaded.model, prompt_ids, sampling, eos):
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


def serve(config_path: str, host: str | None, port: int | None) -> int:
    import logging

    import uvicorn

    from engines.async_engine import AsyncEngine
    from engines.engine_config import EngineConfig
    from engines.llm_engine import LLMEngine
    from gateway.minimal_app import build_app

    logging.getLogger("engines").setLevel(logging.INFO)  # model load and KV capacity at start
    cfg = load_config(config_path)
    tier_name = cfg.default_tier
    tier = cfg.tiers[tier_name]
    source = tier.model
    if tier.quantization:
        from gateway.quantize_cmd import ensure_quantized
        source = str(ensure_quantized(tier.model, tier.quantization, tier.quant_group_size))
    loaded = load_model(source, tier.dtype)
    engine = LLMEngine(loaded, EngineConfig(
        kv_cache_memory_bytes=int(tier.kv_cache_memory), block_size=tier.block_size,
        max_num_seqs=tier.max_num_seqs, max_num_batched_tokens=tier.max_num_batched_tokens,
        max_model_len=tier.max_model_len, enable_prefix_caching=tier.enable_prefix_caching,
        kv_cache_dtype=tier.kv_cache_dtype))
    app = build_app(AsyncEngine(engine), tier.served_name or tier_name)
    uvicorn.run(app, host=host or cfg.server.host, port=port if port is not None else cfg.server.port,
                log_level="info")
    return 0
