"""The soak benchmark's verdict and its load side.

The 30-minute soak itself is `tiergate bench soak` (make soak); its bars are a benchmark's, not
a test's. Here: the verdict arithmetic on windows with known answers, and (slow) a short soak
through a real gateway on the tiny tier: every request answered, every window filled, the
gateway's vitals sampled."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.serving.serve import ServeRequest
from bench.serving.soak import SoakClient, Window, process_vitals, verdict


def _windows(latencies: list[list[float]], rss: list[float], failures: int = 0) -> list[Window]:
    out = [Window(i * 60.0, latencies_ms=list(lat), rss_mib=[r]) for i, (lat, r) in enumerate(zip(latencies, rss))]
    out[-1].failures = failures
    return out


def test_steady_run_passes():
    result = verdict(_windows([[100.0] * 50 + [200.0]] * 6, [500, 505, 502, 503, 504, 506]))
    assert result["rss_growth"] == pytest.approx(0.012)
    assert result["p99_drift"] == pytest.approx(0.0)
    assert result["passed"]


def test_growing_memory_fails():
    result = verdict(_windows([[100.0] * 10] * 6, [500, 510, 520, 530, 540, 550]))
    assert result["rss_growth"] == pytest.approx(0.10)
    assert not result["passed"]


def test_tail_drift_between_first_and_last_third_fails():
    # The middle third does not count: only the first and the last thirds are compared.
    slow_tail = [100.0] * 90 + [1000.0] * 10
    result = verdict(_windows([[100.0] * 100] * 2 + [slow_tail] * 2 + [slow_tail] * 2, [500] * 6))
    assert result["p99_first_third_ms"] == pytest.approx(100.0)
    assert result["p99_drift"] > 0.10
    assert not result["passed"]


def test_one_failed_request_fails():
    assert not verdict(_windows([[100.0] * 10] * 3, [500] * 3, failures=1))["passed"]


def test_vitals_of_this_process():
    rss, fds, threads = process_vitals(os.getpid())
    assert rss > 10 and fds >= 3 and threads >= 1


_TINY_GATEWAY = """
auth: {{enabled: false}}
server: {{reload_poll_s: 0}}
tiers:
  tiny: {{model: '{tiny}', dtype: float32, max_model_len: 256, kv_cache_memory: 4MiB, max_num_seqs: 8,
          max_num_batched_tokens: 256}}
models:
  tiny: {{chain: [tiny]}}
"""


@pytest.mark.slow
def test_short_soak_through_a_real_gateway(tmp_path):
    from tests.gateway_harness import RunningGateway
    from tests.tiny_models import write_tiny_checkpoint

    write_tiny_checkpoint(tmp_path / "tiny")
    (tmp_path / "gateway.yaml").write_text(_TINY_GATEWAY.format(tiny=tmp_path / "tiny"))
    gw = RunningGateway(tmp_path / "gateway.yaml")
    try:
        pool = [ServeRequest(f"r{i}", f"Say something about the number {i}.", 8) for i in range(8)]
        load = SoakClient(gw.base + "/v1", "tiny", pool, max_tokens=8)
        assert asyncio.run(load.prime(4)) == 0
        capacity, failed = asyncio.run(load.capacity(4, 3.0))
        assert failed == 0 and capacity > 0
        windows = asyncio.run(load.soak(min(capacity, 20.0) * 0.7, 12.0, 4.0, os.getpid(), 0, lambda now, w: None))
    finally:
        gw.stop()
    assert len(windows) == 3
    assert all(w.failures == 0 and w.latencies_ms for w in windows)
    assert all(w.rss_mib and w.fds > 0 for w in windows)
    result = verdict(windows)
    assert result["failed"] == 0 and result["rss_first_mib"] > 0
