"""`response_format` (chat and completions): its shape and bounds, checked at parse time so a bad
one is a 400 naming `response_format` before any tier runs, and its meaning for an embedded
engine (a GrammarSpec). Upstream tiers get the field exactly as sent.

    {"type": "text"}                                   no constraint
    {"type": "json_object"}                            any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}

Bounds keep a hostile schema from stalling a tier: its JSON size and nesting depth here, and
llguidance's compile limits and timeout in the engine (engines/grammar/compiler.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from engines.grammar import GrammarSpec

MAX_SCHEMA_CHARS = 64 * 1024
# Every constraint's text (a regex, a grammar, a choice's options) has the schema's bound: the
# compiler's stack is sized for chains of references or rules that long (engines/grammar/compiler.py).
MAX_CONSTRAINT_CHARS = MAX_SCHEMA_CHARS
MAX_SCHEMA_DEPTH = 32
MAX_DESCRIPTION_CHARS = 16 * 1024
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_TYPES = ("text", "json_object", "json_schema")
_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_VALUES = ("enum", "const", "default", "examples")      # data, not schemas


def check_response_format(value: dict[str, Any]) -> None:
    """Raises ValueError (a 400 naming response_format) for a malformed or oversized format."""
    kind = value.get("type")
    if kind not in _TYPES:
        raise ValueError(f"response_format.type must be one of {', '.join(_TYPES)}")
    if kind != "json_schema":
        if set(value) - {"type"}:
            raise ValueError(f"response_format of type {kind} takes no other field")
        return
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema must be an object with name and schema")
    unknown = set(spec) - _SCHEMA_KEYS
    if unknown:
        raise ValueError(f"response_format.json_schema has unknown field(s): {', '.join(sorted(unknown))}")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError("response_format.json_schema.name must be 1-64 characters of a-z, A-Z, 0-9, _ and -")
    if not isinstance(spec.get("strict", False), (bool, type(None))):
        raise ValueError("response_format.json_schema.strict must be a boolean")
    description = spec.get("description")
    if description is not None and (not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS):
        raise ValueError(f"response_format.json_schema.description must be a string of at most "
                         f"{MAX_DESCRIPTION_CHARS} characters")
    check_schema(spec.get("schema", {}), "response_format.json_schema.schema")


def check_schema(schema: Any, where: str) -> None:
    """A JSON Schema object within the size and depth bounds (its meaning is the compiler's)."""
    if not isinstance(schema, dict):
        raise ValueError(f"{where} must be a JSON Schema object")
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_CHARS:
        raise ValueError(f"{where} may hold at most {MAX_SCHEMA_CHARS} characters, not {size}")
    if schema_depth(schema) > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where} is nested deeper than {MAX_SCHEMA_DEPTH} levels")


def schema_depth(value: Any) -> int:
    """Nesting depth of objects and arrays, without recursion (a deep value must not blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


# Keywords beside `properties` that let other schemas add keys to the same object: closing it
# would forbid those keys.
_EXTENDED_BY = ("allOf", "anyOf", "oneOf", "$ref", "not", "if", "then", "else", "dependentSchemas",
                "unevaluatedProperties")
_DEFS = ("$defs", "definitions")
# llguidance's options for a schema, which the gateway sets (compact separators, no free
# whitespace): a client's copy of the key is dropped, not obeyed.
_ENGINE_OPTIONS_KEY = "x-guidance"


def closed_objects(schema: Any) -> Any:
    """A copy of `schema` in which every object schema with `properties` and no
    `additionalProperties` allows no other keys, where the object is all its schema says of the
    instance. Every answer under it is valid under the original (it only narrows what may be
    generated), and a sampled answer stays within the keys it asked for instead of inventing
    more: OpenAI's strict mode requires as much of the schema itself. Objects that other
    schemas extend stay open: the parts of an `allOf`, a schema with `properties` beside a
    combinator or `$ref`, the branches of an `anyOf` under such properties, and the definitions
    those refer to; closing them would forbid the keys the other parts add."""
    return _close(schema, True, _extended_refs(schema))


def rebased_refs(schema: Any, pointer: str) -> Any:
    """A copy of `schema` to be placed at JSON pointer `pointer` of a larger document: every
    local `$ref` ("#", "#/$defs/Loc", "#/properties/a") points into the copy again, so a tool's
    parameters keep their own definitions and recursion when nested under a call's schema."""
    if isinstance(schema, list):
        return [rebased_refs(s, pointer) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = "#" + pointer + value[1:]
        elif key in _VALUES:
            out[key] = value
        else:
            out[key] = rebased_refs(value, pointer)
    return out


def _close(schema: Any, closable: bool, extended: set[str]) -> Any:
    if isinstance(schema, list):
        return [_close(s, True, extended) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    has_keys = any(k in schema for k in ("properties", "patternProperties", "additionalProperties"))
    for key, value in schema.items():
        if key == _ENGINE_OPTIONS_KEY:
            continue
        if key in _VALUES:
            out[key] = value
        elif key in _DEFS and isinstance(value, dict):
            out[key] = {name: _close(sub, f"#/{key}/{name}" not in extended, extended)
                        for name, sub in value.items()}
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            part = key != "dependentSchemas"
            out[key] = {name: _close(sub, part, extended) for name, sub in value.items()}
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_close(s, False, extended) for s in value]
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            out[key] = [_close(s, not has_keys, extended) for s in value]
        else:
            out[key] = _close(value, True, extended)
    if closable and "properties" in out and not any(k in out for k in _EXTENDED_BY) \
            and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def _extended_refs(schema: Any) -> set[str]:
    """The `$ref` targets that other schemas extend: referred to by a part of an `allOf`, or beside
    an object's own keys or combinators (walked without recursion: depth is the caller's bound)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        ref = item.get("$ref")
        if isinstance(ref, str) and any(k in item for k in ("properties", "allOf", "anyOf", "oneOf")):
            found.add(ref)
        parts = item.get("allOf")
        if isinstance(parts, list):
            found.update(p["$ref"] for p in parts if isinstance(p, dict) and isinstance(p.get("$ref"), str))
        stack.extend(v for k, v in item.items() if k not in _VALUES)
    return found


def response_format_grammar(value: dict[str, Any] | None) -> GrammarSpec | None:
    """The engine constraint a (checked) response_format asks for; None for text or none."""
    if not value or value.get("type") == "text":
        return None
    if value["type"] == "json_object":
        return GrammarSpec.json_object()
    schema = value["json_schema"].get("schema") or {}
    return GrammarSpec.json_schema(closed_objects(schema) if schema else {"type": "object"})
