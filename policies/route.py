"""Choose the tiers that may answer a request: (tenant, model alias, profile, needs, rules) -> an
ordered fallback chain, plus the cascade that may hand the request to a larger tier.

A routed alias (`auto`) goes through the routing rules; a pinned alias (a concrete model a client
names on purpose) always walks its own chain. Pure decisions: whether a tier is loaded or
healthy is the gateway's business; it walks the chain (gateway/chain_walk.py) and records each
tier it passes over as a typed skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.cascade import CascadeConfig
from policies.policy_config import ModelAliasConfig, RouteRule

_NO_NEEDS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RouteDecision:
    chain: tuple[str, ...]
    cascade: CascadeConfig | None
    reason: str


def _values(value) -> frozenset | None:
    if value is None:
        return None
    return frozenset(value if isinstance(value, list) else [value])


@dataclass(frozen=True, slots=True)
class _CompiledRoute:
    label: str
    tenants: frozenset | None
    tenant_classes: frozenset | None
    models: frozenset | None
    profiles: frozenset | None
    needs: frozenset | None           # all of them must be among the request's
    chain: tuple[str, ...]
    cascade: CascadeConfig | None

    def matches(self, tenant: str, tenant_class: str, model: str, profile: str, needs: frozenset[str]) -> bool:
        return ((self.tenants is None or tenant in self.tenants)
                and (self.tenant_classes is None or tenant_class in self.tenant_classes)
                and (self.models is None or model in self.models)
                and (self.profiles is None or profile in self.profiles)
                and (self.needs is None or self.needs <= needs))

    def explain(self) -> str:
        return f"{self.label}: needs {', '.join(sorted(self.needs))}" if self.needs else self.label


class Router:
    def __init__(self, models: dict[str, ModelAliasConfig], rules: Sequence[RouteRule]):
        self._models = dict(models)
        self._rules = [
            _CompiledRoute(f"route {r.name or i}", _values(r.match.tenant), _values(r.match.tenant_class),
                           _values(r.match.model), _values(r.match.profile), _values(r.match.needs),
                           tuple(r.chain), r.cascade)
            for i, r in enumerate(rules)
        ]
        # The code and language detectors run only when some rule looks at their verdicts.
        self.needs_code_signal = any(r.needs is not None and "code" in r.needs for r in self._rules)
        self.needs_language_signal = any(r.needs is not None and "non_english" in r.needs for r in self._rules)

    def knows(self, model: str) -> bool:
        return model in self._models

    def pinned(self, model: str) -> bool:
        return self._models[model].pinned

    def route(self, tenant: str, tenant_class: str, model: str, profile: str,
              needs: frozenset[str] = _NO_NEEDS) -> RouteDecision:
        """A pinned alias's own chain; else the first matching rule's chain, else the alias's own
        chain. KeyError: unknown model."""
        alias = self._models[model]
        if alias.pinned:
            return RouteDecision(tuple(alias.chain), alias.cascade, f"model {model} pinned")
        for rule in self._rules:
            if rule.matches(tenant, tenant_class, model, profile, needs):
                return RouteDecision(rule.chain, rule.cascade, rule.explain())
        return RouteDecision(tuple(alias.chain), alias.cascade, f"model {model} chain")
