"""An OpenAI request's prompts as an embedded engine's token ids: a chat through the model's own
template (with vLLM's template controls: `add_generation_prompt`, `continue_final_message`,
`chat_template_kwargs`), completions as given, and vLLM's `truncate_prompt_tokens` (the prompt's
last tokens kept) applied for the engine that runs them."""

from __future__ import annotations

import re
from typing import Any

from engines.chat_encoding import encode_chat
from engines.chat_template import RESERVED_VARIABLES, ChatTemplateError
from engines.loaded_model import LoadedModel
from gateway.errors import GatewayError
from gateway.schema import ChatCompletionRequest, RequestBody
from gateway.tool_plan import template_messages, tool_plan

# Template variables are names a Jinja template can read; the values are JSON, bounded by the body's size.
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def render_prompts(loaded: LoadedModel, body: RequestBody) -> list[list[int]]:
    """Token ids of every prompt, before any truncation: a chat through the model's template (with
    its tools and tool turns: gateway/tool_plan.py), completions as given."""
    # vLLM's add_special_tokens: False leaves out the BOS a tokenizer would add (a chat template
    # writes its own); left out, the tokenizer adds it unless the text already begins with it.
    special = (body.model_extra or {}).get("add_special_tokens") is not False
    if isinstance(body, ChatCompletionRequest):
        return [_encode_chat(loaded, body, special)]
    return [p if isinstance(p, list) else loaded.tokenizer.encode(p, add_special_tokens=special) for p in body.prompts()]


def _encode_chat(loaded: LoadedModel, body: ChatCompletionRequest, special: bool) -> list[int]:
    """The chat through the model's template; special-token spellings in the client's messages
    and tools stay text (engines/chat_encoding.py)."""
    extra = body.model_extra or {}
    continued = bool(extra.get("continue_final_message"))
    generation = extra.get("add_generation_prompt")
    if continued and generation:
        raise GatewayError(400, "continue_final_message and add_generation_prompt cannot both be true",
                           param="continue_final_message")
    variables = template_variables(extra.get("chat_template_kwargs"))
    plan = tool_plan(body)

    def render(messages, tools) -> str:
        return loaded.chat_template.render(messages, add_generation_prompt=not continued and generation is not False,
                                           tools=tools, continue_final_message=continued, variables=variables)
    try:
        return encode_chat(loaded.tokenizer, render, template_messages(body), plan.tools if plan else None, special)
    except ChatTemplateError as exc:
        raise GatewayError(400, str(exc), param="messages") from None


def template_variables(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's `chat_template_kwargs`: extra variables for the template (a switch it reads, say). The
    ones the renderer sets itself are refused, so a client cannot replace the conversation."""
    if not kwargs:
        return {}
    for name in kwargs:
        if not _VARIABLE.match(name):
            raise GatewayError(400, f"chat_template_kwargs: {name[:64]!r} is not a template variable name",
                               param="chat_template_kwargs")
        if name in RESERVED_VARIABLES:
            raise GatewayError(400, f"chat_template_kwargs cannot set {name!r}: the gateway sets it",
                               param="chat_template_kwargs")
    return dict(kwargs)


def truncate_prompts(body: RequestBody, prompts: list[list[int]], max_model_len: int | None) -> list[list[int]]:
    """vLLM's `truncate_prompt_tokens`: every prompt keeps its last k tokens (-1: as many as the
    engine's context holds beside the answer's max_tokens, or one token of answer; a tier of no
    known context keeps them all). A prompt already short enough is returned as the same list, so
    a caller can tell which were cut."""
    keep = (body.model_extra or {}).get("truncate_prompt_tokens")
    if keep == -1:
        keep = None if max_model_len is None else max(1, max_model_len - (body.output_limit or 1))
    if keep is None:
        return prompts
    return [ids[-keep:] if len(ids) > keep else ids for ids in prompts]


def chat_echo_text(body: RequestBody) -> str | None:
    """vLLM's chat `echo`: the final message's content when the answer continues it (it is the
    assistant's, or no generation prompt opens a new turn), else nothing. None when echo is not
    asked."""
    extra = body.model_extra or {}
    if not isinstance(body, ChatCompletionRequest) or not extra.get("echo"):
        return None
    final = body.messages[-1]
    continues = final.role == "assistant" or extra.get("add_generation_prompt") is False
    return final.text() if continues else ""
