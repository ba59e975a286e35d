"""The gateway's side of a cascade: the first tier's first tokens are held back and judged
before any byte reaches the client; unsure, the call is ended and the request answered by the
larger tier, as if it had been routed there. The decision itself is policies/cascade.py.

How the parts meet:
- the pipeline builds one CascadeGate per request whose route carries `cascade:`;
- the chain walk arms it for an attempt whose tier can report the signal (not the target tier
  itself), and a stream's first chunks are held until the gate has decided;
- the tier reports each token's logprob (and entropy) through `observe`, which raises
  Escalate inside the tier's call once the first K tokens (or the whole, shorter, answer) look
  unsure (with predicted_gain: once the first token brings the prompt's hidden state, which with
  the text's part of the gain model predicts what the larger tier would add): an embedded
  engine request is then aborted at once (its KV blocks freed), and what it generated is
  charged to the budgets like any call that did work (gateway/attempt.py);
- the pipeline catches Escalate and walks (to, first tier): the larger tier answers, or, if it
  cannot after all, the first tier answers again without a gate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.context import RequestContext
from policies.cascade import CascadeConfig, confidence, describe, gain_confidence, should_escalate
from policies.gain_model import GainModel


@dataclass(frozen=True, slots=True)
class CascadeVerdict:
    """What the gate decided, for reasons, headers, spans and metrics."""
    from_tier: str
    to: str
    signal: str
    score: float          # policies.cascade.confidence: higher is surer
    tokens: int           # how many tokens it was judged on
    escalated: bool


class Escalate(Exception):
    """Ends the first tier's call: its start looked unsure and the target tier can take over."""

    def __init__(self, verdict: CascadeVerdict):
        super().__init__(f"cascade {verdict.from_tier} -> {verdict.to}")
        self.verdict = verdict


class CascadeGate:
    """One request's cascade. `usable(tier)` says why a tier cannot take calls now (None: it can),
    so that a request is never escalated to a tier known to turn it away (down, busy, its
    breaker refusing). A predicted_gain
    cascade needs the config's gain model (with its prefill part) and the text's part of its
    prediction for this request (GainModel.predict)."""

    __slots__ = ("_entropies", "_logprobs", "_usable", "cfg", "ctx", "gain_model", "text_gain", "tier", "verdict")

    def __init__(self, cfg: CascadeConfig, ctx: RequestContext, usable: Callable[[str], str | None],
                 gain_model: GainModel | None = None, text_gain: float | None = None):
        if cfg.reads_prefill and (gain_model is None or gain_model.prefill is None or text_gain is None):
            raise ValueError("a predicted_gain cascade needs a gain model with a prefill part and the text's prediction")
        self.cfg = cfg
        self.ctx = ctx
        self._usable = usable
        self.gain_model = gain_model
        self.text_gain = text_gain
        self.tier: str | None = None               # the tier being judged
        self.verdict: CascadeVerdict | None = None
        self._logprobs: list[float] = []
        self._entropies: list[float] = []

    @property
    def wants_entropy(self) -> bool:
        return self.cfg.signal == "mean_entropy"

    @property
    def wants_prompt_hidden(self) -> bool:
        return self.cfg.reads_prefill

    @property
    def prompt_hidden_rows(self) -> tuple[int, ...]:
        """The prompt rows the gain model reads, back from the last prompt token."""
        return self.gain_model.prefill.rows if self.cfg.reads_prefill else (0,)

    @property
    def deciding(self) -> bool:
        """Armed for the current attempt and not decided yet: a stream's chunks are held."""
        return self.tier is not None and self.verdict is None

    def arm(self, tier: str, signals: frozenset[str], prompt_hidden_size: int | None = None) -> bool:
        """Judge the call about to be made to `tier` (which reports `signals` per token, and a
        prompt hidden state of `prompt_hidden_size` values)? Not once decided, not on the target
        tier itself, not where the tier cannot report the signal."""
        self.tier = None
        if self.verdict is not None or tier == self.cfg.to:
            return False
        if self.cfg.reads_prefill:
            wanted = self.gain_model.prefill.row_size
            if prompt_hidden_size != wanted:
                self.ctx.reasons.append(f"cascade off on {tier}: the gain model reads a prompt hidden state of "
                                        f"{wanted} values, the tier gives {prompt_hidden_size or 'none'}")
                return False
        elif self.cfg.signal not in signals:
            self.ctx.reasons.append(f"cascade off on {tier}: it gives no per-token {self.cfg.signal.split('_')[1]} "
                                    f"{'on streams' if self.ctx.stream else 'here'}")
            return False
        self.tier = tier
        self._logprobs.clear()
        self._entropies.clear()
        return True

    def observe(self, logprobs: Sequence[float], entropies: Sequence[float], finished: bool,
                prompt_hidden: Sequence[float] | None = None) -> None:
        """The tier's next tokens (`finished`: the answer is complete; `prompt_hidden`: with the
        first token, when the gate asked for it). Raises Escalate when the verdict is to hand the
        request over."""
        if self.verdict is not None or self.tier is None:
            return
        if self.cfg.reads_prefill:
            self._decide_on_prefill(prompt_hidden, len(logprobs))
            return
        want = self.cfg.tokens - len(self._logprobs)
        self._logprobs.extend(logprobs[:want])
        self._entropies.extend(e for e in entropies[:want] if e is not None)
        if len(self._logprobs) >= self.cfg.tokens or finished:
            self._decide()

    def _decide_on_prefill(self, prompt_hidden: Sequence[float] | None, tokens: int) -> None:
        if prompt_hidden is None:
            # The tier's first delta came without it (it could not compute one): keep the tier.
            self.verdict = CascadeVerdict(self.tier, self.cfg.to, self.cfg.signal, 0.0, tokens, False)
            self.ctx.cascade = self.verdict
            self.ctx.reasons.append(f"cascade kept {self.tier}: no prompt hidden state came with its first token")
            return
        gain = self.gain_model.predict_with_prefill(self.text_gain, prompt_hidden)
        self._verdict(gain_confidence(gain), tokens)

    def _decide(self) -> None:
        self._verdict(confidence(self.cfg.signal, self._logprobs, self._entropies), len(self._logprobs))

    def _verdict(self, score: float, judged: int) -> None:
        cfg, tier = self.cfg, self.tier
        unsure = should_escalate(cfg, score)
        note = describe(cfg, score, judged)
        blocked = self._usable(cfg.to) if unsure else None
        self.verdict = CascadeVerdict(tier, cfg.to, cfg.signal, score, judged, unsure and blocked is None)
        self.ctx.cascade = self.verdict
        if not unsure:
            self.ctx.reasons.append(f"cascade kept {tier}: {note}")
        elif blocked is not None:
            self.ctx.reasons.append(f"cascade kept {tier} ({cfg.to} unusable: {blocked}): {note}")
        else:
            self.ctx.reasons.append(f"cascade {tier} -> {cfg.to}: {note}")
            raise Escalate(self.verdict)
