"""The small tier's prompt hidden states for a learned router: its final hidden states at each
prompt's last token and the rows before it a gain model reads, as the engine reports them with
the first token (SamplingParams.prompt_hidden, prompt_hidden_rows).

Computing them costs one small-model prefill per prompt (a tenth of scoring both tiers), so a
cache file keeps them by ShareGPT record for reruns of `bench routing-train`; the cache names
the model and dtype it was computed with, and one made otherwise is recomputed, not reused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bench.routing.scoring import encode_prompt, final_hidden, hidden_at_rows


def prompt_hidden_state(loaded, question: str, rows: tuple[int, ...] = (0,)) -> np.ndarray:
    """The loaded model's final hidden states `rows` back from the last token of the
    chat-templated question, concatenated."""
    ids = encode_prompt(loaded, question)
    return np.array(hidden_at_rows(final_hidden(loaded.model, ids), len(ids), rows), dtype=np.float64)


def _read_cache(path: Path | None, identity: str) -> dict[int, np.ndarray]:
    if path is None or not path.exists():
        return {}
    with np.load(path, allow_pickle=False) as data:
        if str(data["identity"]) != identity:
            return {}
        return {int(r): v for r, v in zip(data["records"], data["states"])}


def _write_cache(path: Path, identity: str, states: dict[int, np.ndarray]) -> None:
    records = sorted(states)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, identity=np.array(identity), records=np.array(records, dtype=np.int64),
             states=np.stack([states[r] for r in records]))


def prompt_hidden_states(loaded, questions: dict[int, str], cache: Path | None = None,
                         console: Console | None = None, rows: tuple[int, ...] = (0,)) -> dict[int, np.ndarray]:
    """Each record's prompt hidden state, from the cache where it holds them."""
    identity = f"{loaded.name}|{loaded.quantization or 'dense'}|{loaded.dtype}|rows {','.join(map(str, rows))}"
    states = _read_cache(cache, identity)
    todo = [r for r in questions if r not in states]
    if todo:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TimeRemainingColumn())
        with Progress(*columns, console=console or Console(stderr=True)) as bar:
            task = bar.add_task("small: prompt hidden states", total=len(todo))
            for record in todo:
                states[record] = prompt_hidden_state(loaded, questions[record], rows)
                bar.advance(task)
        if cache is not None:
            _write_cache(cache, identity, states)
    return {r: states[r] for r in questions}
