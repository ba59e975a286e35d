"""Everything derived from one config: compiled rules, the key table, the tier objects.

A request reads `holder.current` once and keeps that snapshot to the end, so a hot reload
(one reference assignment) never mixes two configs inside a request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from engines.quantization.calibration import CalibrationSource
from gateway.auth import KeyTable
from gateway.limits import GatewayLimits
from gateway.tiers.base import Tier
from gateway.tiers.core_sharing import CoreSharing
from gateway.tiers.embedded import EmbeddedTier
from gateway.tiers.upstream import UpstreamTier
from policies.classify import Classifier
from policies.config import GatewayConfig, TenantConfig
from policies.route import Router
from policies.tier_config import EmbeddedTierConfig


def make_tier(name: str, config, calibration: CalibrationSource | None = None) -> Tier:
    if isinstance(config, EmbeddedTierConfig):
        return EmbeddedTier(name, config, calibration)
    return UpstreamTier(name, config)


def same_tier_config(a, b) -> bool:
    """Whether a tier can be kept across a reload (its served name may change freely)."""
    if type(a) is not type(b):
        return False
    # Neither the served name nor the capabilities (what routing may send it) touch the engine.
    keep = {"served_name", "capabilities"}
    return a.model_dump(exclude=keep) == b.model_dump(exclude=keep)


@dataclass
class Runtime:
    config: GatewayConfig
    tiers: dict[str, Tier]
    classifier: Classifier = field(init=False)
    router: Router = field(init=False)
    keys: KeyTable = field(init=False)
    # Per model alias: the embedded tiers of its chain, whose tokenizer can count prompt tokens.
    counters: dict[str, list[str]] = field(init=False)
    # Whether some upstream tier of an alias checks context length itself (needs an estimate).
    estimates: dict[str, bool] = field(init=False)
    max_body_bytes: int = field(init=False)
    # Whether some rule reads the code detector's verdict (it runs only then).
    wants_code_signal: bool = field(init=False)
    wants_language_signal: bool = field(init=False)
    # Budgets, breakers and retry budget: set by the holder when the app starts and
    # carried over (or reconfigured) on each reload; see gateway/limits.py.
    limits: GatewayLimits | None = field(default=None, init=False)
    core_sharing: CoreSharing = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        self.core_sharing = CoreSharing(self.tiers.values())
        self.classifier = Classifier(cfg.classification)
        self.router = Router(cfg.models, cfg.routing.rules)
        self.keys = KeyTable(cfg.auth)
        self.wants_code_signal = self.classifier.needs_code_signal or self.router.needs_code_signal
        self.wants_language_signal = self.router.needs_language_signal
        self.max_body_bytes = int(cfg.server.max_body_bytes)
        self.counters, self.estimates = {}, {}
        for alias, model in cfg.models.items():
            reachable = list(model.chain)
            cascades = [model.cascade]
            for rule in [] if model.pinned else cfg.routing.rules:
                if rule.match.model is None or alias in (rule.match.model if isinstance(rule.match.model, list)
                                                         else [rule.match.model]):
                    reachable += [t for t in rule.chain if t not in reachable]
                    cascades.append(rule.cascade)
            reachable += [c.to for c in cascades if c is not None and c.to not in reachable]
            self.counters[alias] = [t for t in reachable if isinstance(self.tiers[t], EmbeddedTier)]
            self.estimates[alias] = any(isinstance(self.tiers[t], UpstreamTier) and self.tiers[t].context_length
                                        for t in reachable)

    def tenant(self, name: str) -> TenantConfig:
        return self.config.tenants[name]

    def unusable_reason(self, tier_name: str) -> str | None:
        """Why the tier cannot take calls now (still loading, failed to load); None when it can."""
        return self.tiers[tier_name].unusable_reason()

    def models_for(self, tenant: TenantConfig) -> list[str]:
        allowed = tenant.models
        return [m for m in self.config.models if allowed is None or m in allowed]

    @property
    def ready(self) -> bool:
        return all(t.ready for t in self.tiers.values())


class RuntimeHolder:
    def __init__(self, runtime: Runtime, config_path: str | None = None,
                 calibration: CalibrationSource | None = None):
        self.current = runtime
        self.config_path = config_path
        self.calibration = calibration     # for the tiers a reload builds
        self.generation = 1
        self._retiring: set[asyncio.Task] = set()
        self._retired: list[GatewayLimits] = []    # replaced by a reload, closed when idle

    def open_limits(self) -> GatewayLimits:
        """Build the current config's limits (once; the app does it at start, in its event loop)."""
        if self.current.limits is None:
            self.current.limits = GatewayLimits.open(self.current.config.limits)
        return self.current.limits

    def swap(self, runtime: Runtime) -> None:
        old = self.current.limits
        if old is not None and runtime.limits is None:
            runtime.limits = old.reconfigured(runtime.config.limits)
            if runtime.limits is not old:     # its requests in flight finish first
                self._retired.append(old)
                task = asyncio.get_running_loop().create_task(self._retire(old))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
        if runtime is not self.current:
            self.current.core_sharing.detach()
        self.current = runtime
        self.generation += 1

    async def _retire(self, limits: GatewayLimits) -> None:
        # Reservations expire after reservation_ttl_s anyway: no need to wait longer than that.
        await limits.retire(limits.config.store.reservation_ttl_s)
        self._retired.remove(limits)

    async def close_limits(self) -> None:
        """Shutdown: reconciliations still queued are applied (within a timeout), stores closed."""
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for limits in [*self._retired, self.current.limits]:   # close() is idempotent
            if limits is not None:
                await limits.close()
        self._retired.clear()


def build_runtime(config: GatewayConfig, reuse: dict[str, Tier] | None = None,
                  calibration: CalibrationSource | None = None) -> Runtime:
    """`calibration`: the text AWQ/GPTQ tiers calibrate on when their artifact is not cached yet."""
    reuse = reuse or {}
    tiers = {}
    for name, tier_cfg in config.tiers.items():
        prev = reuse.get(name)
        if prev is not None and same_tier_config(prev.config, tier_cfg):
            prev.config = tier_cfg
            tiers[name] = prev
        else:
            tiers[name] = make_tier(name, tier_cfg, calibration)
    return Runtime(config, tiers)
