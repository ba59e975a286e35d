"""The cascade's pure decision (policies/cascade.py) and the gate that applies it to a tier's first
tokens (gateway/cascade_gate.py): what it judges, when it decides, what it says."""

from __future__ import annotations

import math

import pytest

from gateway.cascade_gate import CascadeGate, Escalate
from gateway.context import RequestContext
from policies.cascade import CascadeConfig, confidence, describe, should_escalate

BOTH = frozenset({"mean_logprob", "mean_entropy"})


def test_confidence_is_higher_when_surer():
    assert confidence("mean_logprob", [-1.0, -2.0, -3.0], []) == pytest.approx(-2.0)
    assert confidence("mean_entropy", [], [0.5, 1.5]) == pytest.approx(-1.0)           # entropy negated
    assert confidence("mean_logprob", [], []) == 0.0 == confidence("mean_entropy", [], [])   # nothing to doubt
    with pytest.raises(ValueError):
        confidence("mean_vibes", [-1.0], [])


@pytest.mark.parametrize("signal,threshold,score,escalate", [
    ("mean_logprob", -1.5, -1.6, True),
    ("mean_logprob", -1.5, -1.5, False),          # at the threshold: kept
    ("mean_logprob", -1.5, -0.1, False),
    ("mean_entropy", 2.0, -2.5, True),            # entropy 2.5 > 2.0
    ("mean_entropy", 2.0, -2.0, False),
    ("mean_logprob", 0.0, -1e-9, True),           # 0: every real answer escalates
    ("mean_logprob", -math.inf, -1e9, False),     # -inf: none does
    ("mean_entropy", math.inf, -1e9, False),
    ("mean_logprob", -1.0, math.nan, True),       # a broken score is not confidence
])
def test_should_escalate(signal, threshold, score, escalate):
    cfg = CascadeConfig(to="large", signal=signal, threshold=threshold)
    assert should_escalate(cfg, score) is escalate


def test_describe_speaks_the_signals_unit():
    cfg = CascadeConfig(to="large", threshold=-1.5)
    assert describe(cfg, -2.314, 8) == "mean_logprob -2.31 < -1.50 over 8 tokens"
    ent = CascadeConfig(to="large", signal="mean_entropy", threshold=1.0)
    assert describe(ent, -0.25, 1) == "mean_entropy 0.25 <= 1.00 over 1 token"


def _gate(**cfg) -> tuple[CascadeGate, RequestContext, list[str]]:
    ctx = RequestContext("r", "chat")
    asked: list[str] = []

    def usable(tier: str) -> str | None:
        asked.append(tier)
        return "still loading" if tier == "down" else None

    return CascadeGate(CascadeConfig(**{"to": "large", "tokens": 4, **cfg}), ctx, usable), ctx, asked


def test_gate_decides_on_the_first_k_tokens_and_escalates():
    gate, ctx, _ = _gate(threshold=-1.0)
    assert gate.arm("small", BOTH) and gate.deciding
    gate.observe([-0.1, -0.2], [], False)
    assert gate.deciding                                        # 2 of 4 tokens: not yet
    with pytest.raises(Escalate) as info:
        gate.observe([-3.0, -3.0, -0.0, -0.0], [], False)       # only the first 4 tokens count
    verdict = info.value.verdict
    assert (verdict.from_tier, verdict.to, verdict.tokens, verdict.escalated) == ("small", "large", 4, True)
    assert verdict.score == pytest.approx(-1.575) and ctx.cascade is verdict
    assert ctx.reasons == ["cascade small -> large: mean_logprob -1.57 < -1.00 over 4 tokens"]
    gate.observe([-9.0], [], True)                              # decided: later tokens change nothing
    assert not gate.arm("small", BOTH)                          # nor is a later attempt judged again


def test_gate_keeps_a_confident_start_and_judges_a_short_answer_on_what_it_has():
    gate, ctx, asked = _gate(threshold=-1.0)
    gate.arm("small", BOTH)
    gate.observe([-0.5], [], True)                              # a one-token answer
    assert not gate.deciding and not ctx.cascade.escalated and ctx.cascade.tokens == 1
    assert ctx.reasons == ["cascade kept small: mean_logprob -0.50 >= -1.00 over 1 token"]
    assert asked == []                                          # confident: the target is not even asked


def test_gate_on_entropy_and_an_unusable_target():
    gate, ctx, _ = _gate(to="down", signal="mean_entropy", threshold=0.5)
    gate.arm("small", BOTH)
    gate.observe([-0.1] * 4, [2.0, 2.0, None, 2.0], False)     # unsure, but the target is down: kept
    assert not ctx.cascade.escalated
    assert ctx.reasons == ["cascade kept small (down unusable: still loading): mean_entropy 2.00 > 0.50 over 4 tokens"]


def test_gate_is_not_armed_on_its_target_or_where_the_signal_is_missing():
    gate, ctx, _ = _gate(signal="mean_entropy", threshold=1.0)
    assert not gate.arm("large", BOTH)                          # the target answers as itself
    assert not gate.arm("up", frozenset({"mean_logprob"}))      # an upstream gives no entropy
    assert ctx.reasons == ["cascade off on up: it gives no per-token entropy here"]
    assert gate.arm("small", BOTH)


def _gain_gate(threshold: float, text_gain: float = 0.05):
    from policies.gain_model import GainModel, PrefillWeights
    ctx = RequestContext("r", "chat")
    model = GainModel(0.0, {}, prefill=PrefillWeights("m", (0.5, -0.25, 0.0)))
    cfg = CascadeConfig(to="large", signal="predicted_gain", threshold=threshold, tokens=8)
    return CascadeGate(cfg, ctx, lambda tier: None, model, text_gain), ctx


def test_predicted_gain_is_judged_on_the_prefill_with_the_first_token():
    """The text's part plus the prefill weights on the prompt hidden state, decided when the first
    token arrives (tokens is 1 whatever the config said): above the threshold, escalated."""
    gate, ctx = _gain_gate(threshold=0.2)
    assert gate.cfg.tokens == 1 and gate.wants_prompt_hidden and not gate.wants_entropy
    assert gate.arm("small", BOTH, prompt_hidden_size=3)
    with pytest.raises(Escalate) as info:
        gate.observe([-0.1], [], False, prompt_hidden=[1.0, 0.4, 7.0])     # 0.05 + 0.5 - 0.1 = 0.45
    assert info.value.verdict.score == pytest.approx(-0.45) and info.value.verdict.tokens == 1
    assert ctx.reasons == ["cascade small -> large: predicted_gain +0.450 > +0.200 from the prefill"]
    gate, ctx = _gain_gate(threshold=0.2)
    gate.arm("small", BOTH, prompt_hidden_size=3)
    gate.observe([-0.1], [], False, prompt_hidden=[0.0, 0.4, 0.0])          # 0.05 - 0.1 = -0.05
    assert not ctx.cascade.escalated
    assert ctx.reasons == ["cascade kept small: predicted_gain -0.050 <= +0.200 from the prefill"]


def test_predicted_gain_needs_a_tier_whose_hidden_state_the_model_reads():
    gate, ctx = _gain_gate(threshold=0.2)
    assert not gate.arm("other", BOTH, prompt_hidden_size=4)
    assert not gate.arm("up", frozenset({"mean_logprob"}), prompt_hidden_size=None)
    assert ctx.reasons == ["cascade off on other: the gain model reads a prompt hidden state of 3 values, "
                           "the tier gives 4",
                           "cascade off on up: the gain model reads a prompt hidden state of 3 values, "
                           "the tier gives none"]
    gate.arm("small", BOTH, prompt_hidden_size=3)
    gate.observe([-0.1], [], False, prompt_hidden=None)       # the tier sent none after all: kept
    assert not ctx.cascade.escalated and ctx.reasons[-1].startswith("cascade kept small: no prompt hidden state")
    with pytest.raises(ValueError, match="gain model with a prefill part"):
        CascadeGate(CascadeConfig(to="large", signal="predicted_gain", threshold=0.1), ctx, lambda t: None)


@pytest.mark.parametrize("threshold,gain,escalate", [(0.1, 0.11, True), (0.1, 0.1, False), (0.1, -0.5, False)])
def test_should_escalate_on_predicted_gain(threshold, gain, escalate):
    from policies.cascade import gain_confidence
    cfg = CascadeConfig(to="large", signal="predicted_gain", threshold=threshold)
    assert should_escalate(cfg, gain_confidence(gain)) is escalate
