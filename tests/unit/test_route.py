from pathlib import Path

import pytest

from policies.config import ConfigError, load_config, parse_config
from policies.route import Router

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_router() -> Router:
    cfg = load_config(ROOT / "config" / "default.yaml")
    return Router(cfg.models, cfg.routing.rules)


@pytest.mark.parametrize("profile,chain", [
    ("latency", ("fast", "small")),
    ("memory", ("large", "small")),
    ("throughput", ("small", "large")),
])
def test_default_config_routes_each_profile(default_router, profile, chain):
    decision = default_router.route("local", "interactive", "auto", profile)
    assert decision.chain == chain and decision.reason == f"route {profile}"


def test_default_config_cascades_on_predicted_gain_and_pins_the_concrete_model(default_router):
    for profile in ("latency", "throughput"):
        decision = default_router.route("local", "interactive", "auto", profile, frozenset({"code"}))
        # the detectors' verdicts alone are features of the learned router, not rules of the default
        assert decision.reason == f"route {profile}"
        assert (decision.cascade.to, decision.cascade.signal, decision.cascade.tokens) == ("large", "predicted_gain", 1)
    assert default_router.route("local", "interactive", "auto", "memory").cascade is None
    tools = default_router.route("local", "interactive", "auto", "throughput", frozenset({"tools"}))
    assert tools.chain == ("large", "small") and tools.reason == "route tools: needs tools"
    pinned = default_router.route("local", "interactive", "smollm2-135m-instruct", "latency", frozenset({"code"}))
    assert pinned.chain == ("small", "fast") and pinned.reason == "model smollm2-135m-instruct pinned"
    coder = default_router.route("local", "interactive", "qwen2.5-coder-0.5b-instruct", "latency")
    assert coder.chain == ("large",) and coder.reason == "model qwen2.5-coder-0.5b-instruct pinned"


CONFIG = """
auth: {enabled: false}
tenants: {default: {}, acme: {}, nightly: {class: batch}}
tiers: {a: {}, b: {}, c: {}, d: {}}
models:
  m1: {chain: [a, b]}
  m2: {chain: [c], cascade: {to: d, threshold: -1.5}}
routing:
  rules:
    - {name: vip, match: {tenant: [acme]}, chain: [d, a]}
    - {name: batch-mem, match: {tenant_class: batch, profile: memory, model: m1}, chain: [b],
       cascade: {to: c, tokens: 4, signal: mean_entropy, threshold: 2.5}}
"""


def test_rules_match_tenant_class_profile_and_model_else_alias_chain():
    cfg = parse_config(CONFIG)
    router = Router(cfg.models, cfg.routing.rules)
    assert router.route("acme", "batch", "m1", "memory").chain == ("d", "a")            # first match wins
    mem = router.route("other", "batch", "m1", "memory")
    assert mem.chain == ("b",) and (mem.cascade.to, mem.cascade.tokens, mem.cascade.signal) == ("c", 4, "mean_entropy")
    assert router.route("other", "batch", "m1", "latency").chain == ("a", "b")         # no rule: alias
    assert router.route("other", "batch", "m2", "memory").chain == ("c",)               # rule is for m1
    m2 = router.route("other", "std", "m2", "latency").cascade
    assert (m2.to, m2.tokens, m2.signal, m2.threshold) == ("d", 8, "mean_logprob", -1.5)   # the defaults
    assert not router.knows("m3")
    with pytest.raises(KeyError):
        router.route("other", "std", "m3", "latency")


NEEDS_CONFIG = """
auth: {enabled: false}
tiers: {small: {}, large: {}, tooler: {kind: upstream, base_url: "http://127.0.0.1:1/v1", model: x}}
models:
  auto: {chain: [small, large]}
  qwen2.5-coder-0.5b-instruct: {chain: [large], pinned: true, cascade: {to: small, threshold: -9}}
routing:
  rules:
    - {name: tools, match: {needs: [tools]}, chain: [tooler]}
    - {name: long-code, match: {needs: [code, long_context]}, chain: [large, small]}
    - {name: code, match: {needs: code}, chain: [large], cascade: {to: small, threshold: -2}}
"""


@pytest.mark.parametrize("needs,chain,reason", [
    ((), ("small", "large"), "model auto chain"),
    (("code",), ("large",), "route code: needs code"),
    (("code", "long_context"), ("large", "small"), "route long-code: needs code, long_context"),
    (("long_context",), ("small", "large"), "model auto chain"),          # every need listed must hold
    (("tools", "code"), ("tooler",), "route tools: needs tools"),        # first match wins
])
def test_rules_match_on_needs(needs, chain, reason):
    cfg = parse_config(NEEDS_CONFIG)
    router = Router(cfg.models, cfg.routing.rules)
    decision = router.route("t", "std", "auto", "latency", frozenset(needs))
    assert (decision.chain, decision.reason) == (chain, reason)
    assert router.needs_code_signal


def test_pinned_alias_walks_its_own_chain_whatever_the_rules():
    cfg = parse_config(NEEDS_CONFIG)
    router = Router(cfg.models, cfg.routing.rules)
    for needs in ((), ("code",), ("tools",)):
        decision = router.route("t", "std", "qwen2.5-coder-0.5b-instruct", "memory", frozenset(needs))
        assert decision.chain == ("large",) and decision.reason == "model qwen2.5-coder-0.5b-instruct pinned"
        assert decision.cascade.to == "small"                          # the alias's own cascade
    assert router.pinned("qwen2.5-coder-0.5b-instruct") and not router.pinned("auto")


@pytest.mark.parametrize("text,needle", [
    ("tiers: {a: {}}\nmodels: {m: {chain: [a, zz]}}\n", "models.m.chain: unknown tier 'zz'"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [b]}]}\n", "routing.rules.0.chain: unknown tier 'b'"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [a], match: {model: nope}}]}\n",
     "routing.rules.0.match.model: unknown model 'nope'"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], cascade: {to: x, threshold: -1}}}\n",
     "models.m.cascade.to: unknown tier 'x'"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [a], cascade: {to: b, threshold: -1}}]}\n",
     "routing.rules.0.cascade.to: unknown tier 'b'"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], cascade: {to: a, threshold: -1, signal: mean_surprise}}}\n",
     "models.m.cascade.signal"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], cascade: {to: a, threshold: -1, tokens: 0}}}\n",
     "models.m.cascade.tokens"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], cascade: {to: a}}}\n", "models.m.cascade.threshold"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], escalate: {to: a, below_mean_logprob: -1}}}\n",
     "models.m: 'escalate' was replaced by 'cascade"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [zz], pinned: true}}\n", "models.m.chain: unknown tier 'zz'"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], pinned: yes please}}\n", "models.m.pinned"),
    ("tiers: {a: {}}\nmodels: {m: {chain: [a], pinned: true}}\nrouting: {rules: [{chain: [a], match: {model: m}}]}\n",
     "routing.rules.0.match.model: model 'm' is pinned"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: [a], match: {needs: [telepathy]}}]}\n",
     "routing.rules.0.match.needs"),
    ("tiers: {a: {capabilities: [teleport]}}\n", "tiers.a.capabilities"),
    ("tiers: {a: {}}\nrouting: {rules: [{chain: []}]}\n", "routing.rules.0.chain"),
])
def test_bad_routing_config_names_the_field(text, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_config(text)
