"""Recorded prompt and completion text is capped (CONTENT_LIMIT characters per message list and
per request's outputs), and a text cut short says so: a megabyte prompt from an opted-in tenant
is not a megabyte span event."""

from __future__ import annotations

import json

from gateway.telemetry.content import CONTENT_LIMIT, input_messages, output_messages


def _texts(doc: str) -> list[str]:
    return [part["content"] for message in json.loads(doc) for part in message["parts"]]


def test_a_huge_prompt_is_cut_with_a_marker():
    doc = input_messages("A" * 1_000_000)
    (text,) = _texts(doc)
    assert len(doc) < CONTENT_LIMIT + 200 and text.startswith("A" * CONTENT_LIMIT)
    assert text.endswith(f"[... {1_000_000 - CONTENT_LIMIT} characters not recorded]")


def test_the_cap_holds_over_a_whole_message_list_and_over_outputs():
    messages = [{"role": "system", "content": "s" * 1000}] + [
        {"role": "user", "content": [{"type": "text", "text": "u" * 40_000}]} for _ in range(5)]
    doc = input_messages(messages)
    assert len(doc) < CONTENT_LIMIT + 1000 and [m["role"] for m in json.loads(doc)] == ["system"] + ["user"] * 5
    out = output_messages(["x" * 50_000] * 4, ["length"] * 4)
    assert len(out) < CONTENT_LIMIT + 1000 and "characters not recorded" in _texts(out)[1]


def test_small_content_is_recorded_whole():
    assert _texts(input_messages([{"role": "user", "content": "hello"}])) == ["hello"]
