"""Turn a step plan into flat tensors, run the model once, return logits to sample from.

Other parts of the engine join a runner's forwards only through its public hooks, so the
runner stays the one owner of its attention backend and its step tensors:
- `add_hook(hook)`: `hook.before_forward(scheduled)` runs before the step's tensors are
  built (it may still fill the entries' draft tokens), `hook.after_forward(scheduled,
  seconds)` after the logits exist, with the time the forward took.
- `wrap_attention(wrap)`: layers a backend over the current one; every later forward
  (`execute` and `forward` alike) runs through it, and `attn` returns the outermost layer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from engines import prompt_logprobs
from engines.attention.paged import PagedAttention, PagedStepMetadata, build_step
from engines.kv_cache import KVPool
from engines.model import LlamaForCausalLM
from engines.scheduler import ScheduledSeq
from engines.sequence import Sequence


@dataclass
class Chunk:
    """Tokens of one sequence computed in a forward, from position `start`."""
    block_table: list[int]
    start: int
    token_ids: list[int]
    logit_rows: int = 0        # how many of its last rows need logits


class StepAttention(Protocol):
    """What the runner drives: the step's metadata once, then one call per layer."""

    def prepare(self, meta: PagedStepMetadata) -> None: ...

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class ForwardHook(Protocol):
    def before_forward(self, scheduled: list[ScheduledSeq]) -> None: ...

    def after_forward(self, scheduled: list[ScheduledSeq], seconds: float) -> None: ...


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, pool: KVPool):
        self.model = model
        self.pool = pool
        self.device = model.embed_tokens.weight.device
        if pool.k.device != self.device:
            raise ValueError(f"KV pool on {pool.k.device} but the model on {self.device}")
        self.block_size = pool.block_size
        self._attn: StepAttention = PagedAttention(pool)
        self._hooks: list[ForwardHook] = []
        self.logit_hidden: torch.Tensor | None = None    # the last forward's logit rows, before the head
        self.kept_hidden: torch.Tensor | tuple = ()      # the last forward's `keep_rows`

    # ---- the ways in -----------------------------------------------------------------
    @property
    def attn(self) -> StepAttention:
        """The backend every forward runs through (the outermost wrapper, if any)."""
        return self._attn

    def wrap_attention(self, wrap: Callable[[StepAttention], StepAttention]) -> None:
        """Replace the backend by `wrap(current backend)`. The wrapper sees each step's metadata
        and every layer's K/V, e.g. to store them in a second pool as well; it must delegate
        to the backend it wraps, which stays the one that owns this runner's pool."""
        self._attn = wrap(self._attn)

    def add_hook(self, hook: ForwardHook) -> None:
        """Call `hook` around every `execute`, in the order hooks were added."""
        self._hooks.append(hook)

    @property
    def hooks(self) -> tuple[ForwardHook, ...]:
        return tuple(self._hooks)

    # ---- a step ----------------------------------------------------------------------
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Run one step. Returns the scheduled entries that sample and their logits: `num_rows`
        consecutive rows per entry (its last token's, then one per draft token)."""
        for hook in self._hooks:
            hook.before_forward(scheduled)
        started = time.perf_counter()
        chunks: list[Chunk] = []
        sampling: list[ScheduledSeq] = []
        captures: list[tuple[int, Sequence, int]] = []    # (flat row, sequence, rows back)
        scored: list[tuple[int, Sequence, int]] = []      # (flat row, sequence, prompt position)
        flat = 0
        for s in scheduled:
            seq, start = s.seq, s.start
            if s.num_tokens == 1 and start >= len(seq.prompt_ids):
                ids = [seq.output_ids[start - len(seq.prompt_ids)]]    # a decode: no list concat
            else:
                ids = seq.all_token_ids[start:start + s.num_tokens]
            if s.draft_ids:
                ids = ids + s.draft_ids
            chunks.append(Chunk(seq.block_table, start, ids, s.num_rows))
            if seq.params.prompt_hidden and not seq.output_ids:
                captures.extend(_prompt_rows_in_chunk(seq, start, s.num_tokens, flat))
            if seq.wants_prompt_logprobs:
                scored.extend(prompt_logprobs.rows_in_chunk(seq, start, s.num_tokens, flat))
            flat += len(ids)
            if s.samples:
                sampling.append(s)
        logits = self.forward(chunks, [row for row, _, _ in captures] + [row for row, _, _ in scored])
        for (_, seq, back), hidden in zip(captures, self.kept_hidden):
            # A copy: a view would keep the step's scored rows (prompt logprobs) alive with it.
            seq.prompt_hidden_parts[back] = hidden.clone()
        if scored:
            prompt_logprobs.score(self.kept_hidden[len(captures):], scored, self.model.compute_logits)
        if self._hooks:
            seconds = time.perf_counter() - started
            for hook in self._hooks:
                hook.after_forward(scheduled, seconds)
        return sampling, logits

    def forward(self, chunks: list[Chunk], keep_rows: list[int] | None = None) -> torch.Tensor:
        """One flat forward over all chunks; logits [sum of logit_rows, V] in chunk order.
        `keep_rows`: flat token rows whose final hidden states stay readable in `kept_hidden`."""
        ids: list[int] = []
        positions: list[int] = []
        rows: list[int] = []
        for c in chunks:
            ids.extend(c.token_ids)
            positions.extend(range(c.start, c.start + len(c.token_ids)))
            rows.extend(range(len(ids) - c.logit_rows, len(ids)))
        # Every step tensor is built on the host and reaches the model's device in one copy.
        meta, (ids_t, positions_t, rows_t) = build_step(
            self.block_size, [(c.block_table, c.start, len(c.token_ids)) for c in chunks], self.device,
            [ids, positions, rows])
        self._attn.prepare(meta)
        hidden = self.model(ids_t, positions_t, self._attn)
        self.kept_hidden = hidden[keep_rows] if keep_rows else ()
        if not rows:
            self.logit_hidden = None
            return torch.empty(0, device=self.device)
        # The rows' final hidden states stay readable until the next forward, in the logits'
        # order: a request that asked for its prompt's hidden state reads its first row.
        self.logit_hidden = hidden[rows_t]
        return self.model.compute_logits(self.logit_hidden)


def _prompt_rows_in_chunk(seq: Sequence, start: int, num_tokens: int, flat: int) -> list[tuple[int, Sequence, int]]:
    """The rows of `seq`'s prompt hidden state (other than its last token's, which is a logit
    row) that this chunk computes, as (flat row, sequence, rows back)."""
    out = []
    for back in seq.params.prompt_hidden_rows:
        position = seq.prompt_hidden_position(back)
        if back and start <= position < start + num_tokens:
            out.append((flat + position - start, seq, back))
    return out
