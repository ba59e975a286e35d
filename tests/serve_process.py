"""`tiergate serve` as a child process for the tests that run the real command: started on a
free port with its log in a file (bench.processes), and waited for until /readyz answers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.processes import free_port, start_process, stop_processes


def start_serve(config: Path, timeout_s: float) -> tuple[subprocess.Popen, str]:
    """(process, base URL) of `tiergate serve --config CONFIG` once ready; its log lies beside the
    config as serve.log. Stopped again when it does not become ready."""
    port = free_port()
    log = config.with_name("serve.log")
    proc = start_process([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)],
                         log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, timeout_s, proc, log)
    except AssertionError:
        stop_processes([proc])
        raise
    return proc, base


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
