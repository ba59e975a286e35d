"""Waiting for a `tiergate serve` child process (started with bench.processes.start_process) to
answer /readyz: the tests that run the real command share this one loop."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx


def wait_until_ready(base: str, timeout_s: float, proc: subprocess.Popen | None = None,
                     log: Path | None = None) -> None:
    """Until GET /readyz answers 200. Raises AssertionError, with the end of the server's log,
    as soon as the process has exited, or when `timeout_s` runs out (a slow machine loading
    models is slow, not stuck: callers give it minutes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}: {_tail(log)}")
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"server at {base} not ready after {timeout_s:.0f} s: {_tail(log)}")


def _tail(log: Path | None, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:] if log is not None and log.exists() else "(no log)"
