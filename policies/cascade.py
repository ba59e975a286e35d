"""The cascade: a small tier starts every answer, and a larger one takes the request over when the
small tier's first tokens look unsure, before any byte of them reaches the client.

Pure decisions only: the config, the confidence of a prefix of tokens, and whether it falls short.
Holding the tokens back and asking the larger tier is the gateway's part (gateway/cascade_gate.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# mean_logprob: the mean log-probability of the tokens sampled (near 0: sure of each choice);
# mean_entropy: the mean entropy, in nats, of the distributions they were sampled from (near 0:
# one choice dominated), which also sees doubt that a lucky sample hides;
# predicted_gain: the learned router's predicted gain of the target tier, in bits per byte, from
# the prompt's text and the first tier's prefill (policies/gain_model.py), known with the first
# token (escalate above it): nothing more is held back than that token.
CascadeSignal = Literal["mean_logprob", "mean_entropy", "predicted_gain"]
# the signals a tier reports per token; predicted_gain comes from the prefill
PER_TOKEN_SIGNALS: tuple[str, ...] = ("mean_logprob", "mean_entropy")
CASCADE_SIGNALS: tuple[str, ...] = get_args(CascadeSignal)
DEFAULT_CASCADE_TOKENS = 8
MAX_CASCADE_TOKENS = 256


class CascadeConfig(BaseModel):
    """`threshold` is in the signal's own unit: a mean logprob (escalate below it), a mean
    entropy in nats (escalate above it) or a predicted gain in bits per byte (escalate above it)."""
    model_config = ConfigDict(extra="forbid")

    to: str = Field(description="tier that answers the whole request when the first tier's start looks unsure")
    tokens: int = Field(DEFAULT_CASCADE_TOKENS, ge=1, le=MAX_CASCADE_TOKENS,
                        description="tokens of the first tier held back and judged before anything is sent "
                                    "(predicted_gain: the first token, whatever this says)")
    signal: CascadeSignal = "mean_logprob"
    # Infinities are meaningful bounds: -inf for mean_logprob (+inf for the others) never
    # escalates, the opposite sign always does (a cascade kept in place but switched off, or
    # forced on). NaN compares false with every score, so its meaning would be an accident of
    # the comparison's direction: refused.
    threshold: float = Field(allow_inf_nan=True, description="mean_logprob: keep at or above it; "
                                                             "mean_entropy, predicted_gain: keep at or below it")

    @field_validator("threshold")
    @classmethod
    def _not_nan(cls, value: float) -> float:
        if math.isnan(value):
            raise ValueError("must be a number or +-inf, not nan")
        return value

    @model_validator(mode="after")
    def _prefill_judged_on_first_token(self):
        if self.signal == "predicted_gain":
            self.tokens = 1
        return self

    @property
    def reads_prefill(self) -> bool:
        return self.signal == "predicted_gain"


def gain_confidence(predicted_gain: float) -> float:
    """predicted_gain as a confidence (higher is surer to keep): the gain negated."""
    return -predicted_gain


def confidence(signal: CascadeSignal, logprobs: Sequence[float], entropies: Sequence[float]) -> float:
    """Higher is more confident: the mean logprob, or the mean entropy negated. No tokens at all
    (an empty answer) is taken as fully confident: there is nothing to doubt. (predicted_gain
    is not a per-token signal: gain_confidence.)"""
    if signal == "mean_logprob":
        values = logprobs
        sign = 1.0
    elif signal == "mean_entropy":
        values = entropies
        sign = -1.0
    else:
        raise ValueError(f"unknown cascade signal {signal!r}")
    if not values:
        return 0.0
    mean = math.fsum(values) / len(values)
    return sign * mean


def should_escalate(cfg: CascadeConfig, score: float) -> bool:
    """`score` comes from confidence(cfg.signal, ...) or gain_confidence. Escalate when it falls
    short of the threshold: mean_logprob < threshold, or mean_entropy / predicted_gain (= -score)
    > threshold."""
    if math.isnan(score):
        return True
    bound = cfg.threshold if cfg.signal == "mean_logprob" else -cfg.threshold
    return score < bound


def describe(cfg: CascadeConfig, score: float, tokens: int) -> str:
    """The comparison in the signal's own unit, for reasons and logs:
    'mean_logprob -2.31 < -1.50 over 8 tokens', 'predicted_gain +0.190 > +0.120 from the prefill'."""
    value = score if cfg.signal == "mean_logprob" else -score
    escalated = should_escalate(cfg, score)
    if cfg.signal == "mean_logprob":
        op = "<" if escalated else ">="
    else:
        op = ">" if escalated else "<="
    if cfg.reads_prefill:
        return f"{cfg.signal} {value:+.3f} {op} {cfg.threshold:+.3f} from the prefill"
    return f"{cfg.signal} {value:.2f} {op} {cfg.threshold:.2f} over {tokens} token{'s' if tokens != 1 else ''}"
