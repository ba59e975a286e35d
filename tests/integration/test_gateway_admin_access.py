"""/metrics and the detailed /readyz are the operator's: off loopback they need an admin key.

The off-loopback gateway is built exactly as `tiergate serve --host 0.0.0.0` builds it (the
listen address is what decides), but uvicorn binds 127.0.0.1: a test never opens a port on
another address."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from gateway.app import build_app
from gateway.reload import ConfigReloader
from gateway.runtime import RuntimeHolder, build_runtime
from policies.config import hash_api_key, load_config
from tests.gateway_harness import InstantUpstream, RunningGateway, free_port, shared

TENANT_KEY = "sk-admin-test-tenant-1"
ADMIN_KEY = "sk-admin-test-operator-2"


def _config(upstream: str) -> str:
    return f"""
server: {{reload_poll_s: 0}}
auth:
  keys:
    - {{tenant: app, sha256: {hash_api_key(TENANT_KEY)}}}
  admin_keys:
    - {{sha256: {hash_api_key(ADMIN_KEY)}, name: ops}}
tenants:
  app: {{}}
tiers:
  up: {{kind: upstream, base_url: "{upstream}", model: instant}}
"""


class OffLoopbackGateway:
    """The app of a server listening on `listen`, served on a free loopback port."""

    def __init__(self, config_path, listen: str):
        holder = RuntimeHolder(build_runtime(load_config(config_path)), str(config_path))
        app = build_app(holder, ConfigReloader(holder, config_path, listen))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="off-loopback-gateway", daemon=True)
        self.thread.start()
        deadline = time.time() + 60
        while not self._healthy():
            assert time.time() < deadline, "gateway did not start"
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def config_path(request, tmp_path_factory):
    upstream = shared(request, "instant-upstream", InstantUpstream)
    path = tmp_path_factory.mktemp("gw-admin") / "gateway.yaml"
    path.write_text(_config(upstream.base_url))
    return path


@pytest.fixture(scope="module")
def public(config_path):
    server = OffLoopbackGateway(config_path, "0.0.0.0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def local(config_path):
    server = RunningGateway(config_path)
    yield server
    server.stop()


def _get(gw, path: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{gw.base}{path}", headers=headers, timeout=10)


def _ready(gw, key: str | None = None) -> httpx.Response:
    for _ in range(100):           # the upstream tier is ready as soon as its client is opened
        resp = _get(gw, "/readyz", key)
        if resp.status_code == 200:
            return resp
    raise AssertionError(f"never ready: {resp.text}")


def test_off_loopback_metrics_need_the_admin_key(public):
    anonymous = _get(public, "/metrics")
    assert anonymous.status_code == 401
    assert set(anonymous.json()["error"]) == {"message", "type", "param", "code"}
    assert "tiergate_" not in anonymous.text
    tenant = _get(public, "/metrics", TENANT_KEY)
    assert tenant.status_code == 403 and tenant.json()["error"]["type"] == "permission_error"
    admin = _get(public, "/metrics", ADMIN_KEY)
    assert admin.status_code == 200 and "tiergate_" in admin.text


def test_off_loopback_readyz_shows_only_its_status_without_the_admin_key(public):
    for key in (None, TENANT_KEY, "sk-not-a-key-at-all"):
        assert _ready(public, key).json() == {"status": "ready"}
    detailed = _ready(public, ADMIN_KEY).json()
    assert detailed["status"] == "ready" and set(detailed["tiers"]) == {"up"}


def test_on_loopback_both_stay_open(local):
    assert _get(local, "/metrics").status_code == 200
    assert set(_ready(local).json()["tiers"]) == {"up"}
