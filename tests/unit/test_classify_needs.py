"""Classification sees code and tools: rules on `code` / `tools`, the request's needs (code,
tools, json_schema, long_context) with their reasons, whatever profile wins."""

from __future__ import annotations

import pytest

from policies.classify import Classifier, RequestFeatures
from policies.config import parse_config
from policies.policy_config import ClassificationConfig


def _features(**kw) -> RequestFeatures:
    base = {"endpoint": "chat", "model": "auto", "tenant": "t", "tenant_class": "standard", "stream": False}
    return RequestFeatures(**{**base, **kw})


RULES = [
    {"name": "tooling", "profile": "latency", "when": {"tools": True}},
    {"name": "code", "profile": "memory", "when": {"code": True, "stream": False}},
    {"name": "prose-stream", "profile": "latency", "when": {"code": False, "stream": True}},
]


def _classifier(**kw) -> Classifier:
    return Classifier(ClassificationConfig.model_validate({"rules": RULES, **kw}))


@pytest.mark.parametrize("features,profile,reasons,needs", [
    ({"code": "syntax def"}, "memory",
     ["rule code: stream false, code (syntax def)", "needs code (syntax def)"], {"code"}),
    ({"tools": True, "code": "fenced code"}, "latency",
     ["rule tooling: tools true", "needs code (fenced code), tools"], {"code", "tools"}),
    ({"stream": True}, "latency", ["rule prose-stream: stream true, code false"], set()),
    ({"stream": True, "code": "words python, regex"}, "throughput",
     ["no rule matched: default", "needs code (words python, regex)"], {"code"}),
    ({"json_schema": True}, "throughput", ["no rule matched: default", "needs json_schema"], {"json_schema"}),
])
def test_rules_on_code_and_tools_with_needs(features, profile, reasons, needs):
    verdict = _classifier().classify(_features(**features))
    assert (verdict.profile, verdict.reasons, verdict.needs) == (profile, reasons, frozenset(needs))


def test_long_context_is_a_need_once_the_prompt_is_counted():
    c = _classifier(long_context_tokens=1000)
    assert c.classify(_features(prompt_tokens=999)).needs == frozenset()
    assert c.classify(_features(prompt_tokens=1000)).needs == frozenset({"long_context"})
    assert c.classify(_features(prompt_tokens=None)).needs == frozenset()     # not counted: not known


def test_needs_hold_under_a_profile_hint():
    verdict = _classifier().classify(_features(tools=True), hint="throughput")
    assert verdict.profile == "throughput" and verdict.needs == frozenset({"tools"})
    assert verdict.reasons == ["hint throughput", "needs tools"]


def test_code_signal_runs_only_when_a_rule_reads_it():
    assert _classifier().needs_code_signal
    assert not Classifier(ClassificationConfig.model_validate({"rules": RULES[:1]})).needs_code_signal


@pytest.mark.parametrize("text,needle", [
    ("tiers: {a: {}}\nclassification: {rules: [{profile: memory, when: {code: maybe}}]}\n",
     "classification.rules.0.when.code"),
    ("tiers: {a: {}}\nclassification: {rules: [{profile: memory, when: {tools: 3}}]}\n",
     "classification.rules.0.when.tools"),
    ("tiers: {a: {}}\nclassification: {long_context_tokens: 0}\n", "classification.long_context_tokens"),
])
def test_bad_conditions_name_the_field(text, needle):
    with pytest.raises(Exception, match=needle):
        parse_config(text)
