"""Calibration text for activation-aware quantization: ShareGPT records 2,000-6,000, which
neither the benchmarks (file start) nor the held-out evaluation (>= 12,000) read."""

from __future__ import annotations

from gateway.bench.workload import iter_sharegpt_records

CALIBRATION_START, CALIBRATION_END = 2_000, 6_000


def calibration_sequences(tokenizer, chat_template, n: int = 16, max_tokens: int = 256) -> list[list[int]]:
    out: list[list[int]] = []
    for index, record in enumerate(iter_sharegpt_records()):
        if index < CALIBRATION_START:
            continue
        if index >= CALIBRATION_END or len(out) == n:
            break
        turns = record.get("conversations") or []
        if len(turns) < 2 or not turns[0].get("value") or not turns[1].get("value"):
            continue
        messages = [{"role": "user" if t.get("from") == "human" else "assistant", "content": t["value"]}
                    for t in turns[:2]]
        ids = tokenizer.encode(chat_template.render(messages, add_generation_prompt=False))[:max_tokens]
        if len(ids) >= 64:
            out.append(ids)
    return out
