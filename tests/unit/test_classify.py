from pathlib import Path

import pytest

from policies.classify import Classifier, RequestFeatures
from policies.config import load_config, parse_config
from policies.policy_config import ClassificationConfig

ROOT = Path(__file__).resolve().parents[2]


def _features(**kw) -> RequestFeatures:
    base = {"endpoint": "chat", "model": "m", "tenant": "t", "tenant_class": "standard", "stream": False, "n": 1,
                "max_tokens": None, "prompt_tokens": None}
    base.update(kw)
    return RequestFeatures(**base)


def _classifier(rules, **kw) -> Classifier:
    return Classifier(ClassificationConfig.model_validate({"rules": rules, **kw}))


RULES = [
    {"name": "long", "profile": "memory", "when": {"prompt_tokens": {"gte": 1000}}},
    {"name": "chatty", "profile": "latency", "when": {"stream": True, "max_tokens": {"lt": 100},
                                                      "tenant_class": ["interactive", "premium"]}},
    {"profile": "latency", "when": {"endpoint": "completions", "n": {"gt": 1, "lte": 4}}},
]


@pytest.mark.parametrize("features,profile,reason", [
    ({"prompt_tokens": 1000}, "memory", "rule long: prompt_tokens 1000 >= 1000"),
    ({"prompt_tokens": 999}, "throughput", "no rule matched: default"),
    ({"prompt_tokens": 5000, "stream": True, "max_tokens": 10, "tenant_class": "premium"}, "memory",
     "rule long: prompt_tokens 5000 >= 1000"),                                      # first match wins
    ({"stream": True, "max_tokens": 10, "tenant_class": "premium"}, "latency",
     "rule chatty: max_tokens 10 < 100, stream true, tenant_class premium"),
    ({"stream": True, "max_tokens": 100, "tenant_class": "premium"}, "throughput", "no rule matched: default"),
    ({"stream": True, "max_tokens": None, "tenant_class": "premium"}, "throughput", "no rule matched: default"),
    ({"stream": True, "max_tokens": 10, "tenant_class": "batch"}, "throughput", "no rule matched: default"),
    ({"endpoint": "completions", "n": 3}, "latency", "rule 2: n 3 > 1 and <= 4, endpoint completions"),
    ({"endpoint": "completions", "n": 5}, "throughput", "no rule matched: default"),
])
def test_rules_first_match_with_reasons(features, profile, reason):
    verdict = _classifier(RULES, long_context_tokens=10**6).classify(_features(**features))   # no needs here
    assert verdict.profile == profile
    assert verdict.reasons == [reason]
    assert verdict.source == ("default" if reason.startswith("no rule") else "rule")


def test_hint_wins_when_allowed_and_is_ignored_otherwise():
    c = _classifier(RULES)
    long_prompt = _features(prompt_tokens=2000)
    assert c.classify(long_prompt, "latency").profile == "latency"
    verdict = c.classify(long_prompt, "latency", hint_allowed=False)
    assert verdict.profile == "memory" and verdict.reasons[0] == "hint ignored (not allowed for this tenant)"
    off = _classifier(RULES, honour_hint=False).classify(_features(), "memory")
    assert off.profile == "throughput" and off.reasons[0] == "hint ignored (off)"
    with pytest.raises(ValueError):
        c.classify(_features(), "turbo")


def test_default_profile_and_prompt_token_need():
    assert _classifier([], default_profile="latency").classify(_features()).profile == "latency"
    assert _classifier(RULES).needs_prompt_tokens
    assert not _classifier(RULES[1:]).needs_prompt_tokens


def test_rule_needs_a_bound():
    with pytest.raises(Exception, match="at least one of gt, gte, lt, lte"):
        ClassificationConfig.model_validate({"rules": [{"profile": "memory", "when": {"prompt_tokens": {}}}]})


def test_default_config_classifies_streams_as_latency_and_long_prompts_as_memory():
    c = Classifier(load_config(ROOT / "config" / "default.yaml").classification)
    base = {"model": "smollm2-135m-instruct", "tenant": "local", "tenant_class": "interactive"}
    assert c.classify(_features(stream=True, max_tokens=64, prompt_tokens=40, **base)).profile == "latency"
    assert c.classify(_features(stream=True, max_tokens=64, prompt_tokens=1500, **base)).profile == "memory"
    assert c.classify(_features(stream=False, max_tokens=64, prompt_tokens=40, **base)).profile == "throughput"


def test_unknown_profile_in_rule_names_the_field():
    with pytest.raises(Exception, match="classification.rules.0.profile"):
        parse_config("tiers: {a: {}}\nclassification: {rules: [{profile: fast, when: {stream: true}}]}\n")
