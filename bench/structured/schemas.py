"""JSON schemas with the shapes apps ask for (nested objects, arrays, enums, required fields,
numbers with bounds), bounded so a sampled answer ends well within a few hundred tokens: shared
by the benchmark (compile times) and the structured-output tests (every answer valid)."""

from __future__ import annotations

import copy

_NAME = {"type": "string", "minLength": 1, "maxLength": 16}


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": False}


SCHEMAS: dict[str, dict] = {
    "person": _obj({"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "email": {"type": "string", "maxLength": 24}}, ["name", "age"]),
    "weather": _obj({"city": _NAME, "celsius": {"type": "number", "minimum": -60, "maximum": 60},
                     "sky": {"enum": ["clear", "cloudy", "rain", "snow"]}}),
    "order": _obj({"id": {"type": "integer", "minimum": 1, "maximum": 99999},
                   "items": {"type": "array", "minItems": 1, "maxItems": 3,
                             "items": _obj({"sku": _NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}})},
                   "paid": {"type": "boolean"}}),
    "address": _obj({"street": {"type": "string", "maxLength": 24}, "city": _NAME,
                     "country": {"enum": ["FR", "DE", "US", "JP"]},
                     "geo": _obj({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                  "lon": {"type": "number", "minimum": -180, "maximum": 180}})}),
    "review": _obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                    "title": {"type": "string", "maxLength": 20},
                    "tags": {"type": "array", "maxItems": 3, "items": {"enum": ["fast", "cheap", "good", "bad"]}}}),
    "event": _obj({"name": _NAME, "day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]},
                   "hour": {"type": "integer", "minimum": 0, "maximum": 23},
                   "attendees": {"type": "array", "maxItems": 2, "items": _NAME}}, ["name", "day", "hour"]),
    "config": _obj({"debug": {"type": "boolean"},
                    "level": {"enum": ["low", "mid", "high"]},
                    "limits": _obj({"cpu": {"type": "integer", "minimum": 1, "maximum": 64},
                                    "ratio": {"type": "number", "minimum": 0, "maximum": 1}})}),
    "book": _obj({"title": {"type": "string", "maxLength": 24},
                  "author": _obj({"first": _NAME, "last": _NAME}),
                  "year": {"type": "integer", "minimum": 1450, "maximum": 2030}}),
    "matrix": _obj({"rows": {"type": "array", "minItems": 1, "maxItems": 3,
                             "items": {"type": "array", "minItems": 1, "maxItems": 3,
                                       "items": {"type": "integer", "minimum": -9, "maximum": 9}}}}),
    "ticket": _obj({"priority": {"enum": ["p0", "p1", "p2"]},
                    "summary": {"type": "string", "maxLength": 24},
                    "owner": {"anyOf": [_NAME, {"type": "null"}]},
                    "estimate": {"type": "integer", "minimum": 0, "maximum": 40}}, ["priority", "summary", "owner"]),
}

PROMPTS: dict[str, str] = {
    "person": "Invent a person.", "weather": "Report today's weather somewhere.", "order": "Make up a shop order.",
    "address": "Give an address.", "review": "Review a restaurant.", "event": "Plan a meeting.",
    "config": "Write a service configuration.", "book": "Name a famous book.", "matrix": "Write a small matrix.",
    "ticket": "File a bug ticket.",
}

# The throughput run: every answer longer than the benchmark's output cap (at least 24 items), so
# constrained and plain requests run to the same length and only the grammar's cost differs.
LONG_LIST = _obj({"items": {"type": "array", "minItems": 24, "items": _obj({
    "name": {"type": "string", "maxLength": 24}, "count": {"type": "integer", "minimum": 0, "maximum": 1000},
    "kind": {"enum": ["fruit", "tool", "animal", "city"]}})}})


def variants(n: int) -> list[dict]:
    """n distinct schemas (new digests, same shapes): the SCHEMAS with renamed properties, for
    measuring fresh compiles rather than cache hits."""
    names = list(SCHEMAS)
    return [_renamed(copy.deepcopy(SCHEMAS[names[i % len(names)]]), f"_{i}") for i in range(n)]


def _renamed(schema, suffix: str):
    """Every property name (and its `required` entry) with `suffix` appended, at every level."""
    if isinstance(schema, list):
        return [_renamed(s, suffix) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name + suffix: _renamed(sub, suffix) for name, sub in value.items()}
        elif key == "required":
            out[key] = [name + suffix for name in value]
        elif key in ("enum", "const"):
            out[key] = value
        else:
            out[key] = _renamed(value, suffix)
    return out


def prompt_messages(name: str) -> list[dict]:
    return [{"role": "system", "content": "You answer in JSON only."},
            {"role": "user", "content": f"{PROMPTS[name]} Reply with a JSON object."}]
