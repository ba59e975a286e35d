"""The fixed held-out ShareGPT slice for perplexity: conversations far past the records the
benchmarks and calibration read, rendered with the model's chat template."""

from __future__ import annotations

from bench.datasets.sharegpt import HELDOUT_START, VALIDATION_START, iter_sharegpt_records

__all__ = ["HELDOUT_START", "VALIDATION_START", "heldout_sequences"]


def heldout_sequences(tokenizer, chat_template, n: int = 24, max_tokens: int = 512,
                      min_tokens: int = 64, start: int = HELDOUT_START) -> list[list[int]]:
    """Token ids of the first human/gpt exchange of `n` held-out conversations (from record
    `start`; VALIDATION_START gives a slice for tuning that neither calibration nor the final
    evaluation reads)."""
    if n < 1:
        # len(out) == n would never hold: the scan would read the whole dataset for nothing.
        raise ValueError(f"n must be >= 1, not {n}")
    out: list[list[int]] = []
    for index, record in enumerate(iter_sharegpt_records()):
        if index < start:
            continue
        turns = record.get("conversations") or []
        if len(turns) < 2 or turns[0].get("from") != "human" or turns[1].get("from") != "gpt":
            continue
        if not turns[0].get("value") or not turns[1].get("value"):
            continue
        text = chat_template.render([{"role": "user", "content": turns[0]["value"]},
                                     {"role": "assistant", "content": turns[1]["value"]}],
                                    add_generation_prompt=False)
        ids = tokenizer.encode(text)[:max_tokens]
        if len(ids) >= min_tokens:
            out.append(ids)
        if len(out) == n:
            break
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} held-out conversations found")
    return out
