"""The fixed limits an engine puts on one request, and the check against them.

Kept apart from the engine so that a process that does not hold the engine (the gateway, when
the engine runs in worker processes) refuses the same requests with the same errors before
anything is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.errors import ContextLengthError, KVCapacityError
from engines.sampling_params import InvalidRequestError, SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    vocab_size: int
    max_model_len: int
    block_size: int
    admissible_blocks: int      # KV blocks one request may ever hold: the pool less its headroom

    @property
    def max_request_tokens(self) -> int:
        """Prompt plus output one request may reach: the context, or less where the KV pool
        holds less (a small `kv_cache_memory` beside a long `max_model_len`)."""
        return min(self.max_model_len, self.admissible_blocks * self.block_size)

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequestError (or a RequestTooLongError) for a request this engine can
        never serve. Needs no engine state: safe from any thread or process."""
        params.validate()
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must lie in [0, {self.vocab_size})", "prompt")
        if params.logit_bias and max(params.logit_bias) >= self.vocab_size:
            raise InvalidRequestError(f"logit_bias token ids must lie in [0, {self.vocab_size})", "logit_bias")
        if params.allowed_token_ids and max(params.allowed_token_ids) >= self.vocab_size:
            raise InvalidRequestError(f"allowed_token_ids must lie in [0, {self.vocab_size})", "allowed_token_ids")
        if params.prediction_token_ids and max(params.prediction_token_ids) >= self.vocab_size:
            # Drafts are fed to the model as tokens: an id past its embedding would break the step.
            raise InvalidRequestError(f"prediction token ids must lie in [0, {self.vocab_size})", "prediction")
        total = len(prompt_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ContextLengthError(
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds the "
                f"context length {self.max_model_len}", "max_tokens")
        if -(-total // self.block_size) > self.admissible_blocks:
            raise KVCapacityError(
                f"prompt plus max_tokens ({total} tokens) exceeds this tier's KV cache capacity", "max_tokens")
