"""vLLM's guided decoding fields as an embedded engine's constraint.

vLLM clients constrain output with `guided_json`, `guided_regex`, `guided_choice` and
`guided_grammar`, or with the newer `structured_outputs` object holding the same under `json`,
`regex`, `choice`, `grammar` and `json_object`. An embedded tier enforces each of them with the
grammar engine that serves response_format (engines/grammar), so a client moving from vLLM gets
the output it asked for, never unconstrained text. Their types and sizes were checked at parse
time (gateway/schema_extensions.py); here each becomes a GrammarSpec, and a request naming more
than one constraint, or an option the engine does not have, is a 400 naming the field. Upstream
tiers never come here: they forward the fields as sent.
"""

from __future__ import annotations

from typing import Any

import pydantic_core

from engines.grammar import GrammarSpec
from gateway.errors import GatewayError
from gateway.response_format import MAX_CONSTRAINT_CHARS, check_schema, closed_objects

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# structured_outputs' keys that carry a constraint, and those that tune how vLLM builds one: any
# answer this engine writes (compact JSON, closed objects) satisfies them either way.
_STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
_STRUCTURED_TUNING = ("disable_any_whitespace", "disable_additional_properties", "disable_fallback", "backend")


def guided_grammar(extra: dict[str, Any]) -> GrammarSpec | None:
    """The constraint the body's guided decoding fields ask for (None: none), or a 400."""
    if extra.get("guided_whitespace_pattern") is not None:
        raise GatewayError(400, "guided_whitespace_pattern is not supported by embedded tiers: JSON is written "
                                "with single spaces after ',' and ':'", param="guided_whitespace_pattern")
    given = [(name, extra[name]) for name in GUIDED_FIELDS if extra.get(name) is not None]
    structured = extra.get("structured_outputs")
    if structured is not None:
        given += _structured_fields(structured)
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise GatewayError(400, f"only one guided decoding constraint may be given, not {names}", param=given[1][0])
    name, value = given[0]
    return _spec(name.rsplit(".", 1)[-1].removeprefix("guided_"), value, name)


def _structured_fields(value: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for key, item in value.items():
        where = f"structured_outputs.{key}"
        if key in _STRUCTURED_KINDS:
            if item is not None and item is not False:
                out.append((where, item))
        elif key not in _STRUCTURED_TUNING and item is not None:    # whitespace_pattern, structural_tag, ...
            raise GatewayError(400, f"{where} is not supported by embedded tiers", param=where)
    return out


def _spec(kind: str, value: Any, param: str) -> GrammarSpec:
    if kind == "json_object":
        if value is not True:
            raise GatewayError(400, f"{param} must be true", param=param)
        return GrammarSpec.json_object(param)
    if kind == "json":
        schema = _schema(value, param)
        return GrammarSpec.json_schema(closed_objects(schema) if schema else {"type": "object"}, param)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise GatewayError(400, f"{param} must be a non-empty list of non-empty strings", param=param)
        _check_size(sum(len(c) for c in value), param)
        return GrammarSpec.choice(value, param)
    if not isinstance(value, str) or not value:
        raise GatewayError(400, f"{param} must be a non-empty string", param=param)
    _check_size(len(value), param)
    return GrammarSpec.regex(value, param) if kind == "regex" else GrammarSpec.grammar(value, param)


def _check_size(chars: int, param: str) -> None:
    # guided_* were bounded at parse time; structured_outputs' values arrive here unchecked.
    if chars > MAX_CONSTRAINT_CHARS:
        raise GatewayError(400, f"{param} may hold at most {MAX_CONSTRAINT_CHARS} characters, not {chars}",
                           param=param)


def _schema(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, str):
        _check_size(len(value), param)
        try:
            # pydantic's parser: it bounds the nesting and refuses lone surrogate escapes, which
            # json.loads lets through to fail later as text nothing can encode.
            value = pydantic_core.from_json(value)
        except ValueError as exc:
            raise GatewayError(400, f"{param} is not valid JSON ({exc})", param=param) from None
    try:
        check_schema(value, param)
    except ValueError as exc:
        raise GatewayError(400, str(exc), param=param) from None
    return value
