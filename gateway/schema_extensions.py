"""Body fields the gateway knows beyond the ones it models: the rest of OpenAI's API and the common
vLLM (and SGLang) extensions. Their types and bounds are checked at parse time, so that a bad
value is a 400 naming the field here, not an error (or a crash) inside an upstream.

They stay out of the request models on purpose: the models hold what the gateway itself acts
on, and these are kept in `model_extra`, exactly as sent, for the tier that acts on them (an
upstream forwards them; an embedded tier enforces the guided decoding ones
(gateway/guided_decoding.py) and refuses the ones it cannot honour). A field in neither
list is unknown: an upstream tier forwards it only if its config names it
(`extra_body_fields`), else the tier's `unknown_fields` policy rejects the request or drops the
field. Fields that steer the upstream server itself (`priority`, `request_id`,
`kv_transfer_params`, ...) are deliberately not here: the gateway decides those for all tenants.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.response_format import MAX_CONSTRAINT_CHARS, check_response_format

MAX_TOKEN_ID = (1 << 31) - 1
MAX_LIST = 4096
MAX_NAME_CHARS = 256
MAX_TEXT_CHARS = 1 << 20
MAX_BAD_WORDS_CHARS = 1 << 16

_TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
_Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
_Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
_Constraint = Annotated[str, Field(max_length=MAX_CONSTRAINT_CHARS)]
_Object = dict[str, Any]
_Bias = Annotated[float, Field(ge=-100, le=100)]


class _Extensions(BaseModel):
    # Every field may be null, as OpenAI's optional parameters may.
    model_config = ConfigDict(extra="ignore", strict=True)

    # ---- OpenAI, both endpoints
    logit_bias: Annotated[dict[Annotated[str, Field(pattern=r"^\d{1,10}$")], _Bias],
                          Field(max_length=1024)] | None = None
    response_format: _Object | None = None
    metadata: Annotated[dict[_Name, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    store: bool | None = None
    service_tier: _Name | None = None
    prompt_cache_key: _Name | None = None
    safety_identifier: _Name | None = None
    # ---- vLLM sampling
    use_beam_search: bool | None = None
    length_penalty: Annotated[float, Field(allow_inf_nan=False)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=100)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    stop_token_ids: Annotated[list[_TokenId], Field(max_length=MAX_LIST)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=MAX_TOKEN_ID)] | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    allowed_token_ids: Annotated[list[_TokenId], Field(max_length=1 << 18)] | None = None
    bad_words: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=MAX_LIST)] | None = None
    add_special_tokens: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # ---- vLLM structured output
    guided_json: _Constraint | _Object | None = None
    guided_regex: _Constraint | None = None
    guided_choice: Annotated[list[_Constraint], Field(max_length=MAX_LIST)] | None = None
    guided_grammar: _Constraint | None = None
    guided_decoding_backend: _Name | None = None
    guided_whitespace_pattern: _Name | None = None
    structured_outputs: _Object | None = None

    @field_validator("bad_words")
    @classmethod
    def _check_bad_words(cls, value):
        # An embedded tier tokenizes every word (twice) before the request is queued: the total
        # bounds that work. A word of spaces alone names no token to refuse.
        if value is not None:
            if sum(len(w) for w in value) > MAX_BAD_WORDS_CHARS:
                raise ValueError(f"bad_words must total at most {MAX_BAD_WORDS_CHARS} characters")
            if any(not w.strip() for w in value):
                raise ValueError("bad_words entries must contain a character other than whitespace")
        return value

    @field_validator("guided_choice")
    @classmethod
    def _check_choice_size(cls, value):
        if value is not None and sum(len(c) for c in value) > MAX_CONSTRAINT_CHARS:
            raise ValueError(f"guided_choice must total at most {MAX_CONSTRAINT_CHARS} characters")
        return value

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _check_truncation(cls, value):
        # vLLM's meaning: keep the prompt's last k tokens, -1 for the model's context; 0 would leave none.
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be at least 1, or -1 for the model's context length")
        return value

    @field_validator("response_format")
    @classmethod
    def _check_response_format(cls, value):
        if value is not None:
            check_response_format(value)
        return value


MAX_PREDICTION_CHARS = 1 << 15      # tokenized with the request, on the event loop: a few ms at most


def prediction_text(value: dict[str, Any]) -> str:
    """The text of OpenAI's `prediction` ({"type": "content", "content": text or text parts})."""
    content = value.get("content")
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


class ChatExtensions(_Extensions):
    # ---- OpenAI
    functions: Annotated[list[_Object], Field(max_length=1024)] | None = None
    function_call: _Name | _Object | None = None
    modalities: Annotated[list[_Name], Field(max_length=8)] | None = None
    audio: _Object | None = None
    prediction: _Object | None = None
    reasoning_effort: _Name | None = None
    verbosity: _Name | None = None
    web_search_options: _Object | None = None
    # ---- vLLM
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None    # schema.MAX_N
    echo: bool | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template: _Text | None = None
    chat_template_kwargs: _Object | None = None
    documents: Annotated[list[_Object], Field(max_length=MAX_LIST)] | None = None
    mm_processor_kwargs: _Object | None = None

    @field_validator("prediction")
    @classmethod
    def _check_prediction(cls, value):
        # OpenAI's predicted output: a text the answer is expected to largely repeat (an edited file).
        if value is None:
            return value
        content = value.get("content")
        parts_ok = isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
        if value.get("type") != "content" or not (isinstance(content, str) or parts_ok):
            raise ValueError('prediction must be {"type": "content", "content": a string or text parts}')
        if len(prediction_text(value)) > MAX_PREDICTION_CHARS:
            raise ValueError(f"prediction content must be at most {MAX_PREDICTION_CHARS} characters")
        return value


class CompletionExtensions(_Extensions):
    pass


def check_extensions(extensions: type[_Extensions], extra: dict[str, Any]) -> None:
    """Raises pydantic's ValidationError (located at the field) for a known field of a bad type."""
    extensions.model_validate(extra)


def unknown_names(extensions: type[_Extensions], extra: dict[str, Any] | None) -> list[str]:
    """The body's fields that are neither modelled nor known extensions, in the order sent."""
    if not extra:
        return []
    known = extensions.model_fields
    return [name for name in extra if name not in known]
