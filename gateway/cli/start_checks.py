"""What `serve` needs of this machine beyond a valid file, checked before it starts (and by
`check-config`, which answers whether serve would start here): every embedded tier's model can be
found, and the KV pools the embedded tiers allocate fit in this machine's memory. A tier that
failed these would otherwise load in the background and stay "failed" behind a server that never
becomes ready."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.cli.usage_error import UsageError
from policies.config import GatewayConfig
from policies.tier_config import EmbeddedTierConfig


def check_can_start(cfg: GatewayConfig, source: str) -> None:
    """UsageError naming `source` (the config file) and the field."""
    from engines.loaders.bundled_models import bundled_model

    memory = physical_memory_bytes()
    kv_total = 0
    for name, tier in cfg.tiers.items():
        if not isinstance(tier, EmbeddedTierConfig):
            continue
        if bundled_model(tier.model) is None:
            problem = model_path_problem(Path(tier.model).expanduser())
            if problem:
                raise UsageError(f"{source}: tiers.{name}.model: {problem}: {tier.model}")
        # Each engine process holds a pool of its own.
        kv_total += int(tier.kv_cache_memory) * max(1, tier.engine_processes)
        if memory is not None and kv_total > memory:
            raise UsageError(f"{source}: tiers.{name}.kv_cache_memory: the embedded tiers' KV pools come to "
                             f"{kv_total / 2**30:.1f} GiB with this one, more than this machine's "
                             f"{memory / 2**30:.1f} GiB of memory")


def model_path_problem(path: Path) -> str | None:
    """Why `path` is not a model the loaders read (a GGUF file, or an HF checkpoint directory)."""
    if not path.exists():
        return "model path not found"
    if path.is_dir():
        return None if (path / "config.json").is_file() else "no config.json in the model directory"
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"cannot read the model file ({exc.strerror})"
    return None if magic == b"GGUF" else "not a GGUF file"


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):     # not a POSIX system that reports it
        return None
