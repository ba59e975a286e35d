"""The budget side of `tiergate bench gateway`: a `limits:` section with limits in every scope
that never refuse (so each request pays for the whole check: one reservation over API key,
tenant and tier, its reconcile, a breaker permit and its record), and a throwaway
redis-server for the Redis variant.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

_HUGE = 10**12


def limits_yaml(tiers: list[str], redis_url: str | None) -> str:
    """Limits high enough that nothing is refused during a run; memory store unless a URL is given."""
    store = ("{backend: memory}" if redis_url is None else
             f'{{backend: redis, url: "{redis_url}", key_prefix: bench{uuid.uuid4().hex[:6]}, on_store_failure: closed}}')
    prices = "\n".join(f"    {t}: {{input_per_1m: 0.05, output_per_1m: 0.10}}" for t in tiers)
    return f"""
limits:
  store: {store}
  api_keys: {{default: {{rpm: {_HUGE}, tpm: {_HUGE}}}}}
  tenants: {{default: {{tokens_per_day: {_HUGE}, tokens_per_month: {_HUGE}, cost_per_day: 1000000,
                        max_concurrent: 100000}}}}
  tiers: {{default: {{tpm: {_HUGE}, max_concurrent: 100000}}}}
  prices:
{prices}
"""


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(port: int, workdir: Path) -> subprocess.Popen | None:
    """A redis-server without persistence on `port`, or None when the binary is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir), "--loglevel", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not _answers_ping(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            return None
        time.sleep(0.02)
    return proc
