"""The synchronous engine: accept requests, run steps, emit per-request deltas.

One step, one method per job: schedule -> run the model on the flat batch (the speculator,
if any, drafts and times through the runner's hooks) -> pick tokens (sample, or verify
drafts) -> advance each sequence's computed tokens (`_advance_computed`, the only place
that count moves forward) -> append tokens, detokenize, check stops -> release unused
draft slots -> stats. The async wrapper (engines/async_engine.py) drives it from a
background thread.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import torch

from engines.allocator import keep_freed_memory
from engines.block_manager import BlockManager
from engines.detokenizer import IncrementalDetokenizer
from engines.engine_config import EngineConfig
from engines.request_limits import RequestLimits
from engines.grammar import GrammarCompiler, GrammarState
from engines.kv_cache import KVPool
from engines.loaded_model import LoadedModel, parse_dtype
from engines import prompt_logprobs
from engines.model_runner import ModelRunner
from engines.request_output import RequestOutput, TrackedRequest
from engines.sampler import Sampler, TokenLogprob
from engines.sampling_params import InvalidRequestError, SamplingParams
from engines.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from engines.sequence import Sequence
from engines.spec.build import build_speculator, load_draft_model
from engines.spec.verify import SpecGroup
from engines.stats import EngineStats

log = logging.getLogger(__name__)


def _kv_dtype(name: str | None, model_dtype):
    from engines.kv_cache import KV_CACHE_DTYPES  # "int8", "fp8", "int4" (quantized KV)
    return model_dtype if not name else KV_CACHE_DTYPES.get(name) or parse_dtype(name)


class _Picked(NamedTuple):
    """A sampling entry's new tokens this step (the target's own, after any accepted drafts)."""
    entry: ScheduledSeq
    tokens: list[int]
    logprobs: list[TokenLogprob] | None
    prompt_hidden: list[float] | None = None


class LLMEngine:
    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None, identity: str | None = None):
        self.loaded = loaded
        self.config = config = config or EngineConfig()
        keep_freed_memory()
        cfg = loaded.config
        self.max_model_len = min(config.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        kv_dtype = _kv_dtype(config.kv_cache_dtype, loaded.dtype)
        spec = config.speculative
        draft = load_draft_model(spec, loaded, self.max_model_len) if spec else None
        draft_kv_dtype = _kv_dtype(spec.draft_kv_cache_dtype, draft.dtype) if draft else None
        # A draft model's pool has as many blocks as the target's: both share the memory budget.
        bytes_per_block = KVPool.bytes_per_block(cfg, config.block_size, kv_dtype)
        if draft:
            bytes_per_block += KVPool.bytes_per_block(draft.config, config.block_size, draft_kv_dtype)
        num_blocks = config.kv_cache_memory_bytes // bytes_per_block
        if num_blocks < 2:
            raise ValueError(f"kv_cache_memory_bytes={config.kv_cache_memory_bytes} holds fewer than 2 blocks")
        self.pool = KVPool(cfg, num_blocks, config.block_size, kv_dtype, device=loaded.device)
        self.identity = identity or f"{loaded.path.name}|w={loaded.dtype}|q={loaded.quantization}|kv={kv_dtype}"
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, self.identity)
        self.headroom_blocks = max(1, int(num_blocks * config.headroom_fraction))
        self.limits = RequestLimits(cfg.vocab_size, self.max_model_len, config.block_size,
                                    num_blocks - self.headroom_blocks)
        self.runner = ModelRunner(loaded.model, self.pool)
        self.sampler = Sampler(config.seed)
        self.tokenizer = loaded.tokenizer
        # Constrained requests' grammars: compiled off the engine thread (AsyncEngine awaits
        # `grammars.state_for`), or here in add_request for offline callers.
        self.grammars = GrammarCompiler(loaded.tokenizer, cfg.vocab_size)
        self._requests: dict[str, TrackedRequest] = {}
        self._in_step: tuple[str, ...] = ()
        self.stats = EngineStats(kv_blocks_total=num_blocks, kv_capacity_tokens=self.pool.capacity_tokens)
        self.speculator = None
        if spec:
            self.speculator = build_speculator(spec, draft, draft_kv_dtype, num_blocks, config.block_size,
                                               self.sampler, self.stats, self.max_model_len,
                                               config.max_num_batched_tokens, self.runner)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   self.headroom_blocks, self.speculator.lookahead if self.speculator else None)
        log.info("KV cache: %d blocks x %d tokens = %d tokens (%.0f MiB, %s)", num_blocks, config.block_size,
                    self.pool.capacity_tokens, self.pool.nbytes / 2**20, kv_dtype)
        if self.limits.max_request_tokens < self.max_model_len:
            log.warning("the KV cache holds %d tokens for one request, fewer than max_model_len %d: longer "
                        "requests are refused, and max_tokens left out runs to that capacity (raise "
                        "kv_cache_memory or lower max_model_len)", self.limits.max_request_tokens,
                        self.max_model_len)

    # ---- requests ------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    prefix_scope: str | None = None, priority: int = 0, grammar: GrammarState | None = None,
                    rank: int = 0) -> None:
        """`grammar`: the request's compiled constraint state, when params.grammar is set and the
        caller compiled it already (else it is compiled here, in the caller's thread). `rank`: the
        sequence's place among its client request's choices (0 for the first; see Sequence.rank)."""
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in flight")
        self.check_request(prompt_ids, params)
        if params.grammar is not None and grammar is None:
            grammar = self.grammars.new_state(params.grammar)
        seq = Sequence(request_id, list(prompt_ids), params, prefix_scope=prefix_scope, priority=priority, rank=rank,
                       grammar=grammar, eos_token_ids=self.tokenizer.eos_token_ids)
        detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.include_stop_str_in_output,
                                       params.skip_special_tokens)
        self._requests[request_id] = TrackedRequest(seq, detok)
        self.scheduler.add(seq)

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Checks that need no engine state: safe to call from any thread."""
        self.limits.check(prompt_ids, params)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._finish(req, "abort")
        self._refresh_gauges()       # no step may follow to do it: the blocks were freed now
        return req.delta([], None, finished=True)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_requests(self) -> int:
        return len(self._requests)

    @property
    def step_request_ids(self) -> tuple[str, ...]:
        """The requests the running step computes for; after a step that raised, that step's.

        Those are the requests whose state the failed step may have left half-updated (tokens
        computed but not counted, blocks grown, a token appended): the caller drops exactly them
        (`abort_request`, which frees their blocks) and the engine is consistent for the rest."""
        return self._in_step

    # ---- the step ------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration of continuous batching: a delta per request that got tokens or finished."""
        started = time.perf_counter()
        self._in_step = ()
        plan = self._schedule()
        if plan.is_empty:
            return []
        self._in_step = tuple(s.seq.request_id for s in plan.scheduled)
        sampling, logits = self.runner.execute(plan.scheduled)
        picked = self._pick_tokens(sampling, logits)
        self._advance_computed(plan.scheduled)
        outputs = self._emit(picked)
        self._release_lookahead(plan.scheduled)
        self._update_stats(plan, time.perf_counter() - started)
        self._in_step = ()
        return outputs

    def _schedule(self) -> SchedulerOutput:
        if self.speculator is not None:
            # Judged on the batch as the previous step left it, before admissions and preemptions.
            self.speculator.count_backoff(len(self.scheduler.running))
        return self.scheduler.schedule()

    def _pick_tokens(self, sampling: list[ScheduledSeq], logits: torch.Tensor) -> list[_Picked]:
        """Every sampling entry's new tokens: plain entries sampled (first, all in one call),
        then entries with drafts verified against the target's rows."""
        plain, verified, groups, row = [], [], [], 0
        hidden_rows: dict[int, int] = {}     # id(entry) -> its first logit row, for prompt_hidden
        for s in sampling:
            if s.seq.params.prompt_hidden and not s.seq.output_ids:
                hidden_rows[id(s)] = row
            if s.draft_ids:
                verified.append(s)
                groups.append(SpecGroup(s.seq, row, s.draft_ids, s.draft_probs))
            else:
                plain.append((s, row))
            row += s.num_rows
        picked = self._sample(plain, logits) if plain else []
        if groups:
            picked += self._verify(verified, groups, logits)
        return self._with_prompt_hidden(picked, hidden_rows) if hidden_rows else picked

    def _with_prompt_hidden(self, picked: list[_Picked], rows: dict[int, int]) -> list[_Picked]:
        """A first token's entry gets its prompt's hidden state when its request asked for it:
        the entry's first logit row, which a prefill computes whether or not a prefix was cached."""
        hidden = self.runner.logit_hidden
        return [p._replace(prompt_hidden=_prompt_hidden(p.entry.seq, hidden[rows[id(p.entry)]]))
                if id(p.entry) in rows else p for p in picked]

    def _sample(self, plain: list[tuple[ScheduledSeq, int]], logits: torch.Tensor) -> list[_Picked]:
        rows = [r for _, r in plain]
        plain_logits = logits if len(rows) == logits.shape[0] else logits[rows]
        result = self.sampler(plain_logits, [s.seq for s, _ in plain])
        return [_Picked(s, [token], [lp] if lp else None)
                for (s, _), token, lp in zip(plain, result.token_ids, result.logprobs)]

    def _verify(self, entries: list[ScheduledSeq], groups: list[SpecGroup], logits: torch.Tensor) -> list[_Picked]:
        picked = []
        for s, verdict in zip(entries, self.speculator.verify(logits, groups)):
            s.num_accepted = verdict.num_accepted
            s.seq.spec_proposed += len(s.draft_ids)
            s.seq.spec_accepted += verdict.num_accepted
            picked.append(_Picked(s, verdict.tokens, verdict.logprobs))
        return picked

    def _advance_computed(self, scheduled: list[ScheduledSeq]) -> None:
        """The one place a sequence's computed-token count moves forward: by its own tokens
        this step computed plus the drafts verification accepted. Rejected drafts' K/V lies
        past the count, where the next forward overwrites it."""
        for s in scheduled:
            seq = s.seq
            seq.num_computed_tokens += s.num_tokens + s.num_accepted
            self.stats.prompt_tokens_computed += s.num_tokens - (1 if s.samples else 0)
            if s.draft_ids:
                # The draft model's own KV past the accepted tokens holds rejected drafts.
                seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
            else:
                # A speculating sequence's accepted drafts are not its tokens until appended: its
                # full blocks are registered after that, in _release_lookahead.
                self.block_manager.register_computed(seq)

    def _emit(self, picked: list[_Picked]) -> list[RequestOutput]:
        now = time.monotonic()
        return [self._append_tokens(self._requests[p.entry.seq.request_id], p.tokens, p.logprobs, now,
                                    p.prompt_hidden) for p in picked]

    def _append_tokens(self, req: TrackedRequest, tokens: list[int], lps: list[TokenLogprob] | None,
                       now: float, prompt_hidden: list[float] | None = None) -> RequestOutput:
        """Append tokens in order until one finishes the request; one delta for all of them."""
        seq = req.seq
        if seq.first_token_time is None:
            seq.first_token_time = now
        prompt_lps = prompt_logprobs.take(seq) if seq.wants_prompt_logprobs else None
        reason, taken = None, 0
        for token in tokens:
            seq.output_ids.append(token)
            taken += 1
            self.stats.generated_tokens += 1
            # Before min_tokens the sampler keeps EOS and stop tokens out, and stop strings go unchecked.
            check_stop = len(seq.output_ids) > seq.params.min_tokens
            if token in seq.stop_ids:
                if seq.params.include_stop_str_in_output:
                    req.detok.push(token, False)     # its text too (nothing for a special token skipped)
                reason = "stop"
                if token in seq.params.stop_token_ids:
                    seq.stop_reason = token
            elif req.detok.push(token, check_stop):
                reason, seq.stop_reason = "stop", req.detok.matched
            elif _grammar_done(seq, token):
                reason = "stop"
            elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
                reason = "length"
            if reason:
                break
        if reason:
            self._finish(req, reason)
        return req.delta(tokens[:taken], lps[:taken] if lps else None, finished=reason is not None,
                         prompt_hidden=prompt_hidden, prompt_lps=prompt_lps)

    def _finish(self, req: TrackedRequest, reason: str) -> None:
        """Out of the batch and the engine at once: its blocks are free for the next step."""
        req.seq.finish_reason = reason
        self.scheduler.remove(req.seq)
        del self._requests[req.seq.request_id]

    def _release_lookahead(self, scheduled: list[ScheduledSeq]) -> None:
        for s in scheduled:
            seq = s.seq
            if s.num_lookahead and not seq.is_finished:
                # Slots reserved for drafts past the sequence's end are freed; only now, with the
                # rejected drafts gone, are its new full blocks registered.
                self.block_manager.truncate(seq, seq.num_tokens)
                self.block_manager.register_computed(seq)

    def _update_stats(self, plan, elapsed: float) -> None:
        st, bm = self.stats, self.block_manager
        st.steps += 1
        st.last_step_ms = elapsed * 1000
        st.total_step_s += elapsed
        st.preemptions = self.scheduler.num_preemptions
        st.prefix_queried_tokens = bm.prefix_queried_tokens
        st.prefix_hit_tokens = bm.prefix_hit_tokens
        self._refresh_gauges()
        running = self.scheduler.running
        st.kv_wasted_slot_steps += sum(len(s.block_table) * bm.block_size - s.num_tokens for s in running)
        st.kv_allocated_slot_steps += sum(len(s.block_table) for s in running) * bm.block_size

    def _refresh_gauges(self) -> None:
        st = self.stats
        st.kv_blocks_used = self.block_manager.num_used_blocks
        st.queue_depth = self.scheduler.num_waiting
        st.running = len(self.scheduler.running)

    # ---- convenience ---------------------------------------------------------------
    def shutdown(self) -> None:
        self.grammars.shutdown()

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
        """Run prompts to completion; return each one's generated token ids (offline use)."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        results: dict[str, list[int]] = {i: [] for i in ids}
        for rid, prompt, p in zip(ids, prompts, plist):
            self.add_request(rid, prompt, p)
        while self.has_unfinished():
            for out in self.step():
                results[out.request_id].extend(out.token_ids)
        return [results[i] for i in ids]


def _grammar_done(seq: Sequence, token: int) -> bool:
    """Advance a constrained sequence's grammar past `token`; True once nothing but EOS may
    follow (the answer is complete) or the grammar refused the token."""
    state = seq.grammar
    if state is None:
        return False
    return not state.accept(token) or state.is_stopped


def _prompt_hidden(seq, last_row: torch.Tensor) -> list[float] | None:
    """The request's prompt hidden state: its rows in the order it asked for them (the last
    token's is the first logit row; the others were kept as its prefill computed them)."""
    parts = []
    for back in seq.params.prompt_hidden_rows:
        part = last_row if back == 0 else seq.prompt_hidden_parts.get(back)
        if part is None:
            return None
        parts.append(part)
    seq.prompt_hidden_parts = {}
    return torch.cat(parts).float().tolist()
