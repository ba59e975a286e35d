"""`tiergate serve` on SIGTERM: streams that end within server.shutdown_grace_s are delivered
whole, and a stream whose tier has stopped sending is cut after the grace, so the process
exits then instead of at the request's deadline (600 s by default)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.gateway_harness import InstantUpstream
from tests.serve_process import start_serve

pytestmark = pytest.mark.slow

GRACE_S = 8


def _control(upstream: InstantUpstream, **update) -> None:
    httpx.post(upstream.base_url.removesuffix("/v1") + "/__control", json=update).raise_for_status()


@pytest.fixture
def upstreams():
    trickling, stalled = InstantUpstream(), InstantUpstream()
    _control(trickling, stream_interval_s=0.3)      # a few events, about a second in all
    _control(stalled, stream_interval_s=3600)       # the first event, then nothing
    yield trickling, stalled
    trickling.stop()
    stalled.stop()


def _start(tmp_path, trickling: InstantUpstream, stalled: InstantUpstream) -> tuple[subprocess.Popen, str]:
    config = tmp_path / "serve.yaml"
    config.write_text(f"""
auth: {{enabled: false}}
server: {{reload_poll_s: 0, log_requests: false, shutdown_grace_s: {GRACE_S}}}
tiers:
  trickling: {{kind: upstream, base_url: "{trickling.base_url}", model: m}}
  stalled: {{kind: upstream, base_url: "{stalled.base_url}", model: m}}
""")
    return start_serve(config, timeout_s=120)


class _Stream(threading.Thread):
    """Reads one streamed chat answer; `first` is set once its first event is in."""

    def __init__(self, base: str, model: str):
        super().__init__(daemon=True)
        self.base, self.model = base, model
        self.first = threading.Event()
        self.events: list[str] = []
        self.error: Exception | None = None

    def run(self) -> None:
        body = {"model": self.model, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        try:
            with httpx.stream("POST", f"{self.base}/v1/chat/completions", json=body, timeout=None) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.first.set()


def test_sigterm_lets_streams_finish_within_the_grace_and_cuts_a_stalled_one_after_it(tmp_path, upstreams):
    proc, base = _start(tmp_path, *upstreams)
    try:
        streams = [_Stream(base, "trickling"), _Stream(base, "stalled")]
        for s in streams:
            s.start()
            assert s.first.wait(60) and s.events, s.error
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=GRACE_S + 60)
        waited = time.monotonic() - sent
        trickling, stalled = streams
        for s in streams:
            s.join(30)
        assert rc in (0, -signal.SIGTERM)       # uvicorn re-raises the signal once it has stopped
        assert trickling.error is None and trickling.events[-1] == "[DONE]"     # delivered whole
        assert stalled.error is not None and "[DONE]" not in stalled.events      # cut, visibly
        assert waited >= GRACE_S - 0.5          # the stalled stream had its grace
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
