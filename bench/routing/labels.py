"""Training labels for a learned router: each prompt of the training slice scored on both
tiers (bits per byte of the reference answer, as `bench routing` scores the held-out slice).

Scoring thousands of prompts on two models takes hours on a small machine, so the labels are
written one JSON line per prompt as each is scored, and a rerun with the same output file
continues where the last one stopped (prompts already in the file are not scored again). The
question text is not stored: the line names its ShareGPT record, and training reads the text
from the dataset, so a label file is small and holds no user text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from bench.routing.scoring import score_question
from bench.routing.workload import RoutingSlice, WorkloadCaps, load_routing_prompts
from engines.loaded_model import load_model


@dataclass(frozen=True)
class LabelOptions:
    num_prompts: int = 3000
    small: str = "default"
    large: str = "qwen"
    dtype: str = "float32"
    caps: WorkloadCaps = field(default_factory=WorkloadCaps)
    slice_name: RoutingSlice = "training"


@dataclass(frozen=True)
class PromptLabel:
    prompt_id: str
    record_index: int
    small_bpb: float
    large_bpb: float
    reference_bytes: int
    small_prompt_tokens: int
    large_prompt_tokens: int
    small_reference_tokens: int
    large_reference_tokens: int

    @property
    def gain(self) -> float:
        """What the large tier adds, in bits per byte (negative: it does worse)."""
        return self.small_bpb - self.large_bpb

    def as_json(self) -> str:
        return json.dumps({"id": self.prompt_id, "record": self.record_index, "small_bpb": self.small_bpb,
                           "large_bpb": self.large_bpb, "reference_bytes": self.reference_bytes,
                           "small_prompt_tokens": self.small_prompt_tokens,
                           "large_prompt_tokens": self.large_prompt_tokens,
                           "small_reference_tokens": self.small_reference_tokens,
                           "large_reference_tokens": self.large_reference_tokens})

    @classmethod
    def from_json(cls, row: dict) -> PromptLabel:
        return cls(str(row["id"]), int(row["record"]), float(row["small_bpb"]), float(row["large_bpb"]),
                   int(row["reference_bytes"]), int(row["small_prompt_tokens"]), int(row["large_prompt_tokens"]),
                   int(row["small_reference_tokens"]), int(row["large_reference_tokens"]))


class LabelFileError(ValueError):
    """A label file that cannot be read as one (a directory, not UTF-8 text, unreadable)."""


def read_labels(path: str | Path) -> list[PromptLabel]:
    """Every whole line of a label file; a last line cut off by an interrupted run is dropped.
    A missing file holds no labels; one that cannot be read raises LabelFileError."""
    labels = []
    p = Path(path)
    if not p.exists():
        return labels
    if p.is_dir():
        raise LabelFileError(f"{path} is a directory, not a label file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LabelFileError(f"{path} is not UTF-8 text, so not a label file") from None
    except OSError as exc:
        raise LabelFileError(f"cannot read {path} ({exc.strerror or exc})") from None
    for line in text.splitlines():
        try:
            labels.append(PromptLabel.from_json(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return labels


def _drop_cut_line(path: Path) -> None:
    """An interrupted run can leave a last line without its newline: cut it off, so that the
    next line appended starts a line of its own (the prompt it named is scored again)."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[:data.rfind(b"\n") + 1])


def collect_labels(out: str | Path, options: LabelOptions) -> int:
    console = Console(stderr=True)
    out = Path(out)
    done = {label.prompt_id for label in read_labels(out)}
    console.log(f"small tier {options.small!r}, large tier {options.large!r}: loading ({options.dtype})")
    small = load_model(options.small, options.dtype)
    large = load_model(options.large, options.dtype)
    prompts = load_routing_prompts(small.tokenizer, small.chat_template, options.num_prompts, options.caps,
                                   options.slice_name)
    todo = [p for p in prompts if p.prompt_id not in done]
    console.log(f"{len(prompts) - len(todo)} of {len(prompts)} prompts already labelled in {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    _drop_cut_line(out)
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TimeRemainingColumn())
    with out.open("a", encoding="utf-8") as sink, Progress(*columns, console=console) as bar:
        task = bar.add_task("both tiers: bits per byte", total=len(todo))
        for prompt in todo:
            s = score_question(small, prompt.question, prompt.reference)
            lg = score_question(large, prompt.question, prompt.reference)
            label = PromptLabel(prompt.prompt_id, prompt.record_index, s.bits_per_byte, lg.bits_per_byte,
                                s.answer_bytes, s.prompt_tokens, lg.prompt_tokens, s.answer_tokens, lg.answer_tokens)
            sink.write(label.as_json() + "\n")
            sink.flush()
            bar.advance(task)
    console.log(f"labelled {len(todo)} prompts in {time.perf_counter() - started:.0f} s -> {out}")
    return 0
