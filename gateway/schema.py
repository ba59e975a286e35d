"""OpenAI request bodies as pydantic models, parsed and validated in one pass from the raw bytes.

Types are strict (a string where a number belongs is an error, as at OpenAI). Fields beyond the
models are kept in `model_extra` as sent: the known ones (the rest of OpenAI's API, common vLLM
extensions: gateway/schema_extensions.py) are type-checked here; an upstream tier forwards those
and, per its config, rejects or drops the unknown ones (`unknown_fields()`); embedded tiers
ignore what they do not refuse.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gateway.errors import GatewayError, param_path
from gateway.schema_extensions import ChatExtensions, CompletionExtensions, check_extensions, unknown_names
from gateway.schema_tools import MAX_TOOLS, Tool, ToolChoice, check_tool_choice, check_tools


def _whole(value):
    """A JSON number with no fraction (2.0) is the integer 2, as JSON Schema's `integer` (and so
    /openapi.json) says; strict mode alone would refuse it. Anything else is left to the strict
    check (1.5, true and "2" stay errors). Lists (of lists) of token ids are converted inside."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list) and any(isinstance(x, (float, list)) for x in value):
        return [_whole(x) for x in value]
    return value


def _null_is_default(cls, value, info: ValidationInfo):
    """null for a field with a default is that default: OpenAI's reference marks them nullable,
    and its Python client sends null for a keyword given as None."""
    return cls.model_fields[info.field_name].default if value is None else value


def _or_null(schema: dict) -> WithJsonSchema:
    """/openapi.json's view of a field that _null_is_default admits as null."""
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]})


_BOOL_OR_NULL = _or_null({"type": "boolean"})


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class RefusalPart(_Body):
    type: Literal["refusal"]
    refusal: str


class ChatMessage(_Body):
    # /openapi.json states what _content_present enforces: content may be left out or null, and
    # hold refusal parts, only for an assistant.
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"anyOf": [
        {"properties": {"role": {"const": "assistant"}}},
        {"required": ["content"], "properties": {"content": {
            "type": ["string", "array"], "items": {"properties": {"type": {"const": "text"}}}}}}]})
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart | RefusalPart], Field(min_length=1)] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value):
        # Said here, before the union's own error ("should be a valid string") hides the reason.
        if isinstance(value, list):
            if not value:
                raise ValueError("empty array: give at least one content part")
            for part in value:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind not in ("text", "refusal"):
                    raise ValueError(f"content parts of type '{kind[:64]}' are not supported: the models "
                                     "served here read text only")
        return value

    @model_validator(mode="after")
    def _content_present(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.role != "assistant" and isinstance(self.content, list) and \
                any(isinstance(part, RefusalPart) for part in self.content):
            raise ValueError("only an assistant message holds refusal parts")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text if isinstance(part, TextPart) else part.refusal for part in self.content)


class StreamOptions(_Body):
    include_usage: Annotated[bool, _BOOL_OR_NULL] = False
    # vLLM's: every chunk carries the usage so far (with include_usage).
    continuous_usage_stats: Annotated[bool, _BOOL_OR_NULL] = False

    _nulls = field_validator("include_usage", "continuous_usage_stats", mode="before")(_null_is_default)


# Bounds of the numeric fields: past them a value is a client error here, never an overflow in an
# engine thread. top_k beyond the vocabulary means "off" and is clamped by the engine.
MAX_OUTPUT_TOKENS = 1 << 20
MAX_TOP_K = (1 << 31) - 1
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)       # what a 64-bit generator seed can hold
MAX_STOP_CHARS = 1024
MAX_CACHE_SALT_CHARS = 256
# A model id is a name from the config: longer ones are refused before they reach a log line or
# an error message that would echo them (an unknown model's 404 names it).
MAX_MODEL_CHARS = 256
# Sizes of the lists whose every entry costs work per request (a template turn, a prompt, a
# token): the body cap alone would still admit hundreds of thousands of them.
MAX_MESSAGES = 2048
MAX_PROMPTS = 2048
MAX_N = 128                          # OpenAI's bound; server.max_choices_per_request caps prompts x n
DEFAULT_COMPLETION_TOKENS = 16       # /v1/completions' max_tokens when the client sends none
MAX_PROMPT_TOKEN_IDS = 1 << 20       # longer than any context

# What the validators below enforce, stated in /openapi.json (the schema only; validation and its
# messages stay the validators').
_STOP_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
_STOP_SCHEMA = {"anyOf": [_STOP_TEXT, {"type": "array", "maxItems": 4, "items": _STOP_TEXT}, {"type": "null"}],
                "default": None}
_TOKEN_IDS = {"type": "array", "minItems": 1, "maxItems": MAX_PROMPT_TOKEN_IDS,
              "items": {"type": "integer", "minimum": 0}}
_PROMPT_SCHEMA = {"anyOf": [{"type": "string", "minLength": 1},
                            {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
                             "items": {"type": "string", "minLength": 1}},
                            _TOKEN_IDS,
                            {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": _TOKEN_IDS}]}
# stream_options (not null) only with stream: true (_options_need_stream).
_STREAM_OPTIONS_NEED_STREAM = {"anyOf": [{"properties": {"stream_options": {"type": "null"}}},
                                         {"required": ["stream"], "properties": {"stream": {"const": True}}}]}


class _Sampling(_Body):
    model: str = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)      # 0: OpenAI's range; the likeliest token only
    n: Annotated[int, _or_null({"type": "integer", "minimum": 1, "maximum": MAX_N})] = Field(1, ge=1, le=MAX_N)
    stop: Annotated[str | list[str] | None, WithJsonSchema(_STOP_SCHEMA)] = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: Annotated[bool, _BOOL_OR_NULL] = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = Field(None, max_length=256)
    # Extensions that vLLM also accepts.
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K)    # -1 or 0: off (vLLM's convention)
    min_p: float | None = Field(None, ge=0, le=1)
    ignore_eos: Annotated[bool, _BOOL_OR_NULL] = False
    # vLLM's per-request prefix-cache salt: it narrows the tenant's prefix-cache scope (end users
    # behind one key stop sharing cached prompts), never widens it. Upstreams never see it as sent.
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)

    _whole_ints = field_validator("max_tokens", "n", "seed", "top_k", mode="before")(_whole)
    _nulls = field_validator("n", "stream", "ignore_eos", mode="before")(_null_is_default)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > 4 or not all(stops) or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop must be at most 4 non-empty strings of at most {MAX_STOP_CHARS} characters")
        return value

    @field_validator("stream_options")
    @classmethod
    def _options_need_stream(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return value

    def unknown_fields(self) -> list[str]:
        """Fields sent that are neither modelled nor known extensions, in the order sent."""
        return unknown_names(self.known_extensions, self.model_extra)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def beam_search(self) -> bool:
        """vLLM's use_beam_search: the answer is the n likeliest beams, found whole, not sampled."""
        return bool((self.model_extra or {}).get("use_beam_search"))

    @property
    def continuous_usage(self) -> bool:
        """Usage in every chunk of the stream, not only in the last."""
        return self.include_usage and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(_Sampling):
    # top_logprobs other than 0 or null only with logprobs: true (_needs_logprobs); tool_choice
    # other than "none" or null only with tools (_choice_defined).
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": [
        _STREAM_OPTIONS_NEED_STREAM,
        {"anyOf": [{"properties": {"top_logprobs": {"enum": [0, None]}}},
                   {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}]},
        {"anyOf": [{"properties": {"tool_choice": {"enum": ["none", None]}}},
                   {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}]}]})
    known_extensions: ClassVar[type] = ChatExtensions
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS)
    logprobs: Annotated[bool, _BOOL_OR_NULL] = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Tool calling (gateway/schema_tools.py): validated and routed on, forwarded as sent.
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    _whole_chat_ints = field_validator("max_completion_tokens", "top_logprobs", mode="before")(_whole)
    _chat_nulls = field_validator("logprobs", mode="before")(_null_is_default)

    @field_validator("tools")
    @classmethod
    def _tools_bounded(cls, value):
        if value:
            check_tools(value)
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_defined(cls, value, info: ValidationInfo):
        if value is not None:
            check_tool_choice(value, info.data.get("tools"))
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value, info: ValidationInfo):
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_top_logprobs(self) -> int:
        return self.top_logprobs or 0


class CompletionRequest(_Sampling):
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": [_STREAM_OPTIONS_NEED_STREAM]})
    known_extensions: ClassVar[type] = CompletionExtensions
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], WithJsonSchema(_PROMPT_SCHEMA)]
    # 0 only with echo (_echo_without_generation): the prompt scored, nothing generated.
    max_tokens: int | None = Field(None, ge=0, le=MAX_OUTPUT_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: Annotated[bool, _BOOL_OR_NULL] = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=MAX_N)

    _whole_completion_ints = field_validator("logprobs", "best_of", "prompt", mode="before")(_whole)
    _completion_nulls = field_validator("echo", mode="before")(_null_is_default)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value):
        if isinstance(value, list) and (not value or any(isinstance(x, list) and not x for x in value)):
            raise ValueError("prompt must not be empty")
        if isinstance(value, list):
            if isinstance(value[0], int):
                if len(value) > MAX_PROMPT_TOKEN_IDS:
                    raise ValueError(f"a prompt may have at most {MAX_PROMPT_TOKEN_IDS} token ids")
            elif len(value) > MAX_PROMPTS:
                raise ValueError(f"prompt may hold at most {MAX_PROMPTS} prompts, not {len(value)}")
            elif isinstance(value[0], list) and any(len(ids) > MAX_PROMPT_TOKEN_IDS for ids in value):
                raise ValueError(f"a prompt may have at most {MAX_PROMPT_TOKEN_IDS} token ids")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_covers_n(cls, value, info: ValidationInfo):
        if value is not None and value < info.data.get("n", 1):
            raise ValueError("best_of must be at least n")
        return value

    @model_validator(mode="after")
    def _default_max_tokens(self) -> CompletionRequest:
        # OpenAI's legacy completions (and vLLM's) generate 16 tokens unless told otherwise, where
        # chat runs to the context's end. Set, not defaulted, so an upstream is sent it too (a
        # server with another default would outgrow the reservation).
        if self.max_tokens is None:
            self.max_tokens = DEFAULT_COMPLETION_TOKENS
        return self

    @model_validator(mode="after")
    def _echo_without_generation(self) -> CompletionRequest:
        # OpenAI's (and vLLM's) way to score a prompt: echo it, with its logprobs, and generate
        # nothing. Without echo, max_tokens 0 asks for nothing at all.
        if self.max_tokens == 0 and not self.echo:
            raise GatewayError(400, "max_tokens may be 0 only with echo: true (the prompt, scored)",
                               param="max_tokens")
        if self.max_tokens == 0 and self.beam_search:
            raise GatewayError(400, "a beam search generates tokens: max_tokens must be at least 1",
                               param="max_tokens")
        return self

    @property
    def echo_only(self) -> bool:
        """The prompt echoed (and scored), nothing generated."""
        return self.max_tokens == 0

    @property
    def output_limit(self) -> int | None:
        return self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


RequestBody = ChatCompletionRequest | CompletionRequest


def parse_body(model: type[RequestBody], raw: bytes) -> RequestBody:
    """The validated body, or a 400 GatewayError naming the field."""
    try:
        body = model.model_validate_json(raw)
        if body.model_extra:
            check_extensions(model.known_extensions, body.model_extra)
        return body
    except ValidationError as exc:
        raise _to_error(exc) from None


def _to_error(exc: ValidationError) -> GatewayError:
    first = _telling_error(exc.errors(include_url=False))
    if first["type"] == "json_invalid":
        return GatewayError(400, f"request body is not valid JSON ({first['msg']})")
    if first["type"] in ("model_type", "model_attributes_type") and not first["loc"]:
        return GatewayError(400, "request body must be a JSON object")
    param = param_path(_path(first)) or None
    msg = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        msg = f"'{param}' is a required property"
    elif param:
        msg = f"invalid value for '{param}': {msg}"
    return GatewayError(400, msg, param=param)


def _telling_error(errors: list[dict]) -> dict:
    """The error to report. A union tries its branches in order, so for a list or an object the
    first error is often the string branch's "should be a valid string"; a later error inside the
    value itself (a part's missing field, a list's bad item) says what is wrong."""
    first = errors[0]
    if not isinstance(first.get("input"), (list, dict)):
        return first
    where = _path(first)
    for error in errors[1:]:
        path = _path(error)
        if len(path) > len(where) and path[:len(where)] == where:
            return error
    return first


def _path(error: dict) -> list[str | int]:
    return [p for p in error["loc"] if not _is_union_tag(p)]


def _is_union_tag(part) -> bool:
    # pydantic adds the tried type to a union error's location (messages.0.content.str, or
    # guided_json.constrained-str for a bounded string): drop it.
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "TextPart", "RefusalPart")
                                      or part.startswith(("function-", "list[", "nullable[", "literal[",
                                                          "constrained-", "dict[")))
