"""An in-process tier: its own LLMEngine (model, KV pool, scheduler) driven by an AsyncEngine.

The model loads in a worker thread after the server is listening; until then the tier says
"still loading" and the pipeline falls back past it.

Engine faults: the requests of a step that raised end as a TierFailure carrying a 500
`engine_step_failed` (the breaker counts it; the chain falls back if nothing was streamed;
the client gets the 500 when no tier is left). An engine that died (steps kept failing) makes
the tier unusable at once (routing skips it, /readyz says why) and is rebuilt in the background
on the weights already loaded (gateway/tiers/engine_restart.py: backoff, bounded, logged).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import logging
import time
from collections.abc import AsyncIterator

from engines.async_engine import AsyncEngine
from engines.engine_process import ProcessEngine
from engines.grammar import GrammarCompiler
from engines.errors import ModelLoadError
from engines.llm_engine import LLMEngine
from engines.loaded_model import LoadedModel
from engines.quantization.calibration import CalibrationSource
from gateway.context import Usage
from gateway.openai_format import ChoiceResult, TokenIdPieces, TokenPieces
from gateway.schema import RequestBody
from gateway.tiers.base import ALL_TOKEN_SIGNALS, Tier, TierAnswer, TierCall, TierFailure
from gateway.tiers.beam_search import beam_search_asked
from gateway.tiers.embedded_answers import EngineCall, complete_answer, stream_answer
from gateway.tiers.embedded_beams import beam_body, beam_chunks, beam_results
from gateway.tiers.embedded_jobs import Job, check_supported, engine_jobs
from gateway.tiers.embedded_prompts import render_prompts, truncate_prompts
from gateway.tiers.embedded_load import build_engine, build_worker_engine, load_tier_model
from gateway.tiers.engine_restart import EngineRestarter, RestartPolicy
from policies.tier_config import EmbeddedTierConfig

log = logging.getLogger(__name__)


class EmbeddedTier(Tier):
    kind = "embedded"

    def __init__(self, name: str, config: EmbeddedTierConfig, calibration: CalibrationSource | None = None,
                 restart_policy: RestartPolicy | None = None):
        super().__init__(name, config)
        self.calibration = calibration
        self.engine: AsyncEngine | None = None     # None while loading and while restarting
        self.loaded: LoadedModel | None = None     # weights, tokenizer, template: kept across restarts
        self.pieces: TokenPieces | None = None
        self.tokenizer_key: str | None = None
        self.notes: list[str] = []       # what the tier runs without (unsupported options)
        self.load_seconds: float | None = None
        self._stop_reason: str | None = None        # why the last engine died
        self.restarter = EngineRestarter(name, self._rebuild, self._restarted, self._give_up, restart_policy)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._alone = False              # the last word of gateway/tiers/core_sharing.py

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        started = time.perf_counter()
        try:
            built, self.notes = await asyncio.to_thread(self._build)
        except (ModelLoadError, ValueError, OSError, RuntimeError) as exc:
            self.state, self.error = "failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("tier %s failed to load: %s", self.name, self.error)
            return
        self._loop = asyncio.get_running_loop()
        self._install(built)
        tok = self.loaded.tokenizer
        self.pieces = TokenPieces(tok)
        self.tokenizer_key = hashlib.sha1(
            (tok.backend.to_str() + self.loaded.chat_template.source).encode()).hexdigest()
        self.load_seconds = time.perf_counter() - started
        gc.collect()
        gc.freeze()    # the model's objects live as long as the process: keep them out of GC scans
        self.state = "ready"
        log.warning("tier %s ready in %.1fs%s", self.name, self.load_seconds,
                    f" (runs without: {'; '.join(self.notes)})" if self.notes else "")

    async def close(self) -> None:
        self._closing = True
        await self.restarter.close()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    def _build(self) -> tuple[LLMEngine | ProcessEngine, list[str]]:
        """The tier's engine as at start (runs in a worker thread): in this process, or in
        `engine_processes` processes on the weights and dtype chosen here."""
        if not self.config.engine_processes:
            return build_engine(self.name, self.config, self.calibration)
        loaded, notes = load_tier_model(self.name, self.config, self.calibration)
        self.loaded = loaded
        return self._processes(), notes

    def _processes(self) -> ProcessEngine:
        loaded = self.loaded
        build = functools.partial(build_worker_engine, self.name, self.config, str(loaded.path),
                                  str(loaded.dtype).removeprefix("torch."), loaded.dense_prefill_rows)
        return ProcessEngine(build, GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size),
                             tokenizer=loaded.tokenizer, workers=self.config.engine_processes,
                             threads=self.config.threads, solo_threads=self.config.solo_threads,
                             on_dead=self._engine_died)

    def set_alone(self, alone: bool) -> None:
        self._alone = alone
        if isinstance(self.engine, ProcessEngine):
            self.engine.set_alone(alone)

    def _install(self, built: LLMEngine | ProcessEngine) -> None:
        if isinstance(built, ProcessEngine):
            self.engine = built
            built.set_alone(self._alone)          # a rebuilt engine starts as the last one was told
            return
        self.engine = AsyncEngine(built, on_dead=self._engine_died, threads=self.config.threads)
        self.loaded = built.loaded
        self._engine_config, self._engine_identity = built.config, built.identity

    # ---- restarts -------------------------------------------------------------------
    def _engine_died(self, engine: AsyncEngine | ProcessEngine) -> None:
        """From the engine thread: the tier is unusable already (it reads engine.dead); the
        restart itself is started on the event loop."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._begin_restart, engine)
        except RuntimeError:     # the loop has closed: the process is shutting down
            pass

    def _begin_restart(self, engine: AsyncEngine | ProcessEngine) -> None:
        if self._closing or engine is not self.engine:
            return
        self.state = "restarting"
        self._stop_reason = engine.dead_reason
        self.engine = None
        # Its grammar compiler's worker thread (the engine thread, or its processes, have ended).
        engine.grammars.shutdown()
        # The dead engine's KV pool must be freed before a new one is allocated. Start-up froze
        # the heap, and frozen objects in reference cycles are never collected: unfreeze here,
        # collect before the rebuild, freeze again once the new engine is in.
        gc.unfreeze()
        self.restarter.start()

    def _rebuild(self) -> LLMEngine | ProcessEngine:
        """A new engine on the weights already loaded; failing that, the whole tier as at start.
        Runs in a worker thread."""
        gc.collect()
        try:
            if self.config.engine_processes:
                return self._processes()
            return LLMEngine(self.loaded, self._engine_config, self._engine_identity)
        except Exception as exc:  # noqa: BLE001 - the slow path below may still work
            log.warning("tier %s: cannot rebuild the engine on the loaded weights (%s); loading the tier again",
                        self.name, exc)
        built, self.notes = self._build()
        return built

    def _restarted(self, built: LLMEngine | ProcessEngine) -> None:
        if self._closing:
            if isinstance(built, ProcessEngine):
                built.shutdown()
            return
        self._install(built)
        self.state, self.error = "ready", None
        gc.collect()
        gc.freeze()

    def _give_up(self, reason: str) -> None:
        self.state, self.error = "failed", f"{reason} (last: {self._stop_reason})" if self._stop_reason else reason

    @property
    def _engine_stopped(self) -> bool:
        """Ready, but its engine died a moment ago (the restart is about to begin)."""
        return self.state == "ready" and (self.engine is None or self.engine.dead)

    @property
    def coming_up(self) -> bool:
        """Loading, or its engine stopped and the restarter is bringing it back."""
        return self._engine_stopped or self.state in ("loading", "restarting")

    def unusable_reason(self) -> str | None:
        if self._engine_stopped:
            return f"engine stopped ({self.engine.dead_reason if self.engine else 'gone'}); restarting"
        if self.state == "restarting":
            return f"engine restarting: {self._stop_reason}"
        return super().unusable_reason()

    @property
    def context_length(self) -> int | None:
        """Prompt plus output one request may reach: the context, or less where the KV cache holds
        less (routing, budget bounds and prompt truncation all read this)."""
        return self.engine.front.limits.max_request_tokens if self.engine else self.config.max_model_len

    def token_signals(self, stream: bool) -> frozenset[str]:
        return ALL_TOKEN_SIGNALS       # the engine's sampler gives logprobs and entropies either way

    @property
    def prompt_hidden_size(self) -> int | None:
        return None if self.loaded is None else self.loaded.config.hidden_size

    def describe(self) -> dict:
        out = super().describe()
        if self._engine_stopped:
            out["state"] = "restarting"       # the engine died a moment ago
        if self.restarter.restarts:
            out["restarts"] = self.restarter.restarts
        if self.notes:
            out["runs_without"] = self.notes
        if self.load_seconds is not None:
            out["load_seconds"] = round(self.load_seconds, 1)
        if self.loaded is not None:
            out["dtype"] = str(self.loaded.dtype).removeprefix("torch.")    # what `auto` chose, too
            if self.loaded.dense_prefill_rows is not None:
                out["dense_prefill_rows"] = self.loaded.dense_prefill_rows
            out["fused_decoder"] = self.loaded.model.fused_decoder is not None
        if self.engine is not None:
            if self.engine.threads_in_use is not None:
                out["threads"] = self.engine.threads_in_use
            st = self.engine.stats
            out["kv_blocks_used"] = st.kv_blocks_used
            out["kv_blocks_total"] = st.kv_blocks_total
        return out

    # ---- prompts ----------------------------------------------------------------------
    def count_prompt_tokens(self, call: TierCall) -> int:
        return sum(len(ids) for ids in self._engine_prompts(call))

    def _prompt_ids(self, call: TierCall) -> list[list[int]]:
        """The prompts' ids as rendered, shared by the tiers with this tokenizer."""
        cached = call.prompt_ids.get(self.tokenizer_key)
        if cached is not None:
            return cached
        prompts = render_prompts(self.loaded, call.body)
        call.prompt_ids[self.tokenizer_key] = prompts
        return prompts

    def _engine_prompts(self, call: TierCall) -> list[list[int]]:
        """What this tier's engine runs: the prompts truncated as the client asked, for its context."""
        return truncate_prompts(call.body, self._prompt_ids(call), self.context_length)

    def _jobs(self, call: TierCall) -> list[Job]:
        """(choice index, prompt ids, sampling) for every choice; raises before anything runs."""
        if self.engine is None:
            raise TierFailure(f"tier {self.name} is not loaded")
        check_supported(call.body)
        spec = self.config.speculative
        return engine_jobs(call, self._engine_prompts(call), self.engine.front,
                           drafts_from_prediction=spec is not None and spec.method == "ngram")

    def _engine_call(self, call: TierCall) -> EngineCall:
        """What answering the call needs, fixed now; raises before anything runs."""
        jobs = self._jobs(call)
        scope, priority = self._scope(call)
        return EngineCall(self.engine, self.loaded, self.pieces, self._logprob_pieces(call.body), jobs,
                          self._prompt_ids(call), scope, priority)

    @staticmethod
    def _scope(call: TierCall) -> tuple[str | None, int]:
        """The engine request's prefix scope and priority. A tenant's `priority` runs higher
        first (the config's meaning); the engine's scheduler admits lower first and preempts
        the highest value first (heap on (priority, arrival)): negated here, the one place the
        two meet."""
        return call.ctx.prefix_scope, -call.ctx.priority

    # ---- answers ----------------------------------------------------------------------
    def _logprob_pieces(self, body: RequestBody) -> TokenPieces | TokenIdPieces:
        """How the answer's logprobs name tokens: their text, or their ids when the client asks."""
        return TokenIdPieces(self.pieces) if (body.model_extra or {}).get("return_tokens_as_token_ids") else self.pieces

    async def complete(self, call: TierCall) -> TierAnswer:
        if beam_search_asked(call.body):
            results, usage = await self._beam_search(call)
            return TierAnswer(beam_body(call, results, usage), usage)
        return await complete_answer(call, self._engine_call(call))

    async def stream(self, call: TierCall) -> AsyncIterator[bytes]:
        if beam_search_asked(call.body):
            results, usage = await self._beam_search(call)
            call.ctx.usage.add(usage)
            async for chunk in beam_chunks(call, results, usage):
                yield chunk
            return
        # Raises before the first byte: a bad request or an unfit tier.
        async for chunk in stream_answer(call, self._engine_call(call)):
            yield chunk

    async def _beam_search(self, call: TierCall) -> tuple[list[ChoiceResult], Usage]:
        if self.engine is None:
            raise TierFailure(f"tier {self.name} is not loaded")
        check_supported(call.body)
        scope, priority = self._scope(call)
        return await beam_results(self.engine, call, self._engine_prompts(call), scope, priority)
