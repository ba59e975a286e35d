"""One request's deltas: what the engine hands back per step, and the state that builds them."""

from __future__ import annotations

from dataclasses import dataclass

from engines.detokenizer import IncrementalDetokenizer
from engines.grammar.errors import GrammarError
from engines.sampler import TokenLogprob
from engines.sequence import Sequence


@dataclass
class RequestOutput:
    request_id: str
    token_ids: list[int]            # tokens new in this delta
    text: str                       # text new in this delta
    logprobs: list[TokenLogprob] | None   # with .entropy set when the request asked for entropy
    finished: bool
    finish_reason: str | None       # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    # Per-request engine facts so far (for trace events); times are time.monotonic().
    scheduled_at: float | None = None   # first admitted to a batch
    num_preemptions: int = 0
    preempted_at: float | None = None   # the latest preemption
    spec_proposed: int = 0              # draft tokens verified
    spec_accepted: int = 0              # of which accepted
    # SamplingParams.prompt_hidden: the last prompt token's final hidden state, on the first delta.
    prompt_hidden: list[float] | None = None
    # SamplingParams.prompt_logprobs: one entry per prompt token (the first's logprob None), on the first delta.
    prompt_logprobs: list[TokenLogprob] | None = None
    # On the last delta of a constrained request whose grammar admitted no further token: the error
    # the request fails with (its output so far does not satisfy the constraint).
    constraint_error: GrammarError | None = None
    # vLLM's stop_reason, on the last delta: the stop string or stop token id that ended the
    # request; None for EOS, a length cut or a grammar's end.
    stop_reason: str | int | None = None


@dataclass
class TrackedRequest:
    """A request in flight: its sequence and its text so far."""
    seq: Sequence
    detok: IncrementalDetokenizer

    def delta(self, tokens: list[int], lps: list[TokenLogprob] | None, finished: bool,
              prompt_hidden: list[float] | None = None,
              prompt_lps: list[TokenLogprob] | None = None) -> RequestOutput:
        seq = self.seq
        return RequestOutput(
            request_id=seq.request_id, token_ids=tokens, text=self.detok.take_delta(finished), logprobs=lps,
            finished=finished, finish_reason=seq.finish_reason if finished else None,
            prompt_tokens=len(seq.prompt_ids), completion_tokens=len(seq.output_ids),
            cached_tokens=seq.num_cached_prompt_tokens, scheduled_at=seq.scheduled_time,
            num_preemptions=seq.num_preemptions, preempted_at=seq.preempted_time,
            spec_proposed=seq.spec_proposed, spec_accepted=seq.spec_accepted, prompt_hidden=prompt_hidden,
            prompt_logprobs=prompt_lps, constraint_error=self._constraint_error() if finished else None,
            stop_reason=seq.stop_reason if finished else None)

    def _constraint_error(self) -> GrammarError | None:
        seq = self.seq
        if seq.grammar is None:
            return None
        return seq.grammar.failure(seq.params.grammar.param)
