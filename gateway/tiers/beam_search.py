"""vLLM's `use_beam_search` on an embedded engine: the `n` likeliest continuations of a prompt
under the model, found breadth-first, returned best first.

As vLLM does it, outside the engine: every step submits one request per live beam (its prompt and
tokens so far, one token, the 2n likeliest next tokens with their logprobs), and the prefix cache
keeps each step to the beam's last partial block. A beam's score is its summed logprob divided by
its length in tokens (the stop token not counted) to the power `length_penalty`. The search ends
at `max_tokens`, when no beam is live, or (Hugging Face's default stopping rule) once `n` beams
have finished and the best live beam, at its current length, scores no higher than the worst of
them (a longer beam could still score higher with a positive length_penalty; Hugging Face stops
there too, vLLM only at max_tokens).

Beam search reads the model's own distribution: it samples nothing, so the fields that shape
sampling (temperature other than 0 or 1, top_p, top_k, min_p, penalties, biases, bans, stop
strings, grammars, tools) and per-token logprobs are refused with it rather than ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from engines.async_engine import AsyncEngine
from engines.errors import RequestTooLongError
from engines.llm_engine import LLMEngine
from engines.sampler import TokenLogprob
from engines.sampling_params import InvalidRequestError, SamplingParams
from gateway.context import Usage
from gateway.errors import GatewayError
from gateway.openai_format import ChoiceResult
from gateway.schema import ChatCompletionRequest, RequestBody
from gateway.tiers.base import TierUnfit
from gateway.tool_plan import tool_plan

MAX_BEAM_WIDTH = 10        # the engine reports at most 20 alternatives per token: 2 per beam
MAX_LENGTH_PENALTY = 10.0  # length ** penalty stays a finite float for any length a context holds

# Fields that would change a sampled answer, at the values where they change nothing.
_NEUTRAL = {"temperature": (None, 0, 0.0, 1, 1.0), "top_p": (None, 1, 1.0), "top_k": (None, 0, -1),
            "min_p": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
            "stop": (None, [], ""), "top_logprobs": (None, 0)}
_NEUTRAL_EXTRA = {"repetition_penalty": (None, 1, 1.0), "min_tokens": (None, 0), "logit_bias": (None, {}),
                  "allowed_token_ids": (None,), "bad_words": (None, []), "prompt_logprobs": (None,),
                  "response_format": (None, {"type": "text"}), "guided_json": (None,), "guided_regex": (None,),
                  "guided_choice": (None,), "guided_grammar": (None,), "structured_outputs": (None,),
                  "echo": (None, False)}


def beam_search_asked(body: RequestBody) -> bool:
    return body.beam_search


def check_beam_request(body: RequestBody) -> None:
    """A 400 naming the first field that beam search cannot honour."""
    extra = body.model_extra or {}
    if body.n > MAX_BEAM_WIDTH:
        raise GatewayError(400, f"beam search keeps at most {MAX_BEAM_WIDTH} beams (n)", param="n")
    penalty = extra.get("length_penalty")
    if penalty is not None and abs(penalty) > MAX_LENGTH_PENALTY:
        raise GatewayError(400, f"length_penalty must be between -{MAX_LENGTH_PENALTY:g} and {MAX_LENGTH_PENALTY:g}",
                           param="length_penalty")
    # Chat's logprobs is a switch; completions' a count, where 0 still asks for the chosen tokens'.
    if (body.logprobs if isinstance(body, ChatCompletionRequest) else body.logprobs is not None):
        raise GatewayError(400, "'logprobs' cannot be combined with use_beam_search", param="logprobs")
    for name, neutral in _NEUTRAL.items():
        value = getattr(body, name, None)
        if value not in neutral:
            raise GatewayError(400, f"'{name}' cannot be combined with use_beam_search", param=name)
    for name, neutral in _NEUTRAL_EXTRA.items():
        if extra.get(name) not in neutral:
            raise GatewayError(400, f"'{name}' cannot be combined with use_beam_search", param=name)
    if not isinstance(body, ChatCompletionRequest) and body.echo:
        raise GatewayError(400, "'echo' cannot be combined with use_beam_search", param="echo")
    if isinstance(body, ChatCompletionRequest) and tool_plan(body) is not None:
        raise GatewayError(400, "tools cannot be combined with use_beam_search", param="tools")


@dataclass(frozen=True, slots=True)
class Beam:
    tokens: tuple[int, ...]
    logprob: float               # summed over the tokens
    stopped: bool = False        # ended by a stop token (the last of `tokens`)

    def score(self, length_penalty: float) -> float:
        length = max(1, len(self.tokens) - self.stopped)
        return self.logprob / length ** length_penalty


@dataclass(frozen=True, slots=True)
class BeamSettings:
    width: int
    max_tokens: int
    stop_ids: frozenset[int]     # end a beam (none with ignore_eos)
    length_penalty: float


async def search(engine: AsyncEngine, run_id: str, prompt: list[int], settings: BeamSettings,
                 scope: str | None, priority: int, spent: Usage) -> list[Beam]:
    """The `width` best beams, best first; the work is added to `spent` as it is done."""
    width, penalty = settings.width, settings.length_penalty
    live, done = [Beam((), 0.0)], []
    for step in range(settings.max_tokens):
        async with asyncio.TaskGroup() as group:      # one failure cancels (and aborts) the others
            tasks = [group.create_task(_next_token(engine, f"{run_id}-{step}-{i}", prompt + list(beam.tokens),
                                                   2 * width, scope, priority, i, spent, step == 0))
                     for i, beam in enumerate(live)]
        grown = []
        for beam, task in zip(live, tasks):
            for token, logprob in task.result().top:
                child = Beam(beam.tokens + (token,), beam.logprob + logprob, token in settings.stop_ids)
                (done if child.stopped else grown).append(child)
        grown.sort(key=lambda b: b.score(penalty), reverse=True)
        live = grown[:width]
        done = sorted(done, key=lambda b: b.score(penalty), reverse=True)[:width]
        if not live or (len(done) == width and live[0].score(penalty) <= done[-1].score(penalty)):
            break
    return sorted(done + live, key=lambda b: b.score(penalty), reverse=True)[:width]


async def _next_token(engine: AsyncEngine, request_id: str, ids: list[int], top: int, scope: str | None,
                      priority: int, rank: int, spent: Usage, first: bool) -> TokenLogprob:
    """One beam's next-token candidates. Its work goes to `spent` when it is done: the token, and
    the prompt tokens the engine prefilled. The first step's prompt is the request's own (its
    cache hits reported as such); a later step's is the beam so far, of which only what the prefix
    cache did not hold was computed, and that is charged as prompt tokens."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, logprobs=True, top_logprobs=top)
    found, last = None, None
    # Each beam is one of the request's choices to the scheduler (its rank), as n choices are.
    async with contextlib.aclosing(engine.generate(request_id, ids, params, scope, priority, rank)) as outputs:
        async for out in outputs:
            last = out
            if out.logprobs:
                found = out.logprobs[0]
    if found is None:
        raise RuntimeError("the engine answered a beam step without a token")
    spent.completion_tokens += 1
    if first:
        spent.prompt_tokens += last.prompt_tokens
        spent.cached_tokens += last.cached_tokens
    else:
        spent.prompt_tokens += last.prompt_tokens - last.cached_tokens
    return found


def beam_settings(body: RequestBody, front: LLMEngine, prompt: list[int], chat: bool) -> BeamSettings:
    """The search's settings for one prompt, checked against the engine (TierUnfit when the prompt
    and max_tokens do not fit its context: a larger tier may take it)."""
    extra = body.model_extra or {}
    max_tokens = body.output_limit or max(1, front.limits.max_request_tokens - len(prompt))
    try:
        front.check_request(prompt, SamplingParams(max_tokens=max_tokens))
    except RequestTooLongError as exc:
        raise TierUnfit(GatewayError(400, str(exc), param="messages" if chat else "prompt",
                                     code="context_length_exceeded"), front.limits.max_request_tokens) from None
    except InvalidRequestError as exc:
        raise GatewayError(400, str(exc), param=exc.param) from None
    stop_ids = frozenset(extra.get("stop_token_ids") or ())     # ignore_eos ignores EOS alone, as in sampling
    if not body.ignore_eos:
        stop_ids |= front.tokenizer.eos_token_ids
    penalty = extra.get("length_penalty")
    return BeamSettings(body.n, max_tokens, stop_ids, 1.0 if penalty is None else float(penalty))


async def beam_choices(engine: AsyncEngine, front: LLMEngine, body: RequestBody, run_id: str,
                       prompts: list[list[int]], scope: str | None, priority: int, spent: Usage) -> list[ChoiceResult]:
    """Every prompt's `n` beams as choices (prompt p's at indices p*n ...). `spent` counts the work
    as it is done, so a search cut short is charged what it did: every token generated on every
    beam, each prompt once, and what each later step prefilled beyond the prefix cache."""
    chat = isinstance(body, ChatCompletionRequest)
    settings = [beam_settings(body, front, ids, chat) for ids in prompts]
    skip_special = (body.model_extra or {}).get("skip_special_tokens") is not False
    results = []
    for p, (ids, setting) in enumerate(zip(prompts, settings)):
        beams = await search(engine, f"{run_id}-beam{p}", ids, setting, scope, priority, spent)
        for i, beam in enumerate(beams):
            tokens = list(beam.tokens[:-1] if beam.stopped else beam.tokens)
            results.append(ChoiceResult(p * body.n + i, text=front.tokenizer.decode(tokens, skip_special),
                                        finish_reason="stop" if beam.stopped else "length"))
    return results
