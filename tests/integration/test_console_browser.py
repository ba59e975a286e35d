"""The operator console in a real browser against a real `tiergate serve`.

Debian's headless Chromium (/usr/bin/chromium, installed by .ci/run) driven by Playwright: the
page loads without a console error, shows every configured tier, its routing table and tier
figures move after a few requests, and a breaker opened by a failing upstream shows as open.
A screenshot is written to $TIERGATE_ARTIFACTS (else the test's tmp dir) and its path printed.

The gateway has two tiers: a tiny random Llama in process, and an upstream (tests/fakes/
upstream.py) whose failures are switched on through its control endpoint. The breaker of the
upstream opens after 2 failures (min_calls 2, failure rate 0.5): deterministic, no timing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.processes import ROOT, free_port, start_process, stop_processes
from policies.config import hash_api_key
from tests.serve_process import wait_until_ready
from tests.tiny_models import write_tiny_checkpoint

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
APP_KEY = "sk-console-app-1"
ADMIN_KEY = "sk-console-admin-2"
MSG = [{"role": "user", "content": "w5 w6 w7 w8"}]

pytestmark = pytest.mark.slow


def _config(tiny: Path, upstream_port: int, port: int) -> str:
    return f"""
server: {{host: 127.0.0.1, port: {port}, reload_poll_s: 0}}
auth:
  keys: [{{tenant: app, sha256: {hash_api_key(APP_KEY)}, name: app-key}}]
  admin_keys: [{{sha256: {hash_api_key(ADMIN_KEY)}, name: ops}}]
tenants:
  app: {{class: interactive}}
tiers:
  tiny: {{kind: embedded, model: '{tiny}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB,
          max_num_seqs: 8, max_num_batched_tokens: 256}}
  flaky: {{kind: upstream, base_url: "http://127.0.0.1:{upstream_port}/v1", model: instant}}
models:
  tiny-model: {{chain: [tiny]}}
  flaky-model: {{chain: [flaky, tiny]}}
limits:
  tenants: {{default: {{tokens_per_day: 1000000, max_concurrent: 50}}}}
  breakers:
    by_name:
      flaky: {{window_s: 120, min_calls: 2, failure_rate: 0.5, open_s: 300}}
"""


def _ask(base: str, model: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/chat/completions", json={"model": model, "messages": MSG, "max_tokens": 4},
                      headers={"authorization": f"Bearer {APP_KEY}"}, timeout=60)


@pytest.fixture
def served(tmp_path):
    tiny = tmp_path / "tiny"
    write_tiny_checkpoint(tiny)
    up_port, port = free_port(), free_port()
    cfg = tmp_path / "console.yaml"
    cfg.write_text(_config(tiny, up_port, port))
    env = {**os.environ, "TIERGATE_CPU_KERNELS": "0", "PYTHONPATH": str(ROOT)}   # torch ops: no compile step
    procs = [start_process([sys.executable, "-m", "tests.fakes.upstream", "--port", str(up_port)],
                           tmp_path / "upstream.log", env),
             start_process([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)],
                           tmp_path / "gateway.log", env)]
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, 240, procs[1], tmp_path / "gateway.log")
        yield base, f"http://127.0.0.1:{up_port}"
    finally:
        stop_processes(procs)


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TIERGATE_ARTIFACTS") or tmp_path / "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_console_in_chromium(served, tmp_path):
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            raise AssertionError(f"{CHROMIUM} missing: .ci/run installs it (apt-get install -y chromium)")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install -y chromium)")
    from playwright.sync_api import expect, sync_playwright

    base, upstream = served
    errors: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1800})
        try:
            page = context.new_page()
            page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            polls: list[str] = []
            page.on("request", lambda r: polls.append(r.url) if "/console/api/state" in r.url else None)
            page.goto(f"{base}/console#key={ADMIN_KEY}")

            # Every configured tier, once the first poll has landed.
            for tier in ("tiny", "flaky"):
                page.wait_for_selector(f'.card[data-tier="{tier}"]', timeout=15_000)
            assert page.locator(".card").count() == 2
            assert "key=" not in page.url                     # the key left the address bar
            requests_shown = page.locator('[data-tier="tiny"] [data-field="requests"]')
            assert requests_shown.inner_text() == "0"
            assert page.locator("#routing-table tbody tr").count() == 0

            for _ in range(3):
                resp = _ask(base, "tiny-model")
                assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "tiny"
            # (expect() polls from Playwright's own script world: the page's CSP forbids eval in its own)
            expect(page.locator("#routing-table tbody tr").nth(2)).to_be_attached(timeout=15_000)
            expect(requests_shown).to_have_text("3", timeout=15_000)
            assert page.locator('#routing-table tbody tr [data-field="tier"]').first.inner_text() == "tiny"
            assert int(page.locator('[data-tier="tiny"] [data-field="output_tokens"]').inner_text()) > 0

            # A failing upstream: two failures open its breaker (each request answered by the fallback).
            assert page.locator('tr[data-breaker="flaky"]').get_attribute("data-state") == "closed"
            httpx.post(f"{upstream}/__control", json={"fail_status": 500}, timeout=10).raise_for_status()
            for _ in range(2):
                resp = _ask(base, "flaky-model")
                assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "tiny"
                assert resp.headers["x-tiergate-fallbacks"] == "flaky: tier_failure"
            opened = time.monotonic()
            page.wait_for_selector('tr[data-breaker="flaky"][data-state="open"]', timeout=15_000)
            shown_after = time.monotonic() - opened
            print(f"breaker shown open {shown_after:.2f} s after the request that opened it")
            page.wait_for_selector('tr[data-breaker="flaky"] li[data-event="opened"]', timeout=15_000)
            assert "tier_failure" in page.locator('tr[data-breaker="flaky"] li[data-event="opened"]').inner_text()
            fallback_row = page.locator("#routing-table tbody tr").first
            assert "flaky: tier_failure" in fallback_row.inner_text()
            # Once the page holds the sparklines, each poll asks for the newer points only.
            assert "since=" not in polls[0] and len(polls) >= 3 and all("?since=" in u for u in polls[2:]), polls[:4]

            shot = _artifacts(tmp_path) / "console.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"console screenshot: {shot}")
            assert shot.stat().st_size > 10_000
        finally:
            context.close()
    assert errors == [], errors

