"""`serve` finds out that it cannot listen where it is told before it builds anything: a port in
use, an address that is not this machine's and an empty --host are exit 2 with one line naming
the option or the config field."""

from __future__ import annotations

import socket

import pytest

import gateway.runtime
from gateway.cli import main

UPSTREAM = "tiers: {up: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', model: m}}\n"


@pytest.fixture(autouse=True)
def nothing_is_built(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the runtime was built")

    monkeypatch.setattr(gateway.runtime, "build_runtime", refuse)


@pytest.fixture
def busy_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _serve(capsys, tmp_path, text: str, *options: str) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    assert main(["serve", "--config", str(path), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_port_in_use_is_refused_naming_the_option_or_the_field(tmp_path, capsys, busy_port):
    auth_off = "auth: {enabled: false}\n" + UPSTREAM
    err = _serve(capsys, tmp_path, auth_off, "--port", str(busy_port))
    assert err.startswith(f"tiergate: error: --port {busy_port}: the port is in use"), err
    err = _serve(capsys, tmp_path, f"server: {{port: {busy_port}}}\n" + auth_off)
    assert f"gw.yaml: server.port {busy_port}: the port is in use" in err


def test_an_address_not_of_this_machine_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIERGATE_TEST_LISTEN_KEY", "sk-test")
    keyed = "auth: {keys: [{tenant: default, env: TIERGATE_TEST_LISTEN_KEY}]}\n" + UPSTREAM
    # 192.0.2.0/24 is reserved for documentation: no machine has it, and no name lookup is made
    err = _serve(capsys, tmp_path, "server: {host: 192.0.2.1, port: 0}\n" + keyed)
    assert "gw.yaml: server.host '192.0.2.1': cannot listen there" in err
    err = _serve(capsys, tmp_path, keyed, "--host", "192.0.2.1", "--port", "0")
    assert "--host '192.0.2.1': cannot listen there" in err


def test_an_empty_host_is_refused(tmp_path, capsys):
    err = _serve(capsys, tmp_path, "auth: {enabled: false}\n" + UPSTREAM, "--host", "")
    assert "--host is empty" in err

