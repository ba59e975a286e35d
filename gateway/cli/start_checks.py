"""What `serve` needs of this machine beyond a valid file, checked before it starts (and by
`check-config`, which answers whether serve would start here): a server without auth listens on
loopback only; every embedded tier's model (and draft model) can be found, its device exists,
its KV pool holds the engine's minimum of blocks, and the KV pools of all embedded tiers fit in
this machine's memory. A tier that failed these would otherwise load in the background and stay
"failed" behind a server that never becomes ready."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.cli.usage_error import UsageError
from policies.config import GatewayConfig, is_loopback
from policies.tier_config import EmbeddedTierConfig


def check_can_start(cfg: GatewayConfig, source: str, host: str | None = None) -> None:
    """UsageError naming `source` (the config file) and the field. `host`: the --host given on
    the command line, which replaces server.host."""
    check_auth_off_on_loopback(cfg, source, host)
    memory = physical_memory_bytes()
    kv_total = 0
    for name, tier in cfg.tiers.items():
        if not isinstance(tier, EmbeddedTierConfig):
            continue
        check_tier_can_start(name, tier, source)
        # Each engine process holds a pool of its own.
        kv_total += int(tier.kv_cache_memory) * max(1, tier.engine_processes)
        if memory is not None and kv_total > memory:
            raise UsageError(f"{source}: tiers.{name}.kv_cache_memory: the embedded tiers' KV pools come to "
                             f"{kv_total / 2**30:.1f} GiB with this one, more than this machine's "
                             f"{memory / 2**30:.1f} GiB of memory")


def check_auth_off_on_loopback(cfg: GatewayConfig, source: str, host: str | None = None) -> None:
    """Without API keys anyone who reaches the port is served: only this machine may."""
    listen = cfg.server.host if host is None else host
    if not cfg.auth.enabled and not is_loopback(listen):
        where = "--host" if host is not None else "server.host"
        raise UsageError(f"{source}: auth.enabled is false: serving without API keys is allowed on loopback only, "
                         f"not on {where} {listen}")


def check_tier_can_start(name: str, tier: EmbeddedTierConfig, source: str) -> None:
    """One embedded tier's model, device, draft model and KV pool (`generate` runs one tier)."""
    from engines.errors import ModelLoadError
    from engines.loaded_model import resolve_device
    from engines.loaders.bundled_models import bundled_model
    from gateway.cli.kv_fit import smallest_pool

    if bundled_model(tier.model) is None:
        problem = model_path_problem(Path(tier.model).expanduser())
        if problem:
            raise UsageError(f"{source}: tiers.{name}.model: {problem}: {tier.model}")
    spec = tier.speculative
    if spec is not None and spec.draft_model and bundled_model(spec.draft_model) is None:
        problem = model_path_problem(Path(spec.draft_model).expanduser())
        if problem:
            raise UsageError(f"{source}: tiers.{name}.speculative.draft_model: {problem}: {spec.draft_model}")
    try:
        resolve_device(tier.device)
    except ModelLoadError as exc:
        raise UsageError(f"{source}: tiers.{name}.device: {exc}") from None
    need = smallest_pool(tier)
    if need is not None and int(tier.kv_cache_memory) < need.bytes:
        raise UsageError(f"{source}: tiers.{name}.kv_cache_memory: {int(tier.kv_cache_memory)} bytes is below the "
                         f"engine's minimum of {need.bytes} bytes ({_mib(need.bytes)}) for this model: "
                         f"{need.why}")


def _mib(size: int) -> str:
    return f"{size / 2**20:.2f} MiB"


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
