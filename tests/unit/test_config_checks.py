"""Mistakes a config file can hold that would otherwise pass and break later (a tier nobody can
reach, a URL that fails every request, a traceback at start): each is the file's error, naming
the field, from check-config, serve and reload alike."""

from __future__ import annotations

import pytest
import yaml

from policies.config import ConfigError, StrictYamlLoader, load_config, parse_config
from policies.url_check import shown_url
from tests.config_text import AUTH_OFF, UP, config_error


def test_a_key_given_twice_is_an_error_not_the_last_one_silently():
    message = config_error(f"tiers:\n  a: {UP}\n  a: {UP}\n")
    assert "the key 'a' is given twice, on lines 2 and 3" in message


def test_a_merged_key_may_be_overridden():
    text = f"{AUTH_OFF}tiers:\n  a: &up {UP}\n  b: {{<<: *up, model: other}}\n"
    config = parse_config(text, "gw.yaml")
    assert config.tiers["b"].model == "other" and config.tiers["a"].model == "m"
    # an anchor that overrides a merge of its own, merged deeper in the file than it is defined
    nested = "x-a:\n  b: &inner\n    <<: {x: 1}\n    x: 10\nx-c:\n  <<: *inner\n"
    assert yaml.load(nested, Loader=StrictYamlLoader) == yaml.safe_load(nested)


def test_nesting_past_the_parsers_depth_is_a_one_lineconfig_error():
    assert config_error("[" * 5000 + "]" * 5000).endswith("nested too deeply")


def test_a_file_that_is_not_utf8_is_a_one_lineconfig_error(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_bytes(b"server:\n  port: 8000\n\xff\xfe tiers: x\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(path)


@pytest.mark.parametrize("url,reason", [("http://[::1/v1", "not a valid URL"), ("http://", "names no usable host"),
                                        ("http://127.0.0.1:99999/v1", "Port out of range"),
                                        ("http://exa mple.com/v1", "names no usable host"),
                                        ("ftp://host/v1", "must start with http:// or https://")])
def test_an_upstream_url_nobody_can_connect_to_is_refused(url, reason):
    message = config_error(f"tiers:\n  a: {{kind: upstream, base_url: '{url}', model: m}}\n")
    assert "tiers.a: base_url" in message and reason in message


@pytest.mark.parametrize("url,reason", [
    ("http://h:1/v1?api-version=s3cret", "must not have a query"), ("http://h:1/v1#s3cret", "or a fragment"),
    ("http://h:1/v1?", "must not have a query"),
    ("http://user:s3cret@h:1/v1", "must not carry credentials (user:password@); give the API key through api_key_env"),
    ("https://s3cret@h/v1", "must not carry credentials")])
def test_an_upstream_url_paths_cannot_be_appended_to_or_with_credentials_is_refused(url, reason):
    """`/chat/completions` is appended to base_url: after a query it would build
    `/v1?api-version=X/chat/completions`; credentials in it would be written wherever it is shown."""
    message = config_error(f"tiers:\n  a: {{kind: upstream, base_url: '{url}', model: m}}\n")
    assert "tiers.a: base_url" in message and reason in message
    assert "s3cret" not in message


def test_shown_urls_lose_their_credentials():
    assert shown_url("redis://:s3cret@h:6379/0") == "redis://***@h:6379/0"
    assert shown_url("rediss://user:s3cret@h/0?db=1&password=s3cret") == "rediss://***@h/0?db=1&password=***"
    assert shown_url("unix://:s3cret@/run/redis.sock?db=0") == "unix://***@/run/redis.sock?db=0"
    assert shown_url("https://h:443/v1?api_key=s3cret") == "https://h:443/v1?api_key=***"
    assert shown_url("http://10.0.0.5:8000/v1") == "http://10.0.0.5:8000/v1"
    assert shown_url("http://[::1/v1") == "(an invalid URL)"


@pytest.mark.parametrize("url,reason", [("redis://127.0.0.1:99999/0", "Port out of range"),
                                        ("redis://127.0.0.1:6379/abc", "the database 'abc' is not a number"),
                                        ("http://127.0.0.1:6379/0", "must start with redis://")])
def test_a_redis_url_nobody_can_use_is_refused(url, reason):
    message = config_error(f"tiers:\n  a: {UP}\nlimits: {{store: {{backend: redis, url: '{url}'}}}}\n")
    assert "limits.store" in message and reason in message


def test_a_url_with_a_password_is_not_repeated_in_theconfig_error():
    message = config_error(f"tiers:\n  a: {UP}\nlimits: {{store: {{backend: redis, url: 'redis://:s3cret@h:99999/0'}}}}\n")
    assert "s3cret" not in message


@pytest.mark.parametrize("text,where", [
    ("tiers:\n  a: {kv_cache_memory: 0}\n", "tiers.a.kv_cache_memory"),
    (f"server: {{max_body_bytes: 0}}\ntiers:\n  a: {UP}\n", "server.max_body_bytes"),
])
def test_sizes_of_zero_are_refused(text, where):
    assert f"{where}: " in config_error(text)


def test_two_tiers_under_one_model_id_is_anconfig_error():
    message = config_error("tiers:\n  a: {kind: upstream, base_url: 'http://h:1/v1', model: m, served_name: same}\n"
                     "  b: {kind: upstream, base_url: 'http://h:1/v1', model: m, served_name: same}\n")
    assert "tiers.b.served_name: model id 'same' is already tier 'a''s" in message
    # a tier named like another's served name hides it the same way
    message = config_error("tiers:\n  a: {kind: upstream, base_url: 'http://h:1/v1', model: m}\n"
                     "  b: {kind: upstream, base_url: 'http://h:1/v1', model: m, served_name: a}\n")
    assert "tiers.b.served_name: model id 'a'" in message
    # with a models section the ids are the section's, so served names may repeat
    parse_config(AUTH_OFF +
                 "tiers:\n  a: {kind: upstream, base_url: 'http://h:1/v1', model: m, served_name: same}\n"
                 "  b: {kind: upstream, base_url: 'http://h:1/v1', model: m, served_name: same}\n"
                 "models:\n  x: {chain: [a, b]}\n", "gw.yaml")


def test_a_chain_naming_a_tier_twice_and_a_cascade_onto_its_own_start_are_errors():
    assert "models.x.chain: tier 'a' is named twice" in config_error(f"tiers:\n  a: {UP}\nmodels:\n  x: {{chain: [a, a]}}\n")
    message = config_error(f"tiers:\n  a: {UP}\n  b: {UP}\nmodels:\n  x: {{chain: [a, b], cascade: {{to: a, threshold: -1}}}}\n")
    assert "models.x.cascade.to: 'a' is the tier the cascade starts on" in message


@pytest.mark.parametrize("name", ["", "-x", "a b", "x\ty", "a" * 129])
def test_a_tier_name_is_a_plain_identifier(name):
    message = config_error(f"tiers:\n  \"{name}\": {UP}\n")
    assert f"tiers.{name!r}: a tier's name is" in message


def test_a_tier_may_be_named_like_a_hub_model():
    config = parse_config(f"{AUTH_OFF}tiers:\n  meta-llama/Llama-3.1-8B: {UP}\n", "gw.yaml")
    assert "meta-llama/Llama-3.1-8B" in config.tiers


def test_errors_name_the_field_not_pydantics_union_members():
    message = config_error(f"tiers:\n  a: {UP}\nrouting:\n  rules:\n    - {{match: {{profile: bogus}}, chain: [a]}}\n")
    assert message.startswith("gw.yaml: routing.rules.0.match.profile: ") and "literal[" not in message
    assert config_error("tiers:\n  a: {kind: foo}\n") == "gw.yaml: tiers.a: kind must be 'embedded' or 'upstream'"
