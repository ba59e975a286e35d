"""The embedded default's routing on the real models, through `tiergate serve` and the official
openai client: every routed request starts on SmolLM2 (`small`, or `fast` for a short stream),
and the bundled gain model, reading the prompt's text and the small model's prefill, hands the
prompts the coder model answers better to `large` before any byte is sent."""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest

from bench.processes import stop_processes
from tests.serve_process import start_serve

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CODE = "Write a Python function that parses a CSV file and returns a list of dicts."
STORY = "Write a short story about a dragon who learns to dance."


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    config = tmp_path_factory.mktemp("default-routing") / "default.yaml"
    shutil.copy(ROOT / "config" / "default.yaml", config)
    proc, base = start_serve(config, timeout_s=900)       # the first start builds the INT4 artifacts
    try:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
    finally:
        stop_processes([proc])


def _ask(client, text: str, **kw):
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0, **kw)
    return raw.headers, raw


def test_a_code_prompt_escalates_from_the_prefill_and_a_story_stays_small(client):
    headers, raw = _ask(client, CODE)
    assert headers["x-tiergate-tier"] == "large" and headers["x-tiergate-escalated-from"] == "small"
    assert "cascade small -> large: predicted_gain" in headers["x-tiergate-reasons"]
    assert raw.parse().choices[0].message.content
    headers, raw = _ask(client, STORY)
    assert headers["x-tiergate-tier"] == "small" and "x-tiergate-escalated-from" not in headers
    assert "cascade kept small: predicted_gain" in headers["x-tiergate-reasons"]


def test_a_short_stream_is_judged_on_the_latency_tier_and_nothing_of_it_is_sent(client):
    headers, raw = _ask(client, CODE, stream=True)
    assert headers["x-tiergate-profile"] == "latency"
    assert headers["x-tiergate-tier"] == "large" and headers["x-tiergate-escalated-from"] == "fast"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    plain = client.chat.completions.create(model="qwen2.5-coder-0.5b-instruct", max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": CODE}])
    assert text == plain.choices[0].message.content          # the large tier's answer, nothing of fast's
