"""OpenAI response shapes for answers the gateway builds itself (embedded tiers):
chat.completion / text_completion bodies, their stream chunks (tool-call deltas included), and logprobs."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.detokenizer import IncrementalDetokenizer
from engines.sampler import TokenLogprob
from engines.tokenizer import TextTokenizer

SSE_DONE = b"data: [DONE]\n\n"
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_event(obj: dict) -> bytes:
    return b"data: " + _dumps(obj).encode() + b"\n\n"


def json_bytes(obj: dict) -> bytes:
    return _dumps(obj).encode()


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable stand-ins for the 256 byte values."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


class TokenPieces:
    """Each token's own bytes and text, as OpenAI's logprobs report them (cached per id)."""

    def __init__(self, tokenizer: TextTokenizer):
        self._tok = tokenizer
        self._byte_level = type(tokenizer.backend.decoder).__name__ == "ByteLevel"
        self._alphabet = _bytes_to_unicode() if self._byte_level else {}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is not None:
            return hit
        raw = None
        if self._byte_level and token_id not in self._tok.special_ids:
            surface = self._tok.backend.id_to_token(token_id)
            if surface is not None and all(c in self._alphabet for c in surface):
                raw = bytes(self._alphabet[c] for c in surface)
        if raw is None:
            raw = self._tok.decode([token_id], skip_special_tokens=False).encode()
        hit = self._cache[token_id] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._tok


class TokenIdPieces:
    """vLLM's `return_tokens_as_token_ids`: each token reported as "token_id:N", so a client can
    tell apart tokens whose text is the same (or is not valid UTF-8 alone). Text offsets still
    count the tokens' text."""

    def __init__(self, text_pieces: TokenPieces):
        self._text = text_pieces

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        name = f"token_id:{token_id}"
        return name, list(name.encode())

    @property
    def tokenizer(self) -> TextTokenizer:
        return self._text.tokenizer


def chat_logprobs(lps: list[TokenLogprob], pieces: TokenPieces) -> dict:
    content = []
    for lp in lps:
        text, raw = pieces.piece(lp.token_id)
        top = []
        for tid, val in lp.top:
            t_text, t_raw = pieces.piece(tid)
            top.append({"token": t_text, "logprob": val, "bytes": t_raw})
        content.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


class TextOffsets:
    """Completions' `text_offset`: where each token's text starts in the choice's text, in
    characters. The tokens are detokenized as the engine detokenizes the answer
    (engines/detokenizer.py), so a token that ends inside a character adds nothing until the
    character is whole, and the offsets index the very text the client has, whole or streamed,
    whatever a stream held back. A special token counts its spelling, as an echoed prompt shows it."""

    def __init__(self, pieces: TokenPieces | TokenIdPieces):
        self._text = IncrementalDetokenizer(pieces.tokenizer, [], skip_special_tokens=False)

    def next(self, token_id: int) -> int:
        at = len(self._text.text)
        self._text.push(token_id, check_stop=False)
        return at


def completion_logprobs(lps: list[TokenLogprob], pieces: TokenPieces, offsets_of: TextOffsets | None = None) -> dict:
    """`offsets_of`: the choice's offsets so far (a stream's earlier chunks); None: from the start."""
    offsets_of = offsets_of or TextOffsets(pieces)
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        text, _ = pieces.piece(lp.token_id)
        tokens.append(text)
        values.append(lp.logprob)
        # An echoed prompt's first token has no logprob, and no alternatives (OpenAI's null).
        # Otherwise the token itself is among them, as at OpenAI and vLLM: up to logprobs + 1.
        top = None
        if lp.logprob is not None:
            top = {}
            for tid, val in lp.top:      # likeliest first: of tokens that read alike, the likeliest's value
                top.setdefault(pieces.piece(tid)[0], val)
            top[text] = lp.logprob       # the sampled token's own value, even where pieces read alike
        tops.append(top)
        offsets.append(offsets_of.next(lp.token_id))
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def vllm_prompt_logprobs(lps: list[TokenLogprob], pieces: TokenPieces, top: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first token, then per token a map from token id
    to its logprob, rank and text: the prompt's own token and the `top` likeliest."""
    out: list[dict | None] = [None]
    for lp in lps[1:]:
        entry = {str(lp.token_id): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": pieces.piece(lp.token_id)[0]}}
        for rank, (tid, value) in enumerate(lp.top[:top], start=1):
            entry.setdefault(str(tid), {"logprob": value, "rank": rank, "decoded_token": pieces.piece(tid)[0]})
        out.append(entry)
    return out


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None       # vLLM's: the stop string or stop token id that ended it
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tool_calls: list[dict] | None = None     # parsed from the text (gateway/tool_calls.py); text is then the rest
    prompt_logprobs: list[dict | None] | None = None    # vLLM's, rendered, when the request asked


def finish_reason(engine_reason: str | None, called: bool = False) -> str | None:
    # The engine says "abort" when the request was cancelled; OpenAI has no such reason. An answer
    # that called tools ends in "tool_calls" unless it was cut off.
    if called and engine_reason in ("stop", "abort"):
        return "tool_calls"
    return "stop" if engine_reason == "abort" else engine_reason


def _message(c: ChoiceResult) -> dict:
    if c.tool_calls is None:
        return {"role": "assistant", "content": c.text, "refusal": None}
    return {"role": "assistant", "content": c.text or None, "refusal": None, "tool_calls": c.tool_calls}


def chat_body(rid: str, created: int, model: str, choices: list[ChoiceResult], usage: dict,
              pieces: TokenPieces | None) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{
            "index": c.index,
            "message": _message(c),
            "logprobs": chat_logprobs(c.logprobs, pieces) if pieces is not None else None,
            "finish_reason": finish_reason(c.finish_reason, bool(c.tool_calls)), "stop_reason": c.stop_reason,
        } for c in choices],
        "usage": usage,
        # vLLM puts a chat's prompt logprobs beside the choices: every choice has the same prompt.
        **({"prompt_logprobs": choices[0].prompt_logprobs} if choices and choices[0].prompt_logprobs is not None else {}),
    }


def completion_body(rid: str, created: int, model: str, choices: list[ChoiceResult], usage: dict,
                    pieces: TokenPieces | None) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{
            "index": c.index, "text": c.text,
            "logprobs": completion_logprobs(c.logprobs, pieces) if pieces is not None else None,
            "finish_reason": finish_reason(c.finish_reason), "stop_reason": c.stop_reason,
            **({"prompt_logprobs": c.prompt_logprobs} if c.prompt_logprobs is not None else {}),
        } for c in choices],
        "usage": usage,
    }


class ChunkWriter:
    """Stream chunks of one response, in chat or completion shape."""

    def __init__(self, chat: bool, rid: str, created: int, model: str, include_usage: bool,
                 pieces: TokenPieces | None, usage_so_far: Callable[[int], dict] | None = None):
        """`usage_so_far`: vLLM's continuous usage stats, the usage a chunk of choice i carries
        (else null)."""
        self.chat = chat
        self._head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                      "created": created, "model": model}
        self.include_usage = include_usage
        self.pieces = pieces
        self._usage_so_far = usage_so_far
        self._offsets: dict[int, TextOffsets] = {}     # completions' text_offset, per choice

    def _event(self, choice: dict) -> bytes:
        obj = {**self._head, "choices": [choice]}
        if self.include_usage:
            obj["usage"] = self._usage_so_far(choice["index"]) if self._usage_so_far is not None else None
        return sse_event(obj)

    def role(self, index: int) -> bytes:
        return self._event({"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})

    def delta(self, index: int, text: str, lps: list[TokenLogprob] | None, reason: str | None,
              stop_reason: str | int | None = None) -> bytes:
        """`reason` (and vLLM's `stop_reason`, on that chunk only): the choice's last chunk."""
        logprobs = None
        if self.pieces is not None and lps:
            if self.chat:
                logprobs = chat_logprobs(lps, self.pieces)
            else:
                offsets = self._offsets.get(index)
                if offsets is None:
                    offsets = self._offsets[index] = TextOffsets(self.pieces)
                logprobs = completion_logprobs(lps, self.pieces, offsets)
        ending = {} if reason is None else {"stop_reason": stop_reason}
        if not self.chat:
            return self._event({"index": index, "text": text, "logprobs": logprobs,
                                "finish_reason": finish_reason(reason), **ending})
        delta = {"content": text} if (text or reason is None) else {}
        return self._event({"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": finish_reason(reason), **ending})

    def tool_call_start(self, index: int, call_index: int, call_id: str, name: str) -> bytes:
        """A call's first chunk: its index among the choice's calls, its id and name, once."""
        call = {"index": call_index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        return self._event({"index": index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None})

    def tool_call_arguments(self, index: int, call_index: int, fragment: str) -> bytes:
        call = {"index": call_index, "function": {"arguments": fragment}}
        return self._event({"index": index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None})

    def finish(self, index: int, reason: str | None, called: bool, stop_reason: str | int | None = None) -> bytes:
        """The choice's last chunk: an empty delta with its finish reason (and vLLM's stop_reason)."""
        return self._event({"index": index, "delta": {}, "logprobs": None,
                            "finish_reason": finish_reason(reason, called), "stop_reason": stop_reason})

    def usage(self, usage: dict) -> bytes:
        return sse_event({**self._head, "choices": [], "usage": usage})
