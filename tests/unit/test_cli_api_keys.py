"""An API key is the same key whether it is presented, read from the environment or hashed by
`tiergate hash-key`: surrounding whitespace (the newline ending a mounted secret) is no part of
it, and an empty key is refused rather than hashed."""

from __future__ import annotations

import hashlib

import pytest

from gateway.auth import KeyTable
from gateway.cli import main
from gateway.errors import GatewayError
from policies.config import ConfigError, parse_config

TIERS = "tiers: {up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: m}}\ntenants: {t: {}}\n"
DIGEST = hashlib.sha256(b"sk-abc").hexdigest()


def test_a_key_from_the_environment_with_a_trailing_newline_authenticates(monkeypatch):
    monkeypatch.setenv("TIERGATE_TEST_KEY", "sk-abc\n")
    keys = KeyTable(parse_config("auth: {keys: [{tenant: t, env: TIERGATE_TEST_KEY}]}\n" + TIERS).auth)
    assert keys.authenticate("Bearer sk-abc") == ("t", None)
    with pytest.raises(GatewayError):
        keys.authenticate("Bearer sk-abd")


def test_hash_key_prints_the_digest_a_presented_key_matches(capsys):
    assert main(["hash-key", " sk-abc\n"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == DIGEST
    keys = KeyTable(parse_config(f"auth: {{keys: [{{tenant: t, sha256: {printed}}}]}}\n" + TIERS).auth)
    assert keys.authenticate("Bearer  sk-abc ") == ("t", None)


def test_an_empty_key_is_refused(monkeypatch, capsys):
    assert main(["hash-key", " \t"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the key is empty" in err
    monkeypatch.setenv("TIERGATE_TEST_KEY", " \n")
    with pytest.raises(ConfigError, match=r"auth\.keys\.0: environment variable TIERGATE_TEST_KEY"):
        parse_config("auth: {keys: [{tenant: t, env: TIERGATE_TEST_KEY}]}\n" + TIERS)
