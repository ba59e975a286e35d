"""The cascade over real HTTP with the official openai client: the first tier's first K tokens are
held back and judged; kept, the client gets exactly what a plain request on that tier gets;
escalated, exactly what a plain request on the target gets, and nothing of the first tier, whose
engine request is aborted (no KV block left) but whose tokens are charged to the budget.

Two tiny random tiers answer differently (different seeds); thresholds no answer reaches (or every
answer reaches) force each outcome, so nothing depends on the model or the machine."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.cascade_harness import (GAIN_BIAS, GAIN_ESCALATE, GAIN_KEEP, GAIN_ROW_BACK, GAIN_WEIGHT,
                                   GAIN_WEIGHT_BACK, HIDDEN, K, cg,  # noqa: F401 - fixtures
                                   client)
from tests.telemetry_harness import client_traceparent

MSG = [{"role": "user", "content": "w5 w9 w17 w33"}]
LONG = {"max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}      # > K tokens, always




def _ask(client, model, **kw):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=MSG, **{**LONG, **kw})
    return raw.headers, raw.parse()


def _ask_stream(client, model, **kw):
    """The streamed text, the usage chunk's usage, and the headers."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MSG, stream=True, stream_options={"include_usage": True}, **{**LONG, **kw})
    text, usage = "", None
    for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    return raw.headers, text, usage


@pytest.fixture(scope="module")
def plain(client):
    """What plain requests on each tier answer, streamed and not."""
    out = {}
    for tier in ("small", "large"):
        _, answer = _ask(client, f"plain-{tier}")
        _, text, usage = _ask_stream(client, f"plain-{tier}")
        assert text == answer.choices[0].message.content
        out[tier] = (text, answer.usage.prompt_tokens, answer.usage.completion_tokens)
    assert out["small"][0] != out["large"][0]          # else "no byte of small" would prove nothing
    return out


@pytest.mark.parametrize("model,signal", [("keep", "mean_logprob"), ("keep-entropy", "mean_entropy")])
def test_kept_answers_exactly_as_the_first_tier(cg, client, plain, model, signal):
    headers, answer = _ask(client, model)
    assert headers["x-tiergate-tier"] == "small" and "x-tiergate-escalated-from" not in headers
    assert f"cascade kept small: {signal}" in headers["x-tiergate-reasons"]
    assert f"over {K} tokens" in headers["x-tiergate-reasons"]
    assert answer.choices[0].message.content == plain["small"][0]
    assert answer.choices[0].logprobs is None                # the gate's logprobs are not the client's
    headers, text, usage = _ask_stream(client, model)
    assert headers["x-tiergate-tier"] == "small" and text == plain["small"][0]
    assert (usage.prompt_tokens, usage.completion_tokens) == plain["small"][1:]
    cg.settled()


@pytest.mark.parametrize("model,signal", [("escalate", "mean_logprob"), ("escalate-entropy", "mean_entropy")])
def test_escalated_answers_exactly_as_the_target_and_charges_both(cg, client, plain, model, signal):
    for stream in (False, True):
        before = cg.used_tokens()
        if stream:
            headers, text, usage = _ask_stream(client, model)
        else:
            headers, answer = _ask(client, model)
            text, usage = answer.choices[0].message.content, answer.usage
            assert answer.choices[0].logprobs is None
        assert headers["x-tiergate-tier"] == "large" and headers["x-tiergate-escalated-from"] == "small"
        assert f"cascade small -> large: {signal}" in headers["x-tiergate-reasons"]
        assert text == plain["large"][0]                     # the target's answer, and nothing of small's
        assert (usage.prompt_tokens, usage.completion_tokens) == plain["large"][1:]   # the client's usage
        cg.settled()                                         # small's aborted request freed its blocks
        prompt, completion = plain["large"][1:]
        small_work = plain["small"][1] + K                   # its prompt and the K tokens judged
        assert cg.used_tokens() - before == prompt + completion + small_work


def _expected_gain(cg) -> float:
    """What the gain model predicts for MSG: its bias plus its weights on the small tier's
    hidden states at the templated prompt's last token and GAIN_ROW_BACK rows before it
    (computed here by a plain forward)."""
    from bench.routing.prefill_states import prompt_hidden_state
    hidden = prompt_hidden_state(cg.gw.runtime.tiers["small"].loaded, MSG[0]["content"], (0, GAIN_ROW_BACK))
    return GAIN_BIAS + GAIN_WEIGHT * float(hidden[:HIDDEN].sum()) + GAIN_WEIGHT_BACK * float(hidden[HIDDEN:].sum())


def test_a_predicted_gain_cascade_judges_the_prefill_and_holds_back_one_token(cg, client, plain):
    """The small tier's prompt hidden state, with the text's part of the gain model, decides at
    the first token: kept, the small tier's own answer; escalated, the large tier's, with only
    the small prefill and one token charged for the small tier's work."""
    gain = _expected_gain(cg)
    headers, answer = _ask(client, "keep-gain")
    assert headers["x-tiergate-tier"] == "small" and answer.choices[0].message.content == plain["small"][0]
    assert f"cascade kept small: predicted_gain {gain:+.3f} <= {GAIN_KEEP:+.3f} from the prefill" in \
        headers["x-tiergate-reasons"]
    for stream in (False, True):
        before = cg.used_tokens()
        if stream:
            headers, text, usage = _ask_stream(client, "escalate-gain")
        else:
            headers, answer = _ask(client, "escalate-gain")
            text, usage = answer.choices[0].message.content, answer.usage
        assert headers["x-tiergate-tier"] == "large" and headers["x-tiergate-escalated-from"] == "small"
        assert f"cascade small -> large: predicted_gain {gain:+.3f} > {GAIN_ESCALATE:+.3f} from the prefill" in \
            headers["x-tiergate-reasons"]
        assert text == plain["large"][0] and (usage.prompt_tokens, usage.completion_tokens) == plain["large"][1:]
        cg.settled()
        assert cg.used_tokens() - before == sum(plain["large"][1:]) + plain["small"][1] + 1
    headers, _ = _ask(client, "up-gain")
    assert headers["x-tiergate-tier"] == "up"
    assert "cascade off on up: the gain model reads a prompt hidden state of 64 values, the tier gives none" in \
        headers["x-tiergate-reasons"]


def test_an_answer_shorter_than_k_is_judged_on_what_it_has(cg, client):
    headers, answer = _ask(client, "keep", max_tokens=3)
    assert "cascade kept small: mean_logprob" in headers["x-tiergate-reasons"]
    assert "over 3 tokens" in headers["x-tiergate-reasons"] and answer.usage.completion_tokens == 3
    headers, text, _ = _ask_stream(client, "escalate", max_tokens=3)
    assert headers["x-tiergate-tier"] == "large" and "over 3 tokens" in headers["x-tiergate-reasons"]
    cg.settled()


def test_several_choices_are_not_judged(client):
    headers, answer = _ask(client, "escalate", n=2)
    assert headers["x-tiergate-tier"] == "small" and len(answer.choices) == 2
    assert "cascade off: 2 choices" in headers["x-tiergate-reasons"]


def test_an_upstream_stream_is_not_judged_but_its_whole_answer_is(client):
    headers, _, _ = _ask_stream(client, "up-first")
    assert headers["x-tiergate-tier"] == "up"
    assert "cascade off on up: it gives no per-token logprob on streams" in headers["x-tiergate-reasons"]
    # The fake upstream sends no logprobs: an answer with nothing to doubt is kept.
    headers, answer = _ask(client, "up-first")
    assert headers["x-tiergate-tier"] == "up" and answer.choices[0].logprobs is None
    assert "cascade kept up: mean_logprob 0.00 >= 0.00 over 0 tokens" in headers["x-tiergate-reasons"]


def test_decisions_and_confidence_in_metrics(cg, client):
    _ask(client, "keep")
    _ask(client, "escalate")
    _ask(client, "escalate-gain")
    text = httpx.get(f"{cg.base}/metrics").text
    assert 'tiergate_cascade_confidence_bucket{from_tier="small",le="-0.15",signal="predicted_gain"}' in text
    assert 'tiergate_cascade_decisions_total{from_tier="small",outcome="kept",to_tier="large"}' in text
    assert 'tiergate_cascade_decisions_total{from_tier="small",outcome="escalated",to_tier="large"}' in text
    assert 'tiergate_cascade_confidence_bucket{from_tier="small",le="0.0",signal="mean_logprob"}' in text


def test_decision_on_the_request_span(cg, client):
    trace_id, _, traceparent = client_traceparent()
    _ask(client, "escalate", extra_headers={"traceparent": traceparent})
    attributes = cg.server_span(trace_id).attributes
    assert (attributes["tiergate.cascade.from"], attributes["tiergate.cascade.to"]) == ("small", "large")
    assert attributes["tiergate.cascade.outcome"] == "escalated" and attributes["tiergate.escalated_from"] == "small"
    assert attributes["tiergate.cascade.signal"] == "mean_logprob" and attributes["tiergate.cascade.tokens"] == K
    assert attributes["tiergate.cascade.score"] < 0


def _tokens(cg, tier: str, kind: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{cg.base}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "tiergate_tokens_total" and s.labels.get("tier") == tier and s.labels.get("type") == kind)


def test_each_tiers_tokens_are_counted_under_its_own_name(cg, client, plain):
    """An escalated request: the first tier's prompt and judged tokens under its name, the
    target's answer under the target's (their tokenizers count different tokens)."""
    cg.settled()
    before = {(t, k): _tokens(cg, t, k) for t in ("small", "large") for k in ("input", "output")}
    _ask(client, "escalate")
    cg.settled()
    grew = {key: _tokens(cg, *key) - value for key, value in before.items()}
    assert grew == {("small", "input"): plain["small"][1], ("small", "output"): K,
                    ("large", "input"): plain["large"][1], ("large", "output"): plain["large"][2]}
