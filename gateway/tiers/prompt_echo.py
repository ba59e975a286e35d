"""What an embedded tier's answer carries of its prompt: completions' `echo` (the prompt's text
and, with `logprobs`, its tokens' logprobs before the completion's), chat's `echo` (the final
assistant message the answer continues) and vLLM's `prompt_logprobs`.

The engine scores a prompt once, for the first choice of its `n` (gateway/tiers/embedded_jobs.py):
the other choices share it (and its cached blocks), so `n` does not multiply the work. A
stream holds a sibling choice's chunks until the first choice's scores arrive, since the echoed
logprobs lead every choice's first chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from engines.loaded_model import LoadedModel
from engines.sampler import TokenLogprob
from gateway.errors import GatewayError
from gateway.openai_format import TokenPieces, vllm_prompt_logprobs
from gateway.schema import ChatCompletionRequest, RequestBody
from gateway.tiers.embedded_prompts import chat_echo_text

# An answer's prompt scores are built on the event loop and sent whole: ~60 bytes each.
MAX_PROMPT_LOGPROB_ENTRIES = 1 << 20


def prompt_logprobs_asked(body: RequestBody) -> int | None:
    """vLLM's `prompt_logprobs`: how many alternatives per prompt token (None: not asked)."""
    return (body.model_extra or {}).get("prompt_logprobs")


def echo_logprobs_asked(body: RequestBody) -> int | None:
    """Completions' `echo` with `logprobs`: alternatives per echoed prompt token (None: not asked)."""
    if isinstance(body, ChatCompletionRequest) or not body.echo:
        return None
    return body.logprobs


def check_size(body: RequestBody, prompts: list[list[int]]) -> None:
    """A 400 for an answer whose prompt scores would be too large to build and send: every
    prompt token with its alternatives, in every choice that carries them."""
    top = engine_prompt_logprobs(body)
    if top is None:
        return
    copies = 1 if isinstance(body, ChatCompletionRequest) else body.n
    entries = sum(len(ids) for ids in prompts) * (top + 1) * copies
    if entries > MAX_PROMPT_LOGPROB_ENTRIES:
        param = "prompt_logprobs" if prompt_logprobs_asked(body) is not None else "logprobs"
        raise GatewayError(400, f"the prompt's logprobs would be {entries} entries (prompt tokens x (alternatives + 1) "
                                f"x choices), more than {MAX_PROMPT_LOGPROB_ENTRIES}", param=param)


def engine_prompt_logprobs(body: RequestBody) -> int | None:
    """What the engine scores the prompt with: the larger of the two top counts, or None."""
    asked = [k for k in (echo_logprobs_asked(body), prompt_logprobs_asked(body)) if k is not None]
    return max(asked) if asked else None


@dataclass
class PromptEcho:
    """One answer's prompt parts, collected from its choices' engine outputs."""
    n: int
    echo_texts: list[str] | None            # per prompt: the text each of its choices begins with
    echo_top: int | None                    # echoed logprobs: alternatives per token
    vllm_top: int | None                    # vLLM's prompt_logprobs: alternatives per token
    _scores: dict[int, list[TokenLogprob]] = field(default_factory=dict)    # per prompt
    _rendered: dict[int, list[dict | None]] = field(default_factory=dict)

    @classmethod
    def of(cls, loaded: LoadedModel, body: RequestBody, rendered: list[list[int]], run: list[list[int]]) -> PromptEcho:
        """`rendered`: each prompt's ids as rendered; `run`: as the engine runs them (the same list
        where truncate_prompt_tokens cut nothing). A cut prompt echoes the text of what was run,
        so the echoed text and its logprobs agree."""
        texts = None
        if isinstance(body, ChatCompletionRequest):
            chat_echo = chat_echo_text(body)
            texts = None if chat_echo is None else [chat_echo]
        elif body.echo:
            # Special tokens stay in the text, so that it and the echoed tokens' offsets agree.
            texts = [p if isinstance(p, str) and ids is whole else loaded.tokenizer.decode(ids, skip_special_tokens=False)
                     for p, whole, ids in zip(body.prompts(), rendered, run)]
        return cls(body.n, texts, echo_logprobs_asked(body), prompt_logprobs_asked(body))

    @property
    def scored(self) -> bool:
        return self.echo_top is not None or self.vllm_top is not None

    def observe(self, index: int, lps: list[TokenLogprob] | None) -> None:
        if lps:
            self._scores[index // self.n] = lps

    def ready(self, index: int) -> bool:
        """Whether the choice's prompt parts are known (always, when none were asked)."""
        return not self.scored or index // self.n in self._scores

    def text(self, index: int) -> str:
        return self.echo_texts[index // self.n] if self.echo_texts else ""

    def echoed_logprobs(self, index: int) -> list[TokenLogprob]:
        """The prompt tokens' logprobs that lead the choice's, with the client's count of alternatives."""
        if self.echo_top is None:
            return []
        return [replace(lp, top=lp.top[:self.echo_top]) for lp in self._scores[index // self.n]]

    def vllm(self, index: int, pieces: TokenPieces) -> list[dict | None] | None:
        """vLLM's prompt_logprobs for the choice, rendered once per prompt."""
        if self.vllm_top is None:
            return None
        group = index // self.n
        if group not in self._rendered:
            self._rendered[group] = vllm_prompt_logprobs(self._scores[group], pieces, self.vllm_top)
        return self._rendered[group]
