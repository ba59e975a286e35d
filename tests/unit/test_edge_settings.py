"""The YAML settings of the gateway's edge: admin keys, body deadline, choices cap, reload settle."""

from __future__ import annotations

import pytest

from gateway.auth import KeyTable
from policies.config import ConfigError, hash_api_key, parse_config

TIER = "tiers: {up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: x}}\n"
AUTH_OFF = "auth: {enabled: false}\n"


def test_defaults_bound_every_request():
    server = parse_config(TIER + AUTH_OFF).server
    assert server.body_timeout_s == 30 and server.max_choices_per_request == 128 and server.reload_settle_s == 1


@pytest.mark.parametrize("text,needle", [
    ("server: {body_timeout_s: 0}\n", "server.body_timeout_s"),
    ("server: {max_choices_per_request: 0}\n", "server.max_choices_per_request"),
    ("server: {reload_settle_s: -1}\n", "server.reload_settle_s"),
    ("auth: {admin_keys: [{sha256: abc}]}\n", "auth.admin_keys.0"),
    ("auth: {admin_keys: [{env: TIERGATE_TEST_UNSET_ADMIN_KEY}]}\n", "TIERGATE_TEST_UNSET_ADMIN_KEY is not set"),
    ("auth: {admin_keys: [{tenant: a, sha256: " + "a" * 64 + "}]}\n", "auth.admin_keys.0.tenant"),
])
def test_bad_edge_settings_name_their_field(text, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        parse_config(TIER + text)


def test_admin_keys_from_digests_or_the_environment(monkeypatch):
    monkeypatch.setenv("TIERGATE_TEST_ADMIN_KEY", "sk-ops-from-env")
    cfg = parse_config(TIER + f"auth: {{enabled: false, admin_keys: [{{sha256: {hash_api_key('sk-ops-digest')}}}, "
                              "{env: TIERGATE_TEST_ADMIN_KEY}]}\n")
    keys = KeyTable(cfg.auth)
    assert keys.is_admin("Bearer sk-ops-digest") and keys.is_admin("bearer  sk-ops-from-env ")
    assert not keys.is_admin("Bearer sk-other") and not keys.is_admin(None) and not keys.is_admin("Basic sk-ops-digest")
    assert not KeyTable(parse_config(TIER + AUTH_OFF).auth).is_admin("Bearer sk-ops-digest")
