"""Per-request sampling settings, validated when the request is accepted."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engines.grammar.spec import GrammarSpec


class InvalidRequestError(ValueError):
    """A request's parameters are out of range; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __reduce__(self):
        # Pickled whole (type, message, param) when it crosses to the gateway from an engine process.
        return type(self), (self.args[0], self.param)


MAX_REPETITION_PENALTY = 100.0
MAX_LOGIT_BIAS = 1024
MAX_ALLOWED_TOKEN_IDS = 1 << 18
MAX_STOP_TOKEN_IDS = 4096
# Every step matches each bad word against the output's tail: their total length bounds that work.
MAX_BAD_WORD_TOKENS = 16384
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1      # what torch.Generator.manual_seed takes


# A prompt hidden state is a few rows near the prompt's end: each row back is one more token
# the prefix cache must leave to compute.
MAX_PROMPT_HIDDEN_ROWS = 4
MAX_PROMPT_HIDDEN_BACK = 32
MAX_PREDICTION_TOKENS = 1 << 13


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0              # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0         # 1 = off; over the prompt and the output (vLLM's meaning)
    min_tokens: int = 0                     # EOS and stop_token_ids banned, stop strings unchecked, before this many
    logit_bias: dict[int, float] = field(default_factory=dict)      # token id -> added to its logit
    allowed_token_ids: tuple[int, ...] | None = None                # None = the whole vocabulary
    # Token sequences the output must not complete (engines/bad_words.py reads them from words).
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    # The entropy of the model's distribution at each generated token (TokenLogprob.entropy):
    # a confidence signal for the gateway's cascade, computed only for the requests that ask.
    entropy: bool = False
    # The final hidden state of the prompt's last token (the row the first token is sampled
    # from), on the request's first delta: what a router reads to judge the request from its
    # prefill alone (RequestOutput.prompt_hidden).
    prompt_hidden: bool = False
    # Which prompt rows that state holds, counted back from the last prompt token (0 = it): a
    # chat-templated prompt ends in the same few template tokens, so the row that closes the
    # user's turn (and has read all of it) is a few rows back. The rows come concatenated in
    # this order.
    prompt_hidden_rows: tuple[int, ...] = (0,)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True        # False: special tokens (not the stop token) appear in the text
    # The logprob of every prompt token (and this many top alternatives) on the first delta
    # (RequestOutput.prompt_logprobs); None = not computed.
    prompt_logprobs: int | None = None
    # Constrained decoding (a JSON schema or a grammar): compiled by the engine's GrammarCompiler.
    grammar: GrammarSpec | None = None
    # OpenAI's predicted output: tokens the answer is expected to repeat. An n-gram speculating
    # engine drafts from them (engines/spec/ngram.py); verification keeps the output's
    # distribution (a seeded sampled request's draws would shift with its drafts: the gateway
    # sends none for it).
    prediction_token_ids: tuple[int, ...] = ()

    def validate(self) -> "SamplingParams":
        checks = [
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1"),
            (0.0 <= self.temperature <= 2.0, "temperature", "must be between 0 and 2"),
            (isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an integer >= 0"),
            (self.seed is None or (isinstance(self.seed, int) and SEED_MIN <= self.seed <= SEED_MAX), "seed",
             "must be a 64-bit integer"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be between -2 and 2"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be between -2 and 2"),
            (0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY, "repetition_penalty",
             f"must be in (0, {MAX_REPETITION_PENALTY:g}]"),
            (isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens, "min_tokens",
             "must be an integer between 0 and max_tokens"),
            (len(self.logit_bias) <= MAX_LOGIT_BIAS
             and all(isinstance(t, int) and t >= 0 and -100.0 <= b <= 100.0 for t, b in self.logit_bias.items()),
             "logit_bias", f"must map at most {MAX_LOGIT_BIAS} token ids to biases between -100 and 100"),
            (self.allowed_token_ids is None
             or (0 < len(self.allowed_token_ids) <= MAX_ALLOWED_TOKEN_IDS
                 and all(isinstance(t, int) and t >= 0 for t in self.allowed_token_ids)),
             "allowed_token_ids", f"must be 1 to {MAX_ALLOWED_TOKEN_IDS} token ids"),
            (sum(len(w) for w in self.bad_words_token_ids) <= MAX_BAD_WORD_TOKENS
             and all(w and all(isinstance(t, int) and t >= 0 for t in w) for w in self.bad_words_token_ids),
             "bad_words", f"must be at most {MAX_BAD_WORD_TOKENS} tokens in all (both spellings of each word counted)"),
            (len(self.prediction_token_ids) <= MAX_PREDICTION_TOKENS
             and all(isinstance(t, int) and t >= 0 for t in self.prediction_token_ids), "prediction",
             f"must be at most {MAX_PREDICTION_TOKENS} tokens"),
            (len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS
             and all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
             f"must be at most {MAX_STOP_TOKEN_IDS} token ids"),
            (self.prompt_logprobs is None or (isinstance(self.prompt_logprobs, int) and 0 <= self.prompt_logprobs <= 20),
             "prompt_logprobs", "must be between 0 and 20"),
            (0 <= self.top_logprobs <= 20, "top_logprobs", "must be between 0 and 20"),
            (len(self.stop) <= 4 and all(isinstance(s, str) and s for s in self.stop), "stop",
             "must be at most 4 non-empty strings"),
            (0 < len(self.prompt_hidden_rows) <= MAX_PROMPT_HIDDEN_ROWS
             and len(set(self.prompt_hidden_rows)) == len(self.prompt_hidden_rows)
             and all(isinstance(r, int) and 0 <= r < MAX_PROMPT_HIDDEN_BACK for r in self.prompt_hidden_rows),
             "prompt_hidden_rows", f"must be 1 to {MAX_PROMPT_HIDDEN_ROWS} distinct offsets in "
             f"[0, {MAX_PROMPT_HIDDEN_BACK})"),
        ]
        for ok, param, reason in checks:
            if not ok:
                raise InvalidRequestError(f"{param} {reason}", param)
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", "top_logprobs")
        if self.entropy and not self.logprobs:
            raise InvalidRequestError("entropy requires logprobs to be true", "entropy")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def stop_token_set(self, eos_token_ids: frozenset[int]) -> frozenset[int]:
        """The tokens that end this request: its stop_token_ids, and the model's EOS unless ignored."""
        return frozenset(self.stop_token_ids) | (frozenset() if self.ignore_eos else eos_token_ids)

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
