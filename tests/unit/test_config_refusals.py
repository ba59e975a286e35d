"""Settings that would load and then silently never work are refused when the file is read, with
the field's path: auth on with no key (every request 401), a NaN cascade threshold, a port given
as a boolean, a classification range no number lies in, a rule or a limit naming a tenant, a
tenant class or an API key the config does not have."""

from __future__ import annotations

import pytest

from policies.config import hash_api_key, parse_config
from tests.config_text import AUTH_OFF, UP, config_error

TIERS = f"tiers: {{a: {UP}, b: {UP}}}\n"


def test_auth_on_without_a_key_is_refused():
    for auth in ("", "auth: {enabled: true}\n", "auth: {admin_keys: [{sha256: " + "a" * 64 + "}]}\n"):
        assert config_error(auth + TIERS).startswith("gw.yaml: auth.keys: auth is enabled but no API key is configured")
    parse_config(f"auth: {{keys: [{{tenant: default, sha256: {hash_api_key('sk-1')}}}]}}\n" + TIERS)
    parse_config(AUTH_OFF + TIERS)


def test_a_nan_cascade_threshold_is_refused_and_infinities_are_kept():
    cascade = "models: {m: {chain: [a], cascade: {to: b, threshold: THRESHOLD}}}\n"
    message = config_error(AUTH_OFF + TIERS + cascade.replace("THRESHOLD", ".nan"))
    assert message.startswith("gw.yaml: models.m.cascade.threshold: ") and "nan" in message
    for bound in ("-.inf", ".inf"):         # never / always escalate
        cfg = parse_config(AUTH_OFF + TIERS + cascade.replace("THRESHOLD", bound))
        assert abs(cfg.models["m"].cascade.threshold) == float("inf")


@pytest.mark.parametrize("port", ["true", "'8000'", "8000.0"])
def test_a_port_is_an_integer_not_something_read_as_one(port):
    assert config_error(f"server: {{port: {port}}}\n" + AUTH_OFF + TIERS).startswith("gw.yaml: server.port: ")


@pytest.mark.parametrize("condition", ["{gte: 100, lte: 10}", "{gt: 5, lt: 5}", "{gte: 5, lt: 5}", "{gt: 5, lte: 5}",
                                       "{gt: 9, lte: 3}", "{lt: .nan}"])
def test_a_classification_range_no_number_lies_in_is_refused(condition):
    rules = f"classification: {{rules: [{{profile: latency, when: {{prompt_tokens: {condition}}}}}]}}\n"
    assert config_error(AUTH_OFF + TIERS + rules).startswith("gw.yaml: classification.rules.0.when.prompt_tokens: ")


def test_a_range_of_one_number_is_kept():
    rules = "classification: {rules: [{profile: latency, when: {n: {gte: 3, lte: 3}}}]}\n"
    assert parse_config(AUTH_OFF + TIERS + rules).classification.rules[0].when.n.gte == 3


TENANTS = "tenants: {local: {class: interactive}, acme: {}}\n"
AUTH_LOCAL = "auth: {enabled: false, anonymous_tenant: local}\n"


@pytest.mark.parametrize("section,where", [
    ("routing: {rules: [{match: {tenant: lcoal}, chain: [b]}]}",
     "routing.rules.0.match.tenant: unknown tenant 'lcoal'"),
    ("routing: {rules: [{chain: [a]}, {match: {tenant: [acme, ghost]}, chain: [b]}]}",
     "routing.rules.1.match.tenant: unknown tenant 'ghost'"),
    ("routing: {rules: [{match: {tenant_class: interactve}, chain: [b]}]}",
     "routing.rules.0.match.tenant_class: no tenant has class 'interactve'"),
    ("classification: {rules: [{profile: latency, when: {tenant: lcoal}}]}",
     "classification.rules.0.when.tenant: unknown tenant 'lcoal'"),
    ("classification: {rules: [{profile: latency, when: {tenant_class: [batch]}}]}",
     "classification.rules.0.when.tenant_class: no tenant has class 'batch'"),
    ("limits: {api_keys: {by_id: {acme-prdo: {rpm: 1}}}}", "limits.api_keys.by_id: unknown API key 'acme-prdo'"),
])
def test_a_name_the_config_does_not_have_is_refused(section, where):
    assert config_error(AUTH_LOCAL + TENANTS + TIERS + section + "\n").startswith(f"gw.yaml: {where}")


def test_the_names_the_config_has_are_accepted(monkeypatch):
    monkeypatch.setenv("TIERGATE_TEST_KEY", "sk-acme")
    unnamed = "sha256:" + hash_api_key("sk-acme")[:12]
    text = (f"auth: {{keys: [{{tenant: acme, env: TIERGATE_TEST_KEY}}, "
            f"{{tenant: local, sha256: {hash_api_key('sk-local')}, name: acme-prod}}]}}\n" + TENANTS + TIERS +
            "routing: {rules: [{match: {tenant: acme, tenant_class: [standard, interactive]}, chain: [b]}]}\n"
            "classification: {rules: [{profile: latency, when: {tenant: [local], tenant_class: interactive}}]}\n"
            f"limits: {{api_keys: {{by_id: {{acme-prod: {{rpm: 1}}, '{unnamed}': {{rpm: 2}}}}}}}}\n")
    assert set(parse_config(text).limits.api_keys.by_id) == {"acme-prod", unnamed}
    # with auth off a request's key id is the digest of whatever key it presents
    parse_config(AUTH_LOCAL + TENANTS + TIERS + f"limits: {{api_keys: {{by_id: {{'{unnamed}': {{rpm: 2}}}}}}}}\n")
