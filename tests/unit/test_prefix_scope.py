"""Prefix-cache scopes and upstream cache salts: who shares a scope (isolated by default, the
shared scope, named groups), how a request salt narrows it, what the secret changes, what an
upstream body carries; and the YAML and request-body fields behind them."""

from __future__ import annotations

import json

import pytest

from gateway.cache_salt import PrefixScopes, set_upstream_cache_salt, upstream_cache_salt
from gateway.errors import GatewayError
from gateway.schema import ChatCompletionRequest, CompletionRequest, parse_body
from policies.config import ConfigError, parse_config
from policies.policy_config import PrefixCacheGroup, TenantConfig
from policies.tier_config import UpstreamTierConfig

SUPPORT = PrefixCacheGroup(group="support")
BILLING = PrefixCacheGroup(group="billing")


@pytest.fixture
def scopes() -> PrefixScopes:
    return PrefixScopes()


def test_isolated_tenants_get_scopes_of_their_own(scopes):
    a, b = scopes.scope(None, "a", "isolated"), scopes.scope(None, "b", "isolated")
    assert a != b and a == scopes.scope(None, "a", "isolated")        # stable for one tenant


def test_shared_and_grouped_tenants_agree_with_their_peers_only(scopes):
    shared = {scopes.scope(None, t, "shared") for t in ("a", "b")}
    support = {scopes.scope(None, t, SUPPORT) for t in ("a", "b")}
    billing = scopes.scope(None, "a", BILLING)
    assert len(shared) == 1 and len(support) == 1
    assert len(shared | support | {billing, scopes.scope(None, "a", "isolated")}) == 4


def test_names_cannot_collide_across_kinds(scopes):
    # A tenant called "shared" or "support" is not the shared scope nor the group of that name.
    assert scopes.scope(None, "shared", "isolated") != scopes.scope(None, "x", "shared")
    assert scopes.scope(None, "support", "isolated") != scopes.scope(None, "x", SUPPORT)
    # Nor can a salt make one tenant's scope another's: the parts are length-prefixed.
    assert scopes.scope(None, "ab", "isolated") != scopes.scope(None, "a", "isolated", "b")
    assert scopes.scope(None, "a", "isolated", "") != scopes.scope(None, "a", "isolated")


def test_a_request_salt_narrows_and_never_crosses_scopes(scopes):
    base = scopes.scope(None, "a", "isolated")
    u1, u2 = scopes.scope(None, "a", "isolated", "u1"), scopes.scope(None, "a", "isolated", "u2")
    assert len({base, u1, u2}) == 3 and u1 == scopes.scope(None, "a", "isolated", "u1")
    assert scopes.scope(None, "b", "isolated", "u1") != u1            # same salt, other tenant
    grouped = {scopes.scope(None, t, SUPPORT, "t7") for t in ("a", "b")}
    assert len(grouped) == 1 and grouped.isdisjoint({scopes.scope(None, "a", SUPPORT),
                                                      scopes.scope(None, "a", BILLING, "t7")})


def test_the_secret_roots_every_scope():
    one, two = PrefixScopes(), PrefixScopes()
    # Random per process: another gateway's scopes (and upstream salts) differ ...
    assert one.scope(None, "a", "isolated") != two.scope(None, "a", "isolated")
    # ... unless both use the operator's secret, as replicas should.
    secret = "replica-secret-0123456789"
    assert one.scope(secret, "a", "shared") == two.scope(secret, "a", "shared")
    # What a client knows (tenant and group names, its salt) gives nothing without the secret.
    assert one.scope(secret, "a", "isolated", "u1") != one.scope(secret + "x", "a", "isolated", "u1")


def test_upstream_body_gets_the_scope_salt_only_where_supported(scopes):
    scope = scopes.scope(None, "a", "isolated", "u1")
    body = {"model": "m", "cache_salt": "u1"}
    set_upstream_cache_salt(body, scope, supported=True)
    assert body["cache_salt"] == upstream_cache_salt(scope) != scope      # one-way from the scope
    assert "u1" not in body["cache_salt"] and len(body["cache_salt"]) == 64
    other = {"model": "m", "cache_salt": "u1"}
    set_upstream_cache_salt(other, scopes.scope(None, "b", "isolated", "u1"), supported=True)
    assert other["cache_salt"] != body["cache_salt"]                      # two tenants, one upstream
    plain = {"model": "m", "cache_salt": "u1"}
    set_upstream_cache_salt(plain, scope, supported=False)
    assert plain == {"model": "m"}                                        # dropped, not passed through
    unscoped = {"model": "m", "cache_salt": "u1"}
    set_upstream_cache_salt(unscoped, None, supported=True)
    assert unscoped == {"model": "m"}


# ---- config -------------------------------------------------------------------------------
def _tenant(value: str) -> TenantConfig:
    return parse_config(f"auth: {{enabled: false, anonymous_tenant: t}}\ntiers: {{a: {{}}}}\n"
                        f"tenants: {{t: {{prefix_cache: {value}}}}}\n").tenants["t"]


def test_tenants_are_isolated_unless_the_config_says_otherwise():
    assert TenantConfig().prefix_cache == "isolated"
    assert parse_config("auth: {enabled: false}\ntiers: {a: {}}\n").tenants["default"].prefix_cache == "isolated"
    assert _tenant("shared").prefix_cache == "shared" and _tenant("isolated").prefix_cache == "isolated"
    assert _tenant("{group: support-bots}").prefix_cache == PrefixCacheGroup(group="support-bots")
    assert _tenant("{group: support-bots}").model_dump()["prefix_cache"] == {"group": "support-bots"}


@pytest.mark.parametrize("value, message", [
    ("open", "tenants.t.prefix_cache: must be 'isolated', 'shared' or {group: NAME}"),
    ("3", "tenants.t.prefix_cache: must be 'isolated', 'shared' or {group: NAME}"),
    ("{grp: x}", "tenants.t.prefix_cache: must be 'isolated', 'shared' or {group: NAME}"),
    ("{group: x, extra: 1}", "tenants.t.prefix_cache: must be 'isolated', 'shared' or {group: NAME}"),
    ("{group: ''}", "tenants.t.prefix_cache: group must be"),
    ("{group: 'a b'}", "tenants.t.prefix_cache: group must be"),
    ("{group: 5}", "tenants.t.prefix_cache: group must be"),
    ('{group: "team\\n"}', "tenants.t.prefix_cache: group must be"),
    ("{group: " + "g" * 65 + "}", "tenants.t.prefix_cache: group must be"),
])
def test_a_bad_prefix_cache_names_the_field(value, message):
    with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
        _tenant(value)


def test_the_operator_secret_comes_from_the_environment(monkeypatch):
    text = "auth: {enabled: false}\ntiers: {a: {}}\nserver: {prefix_cache_secret_env: TG_PREFIX_SECRET}\n"
    monkeypatch.delenv("TG_PREFIX_SECRET", raising=False)
    with pytest.raises(ConfigError, match="server: environment variable TG_PREFIX_SECRET"):
        parse_config(text)
    monkeypatch.setenv("TG_PREFIX_SECRET", "short")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        parse_config(text)
    monkeypatch.setenv("TG_PREFIX_SECRET", "a-long-enough-secret")
    cfg = parse_config(text)
    assert cfg.server.prefix_cache_secret() == "a-long-enough-secret"
    assert "a-long-enough-secret" not in json.dumps(cfg.model_dump(mode="json"))   # never dumped
    assert parse_config("auth: {enabled: false}\ntiers: {a: {}}\n").server.prefix_cache_secret() is None


def test_upstream_tiers_do_not_get_a_cache_salt_by_default():
    base = {"kind": "upstream", "base_url": "http://h/v1", "model": "m"}
    assert UpstreamTierConfig(**base).supports_cache_salt is False
    assert UpstreamTierConfig(**base, supports_cache_salt=True).supports_cache_salt is True


# ---- request bodies -----------------------------------------------------------------------
@pytest.mark.parametrize("model, body", [
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    (CompletionRequest, {"model": "m", "prompt": "hi"}),
])
def test_cache_salt_is_a_bounded_string(model, body):
    assert parse_body(model, json.dumps({**body, "cache_salt": "u" * 256}).encode()).cache_salt == "u" * 256
    assert parse_body(model, json.dumps(body).encode()).cache_salt is None
    for bad in ("", "u" * 257, 5):
        with pytest.raises(GatewayError) as err:
            parse_body(model, json.dumps({**body, "cache_salt": bad}).encode())
        assert err.value.status == 400 and err.value.param == "cache_salt"
