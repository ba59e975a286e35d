"""The routing benchmark's prompts: first ShareGPT exchanges from a slice that no tuning reads,
each a question and the reference answer both tiers are scored on."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from bench.datasets.sharegpt import (ROUTING_HELDOUT_START, ROUTING_TUNING_END, ROUTING_TUNING_START,
                                     _first_exchange, iter_sharegpt_records)

RoutingSlice = Literal["heldout", "tuning", "training"]
# (first record, end record or None); the held-out slice runs to the end of the file.
SLICES: dict[str, tuple[int, int | None]] = {
    "heldout": (ROUTING_HELDOUT_START, None),
    "tuning": (ROUTING_TUNING_START, ROUTING_TUNING_END),
    # a learned router's labels: every record before the held-out slice
    "training": (0, ROUTING_HELDOUT_START),
}


class WorkloadError(ValueError):
    """The slice cannot supply the prompts asked for (a usage problem, not a crash)."""


@dataclass(frozen=True)
class RoutingPrompt:
    prompt_id: str
    record_index: int
    question: str        # the first human turn, as sent to either tier
    reference: str       # the first gpt answer, cut to the reference cap
    reference_truncated: bool


@dataclass(frozen=True)
class WorkloadCaps:
    """Lengths in tokens of the small model's tokenizer: a prompt whose chat-templated form is
    longer than max_prompt_tokens is skipped (cutting a question changes it); a reference
    longer than max_reference_tokens is cut (its start is still a fair answer to score)."""
    max_prompt_tokens: int = 512
    max_reference_tokens: int = 256
    min_reference_tokens: int = 8


def slice_bounds(name: RoutingSlice) -> tuple[int, int | None]:
    return SLICES[name]


def load_routing_prompts(tokenizer, chat_template, n: int, caps: WorkloadCaps, slice_name: RoutingSlice = "heldout",
                         records: Iterator[dict] | None = None) -> list[RoutingPrompt]:
    """The first `n` usable exchanges of the slice, in file order (deterministic, so two runs
    and two routers always see the same prompts). `records` replaces the ShareGPT file (tests)."""
    start, end = slice_bounds(slice_name)
    out: list[RoutingPrompt] = []
    seen: set[str] = set()
    for index, record in enumerate(records if records is not None else iter_sharegpt_records()):
        if index < start:
            continue
        if (end is not None and index >= end) or len(out) >= n:
            break
        prompt = _usable(record, index, tokenizer, chat_template, caps)
        if prompt is not None and prompt.prompt_id not in seen:
            seen.add(prompt.prompt_id)
            out.append(prompt)
    if len(out) < n:
        raise WorkloadError(f"the {slice_name} slice holds only {len(out)} usable prompts, {n} asked for")
    return out


def _usable(record: dict, index: int, tokenizer, chat_template, caps: WorkloadCaps) -> RoutingPrompt | None:
    exchange = _first_exchange(record)
    if exchange is None:
        return None
    question, answer = exchange
    templated = chat_template.render([{"role": "user", "content": question}])
    if len(tokenizer.encode(templated)) > caps.max_prompt_tokens:
        return None
    reference, truncated = cut_reference(tokenizer, answer, caps.max_reference_tokens)
    if len(tokenizer.encode(reference, add_special_tokens=False)) < caps.min_reference_tokens:
        return None
    return RoutingPrompt(str(record.get("id") or f"record-{index}"), index, question, reference, truncated)


def cut_reference(tokenizer, answer: str, max_tokens: int) -> tuple[str, bool]:
    """The answer's text up to the end of its `max_tokens`-th token, cut at a character
    boundary (the tokenizer's offsets), so the text both tiers score is valid UTF-8."""
    encoding = tokenizer.backend.encode(answer, add_special_tokens=False)
    if len(encoding.ids) <= max_tokens:
        return answer, False
    end = encoding.offsets[max_tokens - 1][1]
    return answer[:end], True
