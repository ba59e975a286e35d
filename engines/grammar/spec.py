"""What a request constrains its output to, as a plain value: built by the caller (the gateway
turns response_format and tool choices into one), compiled by the engine.

A spec is identified by the digest of its kind and text, which keys the compile cache: requests
with the same schema share one compiled grammar. Key order is kept, not sorted: a schema's
`properties` order is the order the answer's keys are written in.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

# json_schema and lark come from response_format and tools; regex, choice (a JSON list of strings)
# and grammar (Lark or GBNF) from vLLM's guided decoding fields.
GrammarKind = Literal["json_schema", "lark", "regex", "choice", "grammar"]

# How JSON is written under a schema: the separators models use most (", " and ": ") and no other
# whitespace, so a sampled answer cannot wander into unbounded runs of spaces or newlines.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    text: str                        # the schema as canonical JSON, or the Lark grammar
    param: str = field(default="response_format", compare=False)   # the request field it came from

    @classmethod
    def json_schema(cls, schema: dict[str, Any], param: str = "response_format") -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False), param)

    @classmethod
    def json_object(cls, param: str = "response_format") -> GrammarSpec:
        """Any JSON object (response_format json_object)."""
        return cls.json_schema({"type": "object"}, param)

    @classmethod
    def lark(cls, grammar: str, param: str = "tools") -> GrammarSpec:
        return cls("lark", grammar, param)

    @classmethod
    def regex(cls, pattern: str, param: str) -> GrammarSpec:
        return cls("regex", pattern, param)

    @classmethod
    def choice(cls, options: list[str], param: str) -> GrammarSpec:
        """Exactly one of `options`."""
        return cls("choice", json.dumps(options, ensure_ascii=False), param)

    @classmethod
    def grammar(cls, text: str, param: str) -> GrammarSpec:
        """A context-free grammar in Lark or GBNF (told apart by the compiler)."""
        return cls("grammar", text, param)

    @property
    def digest(self) -> str:
        return hashlib.blake2b(f"{self.kind}\0{self.text}".encode(), digest_size=16).hexdigest()
