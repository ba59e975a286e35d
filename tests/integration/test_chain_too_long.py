"""A request too long for every tier of its chain is refused with the roomiest tier's limit, in
whatever order the chain tries them: the client learns the most it could send. A chain with a
cascade hands such a request to the cascade's target, when that holds it."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway_harness import RunningGateway, byte_model_config


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    tmp = tmp_path_factory.mktemp("too-long-gw")
    write_tiny_byte_checkpoint(tmp / "bytes", seed=3, max_position_embeddings=1024)
    roomy = (f"  roomy: {{model: '{tmp / 'bytes'}', dtype: float32, max_model_len: 512, kv_cache_memory: 8MiB,"
             f" max_num_seqs: 8, max_num_batched_tokens: 256}}\n")
    path = tmp / "gateway.yaml"
    path.write_text(byte_model_config(tmp / "bytes", max_model_len=256, tiers=roomy, models=(
        "  roomy_first: {chain: [roomy, bytes]}\n  roomy_last: {chain: [bytes, roomy]}\n"
        "  cascading: {chain: [bytes], cascade: {to: roomy, tokens: 2, threshold: -.inf}}\n")))
    gw = RunningGateway(path)
    yield gw
    gw.stop()


@pytest.mark.parametrize("model", ["roomy_first", "roomy_last"])
def test_the_refusal_names_the_roomiest_tiers_limit(gw, model):
    resp = httpx.post(f"{gw.base}/v1/completions", timeout=60,
                      json={"model": model, "prompt": "x" * 700, "max_tokens": 4})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["code"] == "context_length_exceeded", error
    assert "512" in error["message"] and "256" not in error["message"], error["message"]
    fits = httpx.post(f"{gw.base}/v1/completions", timeout=60, json={"model": model, "prompt": "x" * 400, "max_tokens": 4})
    assert fits.status_code == 200 and fits.headers["x-tiergate-tier"] == "roomy"


def test_a_request_too_long_for_the_chain_goes_to_its_cascade_target(gw):
    for stream in (False, True):
        resp = httpx.post(f"{gw.base}/v1/completions", timeout=60,
                          json={"model": "cascading", "prompt": "x" * 400, "max_tokens": 4, "stream": stream})
        assert resp.status_code == 200 and resp.headers["x-tiergate-tier"] == "roomy", resp.text
        assert resp.headers["x-tiergate-fallbacks"] == "bytes: tier_unfit"
    refused = httpx.post(f"{gw.base}/v1/completions", timeout=60,
                         json={"model": "cascading", "prompt": "x" * 700, "max_tokens": 4})
    assert refused.status_code == 400 and "512" in refused.json()["error"]["message"]
