"""Reading what an upstream answers, defensively: a whole JSON answer (an event stream is read
in upstream_stream.py), its usage, and the facts its span reports.

An upstream is another program on the network, so its bytes are input like a client's: any of
them may be malformed (not JSON, JSON that is not an object, usage that is not a count).
Everything here either returns a value or raises UpstreamFailure, which the chain walk treats as
the tier's failure (fallback, breaker); no other exception may escape, since one would end the
request with a 500 and count nothing.
"""

from __future__ import annotations

import json
import math

from gateway.context import Usage
from gateway.tiers.upstream_errors import UpstreamFailure

MAX_REPORTED_TOKENS = 1 << 31      # more than any context: a count past it is not a count


def _excerpt(raw: bytes) -> str:
    return repr(raw[:200])


def _loads(raw: bytes, code: str):
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):    # RecursionError: nesting deeper than the parser's stack
        raise UpstreamFailure(code, f"not JSON: {_excerpt(raw)}") from None


# ---- whole answers ---------------------------------------------------------------------
def read_answer(raw: bytes) -> dict:
    """The answer as a dict with a list of choice objects, or UpstreamFailure."""
    data = _loads(raw, "invalid_json")
    if not isinstance(data, dict):
        raise UpstreamFailure("not_an_object", f"answer is a JSON {type(data).__name__}: {_excerpt(raw)}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise UpstreamFailure("bad_choices", f"choices is not a list of objects: {_excerpt(raw)}")
    return data


def _count(value, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_REPORTED_TOKENS:
        raise UpstreamFailure("bad_usage", f"usage {name} is {value!r:.80}")
    return value


def read_usage(value) -> Usage:
    """The reported usage; absent or null is zero (the attempt charges its estimate)."""
    if value is None:
        return Usage()
    if not isinstance(value, dict):
        raise UpstreamFailure("bad_usage", f"usage is a {type(value).__name__}")
    details = value.get("prompt_tokens_details")
    if details is not None and not isinstance(details, dict):
        raise UpstreamFailure("bad_usage", f"prompt_tokens_details is a {type(details).__name__}")
    cached = _count(details.get("cached_tokens"), "cached_tokens") if details else 0
    return Usage(_count(value.get("prompt_tokens"), "prompt_tokens"),
                 _count(value.get("completion_tokens"), "completion_tokens"), cached)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def answer_logprobs(data: dict) -> list[float]:
    """The token logprobs of the answer's first choice, in chat or completions shape; [] without
    any. (A cascade judges single-choice requests only.)"""
    for choice in data.get("choices") or ():
        lp = choice.get("logprobs") if isinstance(choice, dict) else None
        if not isinstance(lp, dict):
            return []
        content, tokens = lp.get("content"), lp.get("token_logprobs")
        if isinstance(content, list):
            return [t["logprob"] for t in content if isinstance(t, dict) and _number(t.get("logprob"))]
        if isinstance(tokens, list):
            return [v for v in tokens if _number(v)]
        return []
    return []


def hide_cached_tokens(data: dict) -> bool:
    """Zero the answer's (or chunk's) `cached_tokens` (an upstream that cannot keep tenants'
    caches apart would tell one tenant what another sent); True if there was a count to hide.
    Call after read_usage accepted the usage."""
    details = (data.get("usage") or {}).get("prompt_tokens_details")
    if not details or not details.get("cached_tokens"):
        return False
    details["cached_tokens"] = 0
    return True


def ascii_json(data: dict) -> bytes:
    """An answer parsed from an upstream, written back with ASCII escapes, so that anything
    json.loads accepts, lone surrogate escapes too, can be written."""
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode()


def strip_logprobs(data: dict) -> None:
    for choice in data["choices"]:
        choice["logprobs"] = None


class AnswerFacts:
    """What the tier span reports of an answer: id, model, finish reasons, usage, and the text,
    kept only for spans whose tenant opted in to content recording. Reads any shape."""

    __slots__ = ("finish_reasons", "keep_text", "model", "response_id", "texts", "usage")

    def __init__(self, keep_text: bool):
        self.keep_text = keep_text
        self.response_id = self.model = None
        self.finish_reasons: dict[int, str] = {}
        self.texts: dict[int, list[str]] = {}
        self.usage: Usage | None = None

    def read(self, data: dict) -> None:
        """One JSON answer, or one stream chunk."""
        if isinstance(data.get("id"), str):
            self.response_id = data["id"]
        if isinstance(data.get("model"), str):
            self.model = data["model"]
        choices = data.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            index = index if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 1024 else 0
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reasons[index] = choice["finish_reason"]
            if self.keep_text:
                part = choice.get("delta") or choice.get("message") or {}
                text = part.get("content") if isinstance(part, dict) else None
                text = choice.get("text") if text is None else text
                if isinstance(text, str):
                    self.texts.setdefault(index, []).append(text)

    def finish(self, span) -> None:
        indexes = sorted(set(self.finish_reasons) | set(self.texts))
        reasons = [self.finish_reasons.get(i, "error") for i in indexes]
        usage = self.usage
        span.finish(response_id=self.response_id, response_model=self.model, finish_reasons=reasons,
                    input_tokens=usage.prompt_tokens if usage else None,
                    output_tokens=usage.completion_tokens if usage else None,
                    cache_read_tokens=usage.cached_tokens if usage else None)
        if self.keep_text:
            span.record_output(["".join(self.texts.get(i, [])) for i in indexes], reasons)
