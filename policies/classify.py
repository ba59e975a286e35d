"""Classify a request as latency-, throughput- or memory-bound, with the reasons why, and name
what it needs of the tier that answers it (code, tools, long context, ...; policies/needs.py).

Rules are compiled once per config into small predicate closures, so classifying a request
is a handful of comparisons. Pure: no I/O, no engine, no HTTP.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.policy_config import PROFILES, ClassificationConfig, ClassifyRule, NumberCondition

EMPTY_NEEDS: frozenset[str] = frozenset()


@dataclass(slots=True)
class RequestFeatures:
    endpoint: str                  # "chat" | "completions"
    model: str                     # the model alias asked for
    tenant: str
    tenant_class: str
    stream: bool
    n: int = 1
    max_tokens: int | None = None  # None: the client left it to the context length
    prompt_tokens: int | None = None
    code: str | None = None        # why the prompt looks like code (policies/request_signals.py); None: it does not
    language: str | None = None    # why it looks not English (policies/language_signal.py); None: English or unknown
    tools: bool = False            # the request carries tools
    json_schema: bool = False      # the request asks for structured output (response_format json)
    logprobs: bool = False         # the request asks for token logprobs
    predicted_gain: float | None = None  # the gain model's prediction (bits per byte); None: no model


@dataclass(slots=True)
class Classification:
    profile: str
    source: str                    # "hint" | "rule" | "default"
    reasons: list[str] = field(default_factory=list)
    needs: frozenset[str] = EMPTY_NEEDS   # of policies.needs.NEEDS


# A check returns None when it fails, else a short text saying why it held.
Check = Callable[[RequestFeatures], "str | None"]

_BOUNDS = (("gt", operator.gt, ">"), ("gte", operator.ge, ">="), ("lt", operator.lt, "<"), ("lte", operator.le, "<="))


def _number_check(name: str, cond: NumberCondition) -> Check:
    bounds = [(getattr(cond, key), op, sym) for key, op, sym in _BOUNDS if getattr(cond, key) is not None]
    text = " and ".join(f"{sym} {_num(v)}" for v, _, sym in bounds)

    def check(f: RequestFeatures) -> str | None:
        value = getattr(f, name)
        if value is None:
            return None
        for bound, op, _ in bounds:
            if not op(value, bound):
                return None
        return f"{name} {value} {text}"
    return check


def _choice_check(name: str, allowed) -> Check:
    values = frozenset(allowed if isinstance(allowed, list) else [allowed])

    def check(f: RequestFeatures) -> str | None:
        value = getattr(f, name)
        return f"{name} {value}" if value in values else None
    return check


def _bool_check(name: str, expected: bool) -> Check:
    def check(f: RequestFeatures) -> str | None:
        return f"{name} {str(expected).lower()}" if getattr(f, name) is expected else None
    return check


def _code_check(expected: bool) -> Check:
    def check(f: RequestFeatures) -> str | None:
        if (f.code is not None) is not expected:
            return None
        return f"code ({f.code})" if expected else "code false"
    return check


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


@dataclass(slots=True)
class _CompiledRule:
    label: str
    profile: str
    checks: list[Check]

    def match(self, f: RequestFeatures) -> list[str] | None:
        why = []
        for check in self.checks:
            held = check(f)
            if held is None:
                return None
            why.append(held)
        return why


def _compile(index: int, rule: ClassifyRule) -> _CompiledRule:
    checks: list[Check] = []
    when = rule.when
    for name in ("prompt_tokens", "max_tokens", "n"):
        cond = getattr(when, name)
        if cond is not None:
            checks.append(_number_check(name, cond))
    for name in ("stream", "tools"):
        value = getattr(when, name)
        if value is not None:
            checks.append(_bool_check(name, value))
    if when.code is not None:
        checks.append(_code_check(when.code))
    for name in ("endpoint", "tenant", "tenant_class", "model"):
        value = getattr(when, name)
        if value is not None:
            checks.append(_choice_check(name, value))
    return _CompiledRule(f"rule {rule.name or index}", rule.profile, checks)


class Classifier:
    def __init__(self, config: ClassificationConfig):
        self.default_profile = config.default_profile
        self.honour_hint = config.honour_hint
        self.long_context_tokens = config.long_context_tokens
        self._rules = [_compile(i, r) for i, r in enumerate(config.rules)]
        # Counting prompt tokens costs a tokenization: do it only when a rule looks at it.
        self.needs_prompt_tokens = any(r.when.prompt_tokens is not None for r in config.rules)
        # Likewise the code detector (cheap, but not free on a long prompt).
        self.needs_code_signal = any(r.when.code is not None for r in config.rules)
        self.gain_model = config.gain_model.model if config.gain_model is not None else None
        # A model that reads the prefill judges in the cascade, after the small tier's prefill.
        self.gain_threshold = (config.gain_model.threshold if config.gain_model is not None
                               and not config.gain_model.model.reads_prefill else None)

    def predict_gain(self, text: str, code: str | None) -> float | None:
        """The learned router's predicted gain of the large tier for this prompt text (`code`: its
        code_signal verdict), or None when the config has no gain model. For a model that reads
        the prefill, the text's part: the cascade adds the rest."""
        return None if self.gain_model is None else self.gain_model.predict(text, code)

    def needs_of(self, features: RequestFeatures) -> frozenset[str]:
        needs = []
        if features.code is not None:
            needs.append("code")
        if features.language is not None:
            needs.append("non_english")
        if (features.predicted_gain is not None and self.gain_threshold is not None
                and features.predicted_gain >= self.gain_threshold):
            needs.append("large_gain")
        if features.tools:
            needs.append("tools")
        if features.json_schema:
            needs.append("json_schema")
        if features.logprobs:
            needs.append("logprobs")
        if features.prompt_tokens is not None and features.prompt_tokens >= self.long_context_tokens:
            needs.append("long_context")
        return frozenset(needs) if needs else EMPTY_NEEDS

    def classify(self, features: RequestFeatures, hint: str | None = None,
                 hint_allowed: bool = True) -> Classification:
        """`hint` is the x-tiergate-profile header, already checked to name a profile. The
        needs do not depend on the profile: a hint changes how a request is served, not what
        it asks for."""
        needs = self.needs_of(features)
        ignored = None
        if hint is not None:
            if hint not in PROFILES:
                raise ValueError(f"unknown profile {hint!r}")
            if self.honour_hint and hint_allowed:
                return Classification(hint, "hint", _with_needs([f"hint {hint}"], needs, features), needs)
            ignored = "hint ignored (not allowed for this tenant)" if self.honour_hint else "hint ignored (off)"
        for rule in self._rules:
            why = rule.match(features)
            if why is not None:
                reasons = [f"{rule.label}: {', '.join(why)}" if why else rule.label]
                reasons = [ignored, *reasons] if ignored else reasons
                return Classification(rule.profile, "rule", _with_needs(reasons, needs, features), needs)
        reasons = ["no rule matched: default"]
        reasons = [ignored, *reasons] if ignored else reasons
        return Classification(self.default_profile, "default", _with_needs(reasons, needs, features), needs)


def _with_needs(reasons: list[str], needs: frozenset[str], features: RequestFeatures) -> list[str]:
    if not needs:
        return reasons
    detail = {"code": features.code, "non_english": features.language,
              "large_gain": None if features.predicted_gain is None else f"predicted {features.predicted_gain:+.3f} bpb"}
    named = [f"{n} ({detail[n]})" if detail.get(n) else n for n in sorted(needs)]
    return [*reasons, "needs " + ", ".join(named)]
