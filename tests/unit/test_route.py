from pathlib import Path

import pytest

from policies.config import ConfigError, load_config, parse_config
from policies.route import Router, mean_logprob, should_escalate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_router() -> Router:
    cfg = load_config(ROOT / "config" / "default.yaml")
    return Router(cfg.models, cfg.routing.rules)


@pytest.mark.parametrize("profile,chain", [
    ("latency", ("spec-fp8", "small")),
    ("memory", ("large-int4", "small")),
    ("throughput", ("small", "large-int4")),
])
def test_default_config_routes_each_profile(default_router, profile, chain):
    decision = default_router.route("local", "interactive", "smollm2-135m-instruct", profile)
    assert decision.chain == chain and decision.reason == f"route {profile}"


CONFIG = """
tiers: {a: {}, b: {}, c: {}, d: {}}
models:
  m1: {chain: [a, b]}
  m2: {chain: [c], escalate: {to: d, below_mean_logprob: -1.5}}
routing:
  rules:
    - {name: vip, match: {tenant: [acme]}, chain: [d, a]}
    - {name: batch-mem, match: {tenant_class: batch, profile: memory, model: m1}, chain: [b],
       escalate: {to: c, below_mean_logprob: -2}}
"""


def test_rules_match_tenant_class_profile_and_model_else_alias_chain():
    cfg = parse_config(CONFIG)
    router = Router(cfg.models, cfg.routing.rules)
    assert router.route("acme", "batch", "m1", "memory").chain == ("d", "a")            # first match wins
    mem = router.route("other", "batch", "m1", "memory")
    assert mem.chain == ("b",) and mem.escalate.to == "c"
    assert router.route("other", "batch", "m1", "latency").chain == ("a", "b")         # no rule: alias
    assert router.route("other", "batch", "m2", "memory").chain == ("c",)               # rule is for m1
    assert router.route("other", "std", "m2", "latency").escalate.to == "d"
    assert not router.knows("m3")
    with pytest.raises(KeyError):
        router.route("other", "std", "m3", "latency")


def test_escalation_decision():
    cfg = parse_config(CONFIG)
    esc = cfg.models["m2"].escalate
    assert mean_logprob([-1.0, -2.0, -3.0]) == -2.0 and mean_logprob([]) is None
    assert should_escalate(esc, "c", -1.6)
    assert not should_escalate(esc, "c", -1.5)        # strictly below the threshold
    assert not should_escalate(esc, "d", -9.0)        # already on the target tier
    assert not should_escalate(esc, "c", None)        # no logprobs: nothing to judge
    assert not should_escalate(None, "c", -9.0)


@pytest.mark.parametrize("text,needle", [
    ("tiers: {a: {}}\nmodels: {m: {chain: [a, zz]}}\n", "models.m.chain: unknown tier 'zz'"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [b]}]}\n", "routing.rules.0.chain: unknown tier 'b'"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [a], match: {model: nope}}]}\n",
     "routing.rules.0.match.model: unknown model 'nope'"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], escalate: {to: x, below_mean_logprob: -1}}}\n",
     "models.m.escalate.to: unknown tier 'x'"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], escalate: {to: a, below_mean_logprob: 1}}}\n",
     "models.m.escalate.below_mean_logprob"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: []}]}\n", "routing.rules.0.chain"),
])
def test_bad_routing_config_names_the_field(text, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_config(text)
