"""One request's state inside the engine."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from engines.position_draws import PositionDraws
from engines.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engines.grammar.state import GrammarState
    from engines.sampler import TokenLogprob


# How much later than its request a choice counts as arriving, per place (see Sequence.rank):
# long enough that requests arriving while a many-choice request runs get seats, short enough
# that its later choices are not deferred by minutes.
RANK_SPACING_S = 0.5


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    prefix_scope: str | None = None     # tenant salt for prefix sharing; None = shared
    priority: int = 0                    # lower runs first
    # Its place among its client request's choices (prompts x n): 0 for the first. Each place
    # counts as RANK_SPACING_S of later arrival, so one request asking for many choices cannot
    # hold every seat while requests that came soon after wait, and its last choices still come
    # before whatever arrives later than that (no choice waits without bound).
    rank: int = 0
    arrival: float = field(default_factory=time.monotonic)
    output_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0    # prompt tokens served by the prefix cache (last admission)
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None     # the stop string or stop token id that ended it (vLLM's)
    # A seeded request's uniforms by output position (engines/position_draws.py); None: unseeded.
    draws: PositionDraws | None = None
    # Block hashes of this sequence's full blocks, computed once and extended as it grows.
    block_hashes: list[bytes] = field(default_factory=list)
    num_registered_blocks: int = 0      # leading blocks already entered in the prefix cache
    first_token_time: float | None = None
    # Per-request facts for tracing (time.monotonic()): first admission, latest preemption.
    scheduled_time: float | None = None
    preempted_time: float | None = None
    spec_proposed: int = 0               # draft tokens verified for this request
    spec_accepted: int = 0               # of which accepted
    # Speculative decoding: the draft model's KV (same block table, its own pool) holds
    # positions [0, num_draft_computed); the adaptive-k estimate (successes, failures) EWMA.
    num_draft_computed: int = 0
    spec_ewma: tuple[float, float] | None = None
    # Constrained decoding: where the output so far stands in the request's grammar (advanced by
    # each appended token; untouched by preemption, since the output tokens are kept).
    grammar: GrammarState | None = None
    # SamplingParams.prompt_hidden: the final hidden states of the prompt rows before its last,
    # by offset back from it, kept as the prefill chunks that compute them pass.
    prompt_hidden_parts: dict[int, torch.Tensor] = field(default_factory=dict)
    # SamplingParams.prompt_logprobs: each prompt token's logprob by its position, as the
    # prefill chunks that score them pass (engines/prompt_logprobs.py).
    prompt_logprob_parts: dict[int, TokenLogprob] = field(default_factory=dict)
    # The model's EOS ids; with the request's stop_token_ids they make `stop_ids`, the tokens
    # that end it (and that min_tokens holds off).
    eos_token_ids: frozenset[int] = frozenset()
    stop_ids: frozenset[int] = field(init=False)
    # The request's logit adjustments' token sets as tensors, built on first use (engines/logit_adjust.py).
    adjust_cache: Any = None
    # SamplingParams.prediction_token_ids as an array, built on first use (engines/spec/ngram.py).
    prediction_array: Any = None

    def __post_init__(self) -> None:
        if self.params.seed is not None:
            self.draws = PositionDraws(self.params.seed)
        self.stop_ids = self.params.stop_token_set(self.eos_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def uniform_at(self, ahead: int = 0) -> float | None:
        """The seeded uniform of the output position `ahead` tokens past the last one emitted;
        None for an unseeded request (drawn from the engine's shared generator)."""
        if self.draws is None:
            return None
        emitted = len(self.output_ids)
        self.draws.release_before(emitted)
        return self.draws.at(emitted + ahead)

    def prompt_hidden_position(self, back: int) -> int:
        """The prompt position `back` rows before its last token (the first, for a short prompt)."""
        return max(0, len(self.prompt_ids) - 1 - back)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Its prompt's logprobs are still to come: asked for, and its first token not out yet."""
        return self.params.prompt_logprobs is not None and not self.output_ids

    @property
    def prompt_rows_to_compute(self) -> int:
        """How many of the prompt's last tokens a prefix-cache hit must leave to compute: one,
        every row of a prompt hidden state the request still waits for, or the whole prompt
        when its logprobs are wanted (a cached block has no logits)."""
        if self.wants_prompt_logprobs:
            return len(self.prompt_ids)
        if self.params.prompt_hidden and not self.output_ids:
            return min(len(self.prompt_ids), 1 + max(self.params.prompt_hidden_rows))
        return 1

    @property
    def is_decoding(self) -> bool:
        """Only its newest (sampled) token is left to compute: it may speculate."""
        return self.num_uncomputed == 1 and bool(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def sort_key(self) -> tuple[int, float]:
        """Lower is served first: admitted first, preempted last."""
        return (self.priority, self.arrival + self.rank * RANK_SPACING_S)
