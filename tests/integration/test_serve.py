"""`tiergate serve` as a user runs it (a subprocess), spoken to with the official openai client."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from bench.processes import free_port
from tests.serve_process import start_serve

pytestmark = pytest.mark.slow


CONFIG = ("auth: {enabled: false}\nserver: {reload_poll_s: 0}\n"
          "tiers:\n  small:\n    model: default\n    served_name: smol\n    dtype: float32\n"
          "    max_model_len: 512\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "c.yaml"
    cfg.write_text(CONFIG)
    proc, base = start_serve(cfg, 300)      # loading the model on a loaded 2-core machine
    yield base, cfg, proc
    proc.terminate()
    proc.wait(timeout=30)


def test_chat_completion_with_openai_client(server):
    server, _, _ = server
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    resp = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0, max_tokens=24)
    assert "Paris" in resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.prompt_tokens > 10 and 0 < resp.usage.completion_tokens <= 24
    assert [m.id for m in client.models.list().data] == ["smol"]


def test_errors_use_openai_format(server):
    server, _, _ = server
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=[], max_tokens=4)
    assert info.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=10_000)
    assert info.value.body["code"] == "context_length_exceeded"
    raw = httpx.post(f"{server}/v1/chat/completions", content=b"{not json", timeout=10)
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_concurrent_requests_are_batched(server):
    """Eight clients at once all get full answers; the engine serves them together."""
    import concurrent.futures

    server, _, _ = server
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    questions = [f"Write one sentence about the number {i}." for i in range(8)]

    def ask(q):
        return client.chat.completions.create(model="smol", messages=[{"role": "user", "content": q}],
                                              temperature=0, max_tokens=12)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, questions))
    assert all(a.choices[0].message.content for a in answers)
    assert all(a.usage.completion_tokens <= 12 for a in answers)


def test_sighup_reloads_the_config(server):
    base, cfg, proc = server
    cfg.write_text(CONFIG + "models:\n  smol: {chain: [small]}\n  smol-too: {chain: [small]}\n")
    proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 120       # a reload may rebuild the tier
    ids = []
    while time.time() < deadline:
        try:
            ids = [m["id"] for m in httpx.get(f"{base}/v1/models", timeout=30).json()["data"]]
        except httpx.HTTPError:
            pass
        if "smol-too" in ids:
            break
        time.sleep(0.2)
    assert ids == ["smol", "smol-too"]
    cfg.write_text(CONFIG)
    proc.send_signal(signal.SIGHUP)


def test_serve_refuses_no_auth_off_loopback(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--host", "0.0.0.0",
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "loopback only" in done.stderr


def test_check_config_exit_codes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("tiers:\n  small:\n    dtype: int3\n")
    done = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(bad)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2 and done.stderr.startswith("tiergate: error: ") and "tiers.small.dtype" in done.stderr
    assert done.stderr.strip().count("\n") == 0
