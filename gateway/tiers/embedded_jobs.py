"""An OpenAI request body as an embedded engine's jobs: what the engine cannot do is refused
(400), and every choice of every prompt (gateway/tiers/embedded_prompts.py) becomes one engine
request with its own SamplingParams (with the grammar its response_format asks for), checked
against the engine before anything runs."""

from __future__ import annotations

import hashlib

from engines.bad_words import bad_words_token_ids
from engines.errors import RequestTooLongError
from engines.llm_engine import LLMEngine
from engines.sampling_params import MAX_PREDICTION_TOKENS, InvalidRequestError, SamplingParams
from gateway.errors import GatewayError
from gateway.guided_decoding import guided_grammar
from gateway.response_format import response_format_grammar
from gateway.schema import ChatCompletionRequest, RequestBody
from gateway.schema_extensions import prediction_text
from gateway.tiers.base import TierCall, TierUnfit
from gateway.tiers.beam_search import beam_search_asked, check_beam_request
from gateway.tiers.prompt_echo import check_size, engine_prompt_logprobs, prompt_logprobs_asked
from gateway.tool_plan import tool_plan

# Known extensions (gateway/schema_extensions.py) that would change what is generated or how the
# prompt is built, and that no embedded engine implements: refused unless sent at a value that
# changes nothing (the values listed; null always), so a client never gets output it did not ask
# for. The fields left out of these tables are either honoured (logit_bias, repetition_penalty,
# min_tokens, allowed_token_ids, bad_words, stop_token_ids, include_stop_str_in_output,
# skip_special_tokens, prompt_logprobs, truncate_prompt_tokens, return_tokens_as_token_ids, the
# guided decoding fields; in chat echo, add_generation_prompt, continue_final_message,
# chat_template_kwargs, prediction; use_beam_search and with it length_penalty: gateway/tiers/beam_search.py)
# or change nothing in the output (metadata, store, user, prompt_cache_key, ...).
# A client's own `chat_template` is refused, as vLLM refuses it unless its operator trusts clients.
_NEUTRAL_BOTH = {"use_beam_search": (False,), "length_penalty": (1, 1.0)}
_NEUTRAL_CHAT = {"functions": ([],), "function_call": ("", {}), "chat_template": (), "documents": ([],),
                 "mm_processor_kwargs": ({},), "modalities": (["text"],), "audio": (), "web_search_options": ()}

Job = tuple[int, list[int], SamplingParams]      # (choice index, prompt ids, sampling)

# OpenAI's top_p 0 keeps the likeliest token: the engine's nucleus takes a positive mass, and
# any below the top token's probability keeps just that token.
LIKELIEST_ONLY_TOP_P = 1e-9


def derive_seed(seed: int | None, index: int) -> int | None:
    """Choice 0 keeps the request's seed; the others get distinct seeds derived from it."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_supported(body: RequestBody) -> None:
    extra = body.model_extra or {}
    chat = isinstance(body, ChatCompletionRequest)
    if not chat:
        if body.suffix:
            raise GatewayError(400, "suffix is not supported by embedded tiers", param="suffix")
    neutral = _NEUTRAL_BOTH | (_NEUTRAL_CHAT if chat else {})
    if beam_search_asked(body):            # its own rules; length_penalty is its own field
        check_beam_request(body)
        neutral = {k: v for k, v in neutral.items() if k not in ("use_beam_search", "length_penalty")}
    for name, value in extra.items():
        if name in neutral and value is not None and value not in neutral[name]:
            raise GatewayError(400, f"'{name}' is not supported by embedded tiers", param=name)
    if prompt_logprobs_asked(body) is not None and body.stream:
        # They would come before any token, and no chunk shape of either endpoint carries them.
        raise GatewayError(400, "prompt_logprobs is not supported with stream", param="prompt_logprobs")
    if chat and extra.get("echo") and tool_plan(body) is not None:
        # A tool call is parsed out of the model's own text, which an echoed answer would lead.
        raise GatewayError(400, "echo is not supported with tools", param="echo")
    best_of = extra.get("best_of") if chat else body.best_of     # a vLLM extension in chat, modelled in completions
    if best_of is not None and best_of != body.n:
        raise GatewayError(400, "best_of other than n is not supported", param="best_of")


def engine_jobs(call: TierCall, prompts: list[list[int]], engine: LLMEngine, drafts_from_prediction: bool = False) -> list[Job]:
    """One job per choice of every prompt. Raises TierUnfit when a request is too long for this
    engine (a larger tier may take it), GatewayError when it is wrong anywhere.
    `drafts_from_prediction`: the engine speculates with n-gram lookup, which reads a predicted
    output (elsewhere it would change nothing, so it is not even tokenized)."""
    body = call.body
    chat = isinstance(body, ChatCompletionRequest)
    gate = call.scoring            # a cascade judging this call needs its tokens' logprobs
    want_lp = (body.logprobs if chat else body.logprobs is not None) or gate is not None
    entropy = gate is not None and gate.wants_entropy
    prompt_hidden = gate is not None and gate.wants_prompt_hidden
    top = body.num_top_logprobs if chat else (body.logprobs or 0)
    prompt_lps = engine_prompt_logprobs(body)
    check_size(body, prompts)
    # Without max_tokens, an answer may run to the end of the context or of what the KV pool
    # holds for one request, whichever comes first.
    limit = engine.limits.max_request_tokens
    extra = body.model_extra or {}
    grammar = response_format_grammar(extra.get("response_format"))
    guided = guided_grammar(extra)
    if guided is not None:
        if grammar is not None:
            raise GatewayError(400, "response_format and a guided decoding constraint cannot be combined",
                               param=guided.param)
        grammar = guided
    bias = {int(token): float(value) for token, value in (extra.get("logit_bias") or {}).items()}
    allowed = extra.get("allowed_token_ids")
    allowed = None if allowed is None else tuple(allowed)      # built once: it may be long
    bad_words = bad_words_token_ids(engine.tokenizer, extra.get("bad_words") or [])
    plan = tool_plan(body) if chat else None
    if plan is not None and plan.forced is not None:    # a forced call outranks a response format
        grammar = plan.grammar(engine.tokenizer)
    predicted = extra.get("prediction") if chat and drafts_from_prediction else None
    # Only a hint: a prediction longer than the engine reads is cut, which changes no output.
    prediction = () if predicted is None else \
        tuple(engine.tokenizer.encode(prediction_text(predicted), add_special_tokens=False)[:MAX_PREDICTION_TOKENS])
    jobs = []
    for p_index, ids in enumerate(prompts):
        # Echo without generation: the engine scores the prompt on the way to one token, which the
        # answer leaves out (embedded_answers.py), as vLLM does.
        max_tokens = 1 if not chat and body.echo_only else body.output_limit or max(1, limit - len(ids))
        for i in range(body.n):
            params = SamplingParams(
                max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else max(body.top_p, LIKELIEST_ONLY_TOP_P),
                top_k=max(body.top_k or 0, 0), min_p=body.min_p or 0.0,       # -1 and 0: off (vLLM's)
                # by choice, not by prompt: a prompt's seeded answer is the same wherever it sits in the list
                seed=derive_seed(body.seed, i), stop=body.stop_list(),
                ignore_eos=body.ignore_eos, stop_token_ids=list(extra.get("stop_token_ids") or ()),
                include_stop_str_in_output=bool(extra.get("include_stop_str_in_output")),
                skip_special_tokens=extra.get("skip_special_tokens") is not False,
                presence_penalty=body.presence_penalty or 0.0,
                frequency_penalty=body.frequency_penalty or 0.0, logit_bias=bias,
                repetition_penalty=extra.get("repetition_penalty") or 1.0, min_tokens=extra.get("min_tokens") or 0,
                allowed_token_ids=allowed, bad_words_token_ids=bad_words, logprobs=bool(want_lp), top_logprobs=top,
                entropy=entropy, prompt_hidden=prompt_hidden,
                # scored once per prompt, for its first choice: the others share it (gateway/tiers/prompt_echo.py)
                prompt_logprobs=prompt_lps if i == 0 else None,
                prompt_hidden_rows=gate.prompt_hidden_rows if prompt_hidden else (0,), grammar=grammar,
                prediction_token_ids=prediction)
            try:
                engine.check_request(ids, params)
            except RequestTooLongError as exc:   # a larger tier may take it
                raise TierUnfit(GatewayError(400, str(exc), param="messages" if chat else "prompt",
                                             code="context_length_exceeded"), engine.limits.max_request_tokens) from None
            except InvalidRequestError as exc:
                raise GatewayError(400, str(exc), param=exc.param) from None
            jobs.append((p_index * body.n + i, ids, params))
    return jobs
