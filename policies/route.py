"""Choose the tiers that may answer a request: (tenant, model alias, profile, rules) -> an
ordered fallback chain, plus the escalation rule for non-streaming answers.

Pure decisions: whether a tier is loaded or healthy is the gateway's business; it walks the
chain (gateway/chain_walk.py) and records each tier it passes over as a typed skip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.policy_config import EscalationConfig, ModelAliasConfig, RouteRule


@dataclass(frozen=True, slots=True)
class RouteDecision:
    chain: tuple[str, ...]
    escalate: EscalationConfig | None
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
    chain: tuple[str, ...]
    escalate: EscalationConfig | None

    def matches(self, tenant: str, tenant_class: str, model: str, profile: str) -> bool:
        return ((self.tenants is None or tenant in self.tenants)
                and (self.tenant_classes is None or tenant_class in self.tenant_classes)
                and (self.models is None or model in self.models)
                and (self.profiles is None or profile in self.profiles))


class Router:
    def __init__(self, models: dict[str, ModelAliasConfig], rules: Sequence[RouteRule]):
        self._models = dict(models)
        self._rules = [
            _CompiledRoute(f"route {r.name or i}", _values(r.match.tenant), _values(r.match.tenant_class),
                           _values(r.match.model), _values(r.match.profile), tuple(r.chain), r.escalate)
            for i, r in enumerate(rules)
        ]

    def knows(self, model: str) -> bool:
        return model in self._models

    def route(self, tenant: str, tenant_class: str, model: str, profile: str) -> RouteDecision:
        """The first matching rule's chain, else the model alias's own chain. KeyError: unknown model."""
        alias = self._models[model]
        for rule in self._rules:
            if rule.matches(tenant, tenant_class, model, profile):
                return RouteDecision(rule.chain, rule.escalate, rule.label)
        return RouteDecision(tuple(alias.chain), alias.escalate, f"model {model} chain")


def mean_logprob(logprobs: Sequence[float]) -> float | None:
    return sum(logprobs) / len(logprobs) if logprobs else None


def should_escalate(escalation: EscalationConfig | None, answered_by: str, mean: float | None) -> bool:
    """Escalate when a rule asks for it, the answer came from another tier than the target,
    and its mean token logprob is below the threshold."""
    if escalation is None or mean is None or answered_by == escalation.to:
        return False
    return mean < escalation.below_mean_logprob
