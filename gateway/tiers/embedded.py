"""An in-process tier: its own LLMEngine (model, KV pool, scheduler) driven by an AsyncEngine.

The model loads in a worker thread after the server is listening; until then the tier says
"still loading" and the pipeline falls back past it.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator

from engines.async_engine import AsyncEngine, EngineDeadError
from engines.chat_template import ChatTemplateError
from engines.errors import ModelLoadError, RequestTooLongError
from engines.quantization.calibration import CalibrationSource
from engines.sampling_params import InvalidRequestError, SamplingParams
from gateway.context import Usage
from gateway.errors import GatewayError
from gateway.openai_format import (
    SSE_DONE,
    ChoiceResult,
    ChunkWriter,
    TokenPieces,
    chat_body,
    completion_body,
    json_bytes,
)
from gateway.schema import ChatCompletionRequest
from gateway.tiers.base import Tier, TierAnswer, TierCall, TierFailure, TierUnfit
from gateway.tiers.embedded_load import build_engine
from gateway.tiers.engine_events import EngineEvents
from policies.tier_config import EmbeddedTierConfig

log = logging.getLogger(__name__)

_UNSUPPORTED_CHAT = ("tools", "tool_choice", "functions", "function_call")


def derive_seed(seed: int | None, index: int) -> int | None:
    """Choice 0 keeps the request's seed; the others get distinct seeds derived from it."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class EmbeddedTier(Tier):
    kind = "embedded"

    def __init__(self, name: str, config: EmbeddedTierConfig, calibration: CalibrationSource | None = None):
        super().__init__(name, config)
        self.calibration = calibration
        self.engine: AsyncEngine | None = None
        self.pieces: TokenPieces | None = None
        self.tokenizer_key: str | None = None
        self.notes: list[str] = []       # what the tier runs without (unsupported options)
        self.load_seconds: float | None = None

    # ---- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        started = time.perf_counter()
        try:
            llm, self.notes = await asyncio.to_thread(build_engine, self.name, self.config, self.calibration)
        except (ModelLoadError, ValueError, OSError, RuntimeError) as exc:
            self.state, self.error = "failed", str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("tier %s failed to load: %s", self.name, self.error)
            return
        self.engine = AsyncEngine(llm)
        tok = llm.loaded.tokenizer
        self.pieces = TokenPieces(tok)
        self.tokenizer_key = hashlib.sha1(
            (tok.backend.to_str() + llm.loaded.chat_template.source).encode()).hexdigest()
        self.load_seconds = time.perf_counter() - started
        gc.collect()
        gc.freeze()    # the model's objects live as long as the process: keep them out of GC scans
        self.state = "ready"
        log.warning("tier %s ready in %.1fs%s", self.name, self.load_seconds,
                    f" (runs without: {'; '.join(self.notes)})" if self.notes else "")

    async def close(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)

    @property
    def context_length(self) -> int | None:
        return self.engine.engine.max_model_len if self.engine else self.config.max_model_len

    def describe(self) -> dict:
        out = super().describe()
        if self.notes:
            out["runs_without"] = self.notes
        if self.load_seconds is not None:
            out["load_seconds"] = round(self.load_seconds, 1)
        if self.engine is not None:
            st = self.engine.stats
            out["kv_blocks_used"] = st.kv_blocks_used
            out["kv_blocks_total"] = st.kv_blocks_total
        return out

    # ---- prompts ----------------------------------------------------------------------
    def count_prompt_tokens(self, call: TierCall) -> int:
        return sum(len(ids) for ids in self._prompt_ids(call))

    def _prompt_ids(self, call: TierCall) -> list[list[int]]:
        cached = call.prompt_ids.get(self.tokenizer_key)
        if cached is not None:
            return cached
        loaded = self.engine.engine.loaded
        body = call.body
        if isinstance(body, ChatCompletionRequest):
            messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                        for m in body.messages]
            try:
                prompts = [loaded.tokenizer.encode(loaded.chat_template.render(messages))]
            except ChatTemplateError as exc:
                raise GatewayError(400, str(exc), param="messages") from None
        else:
            prompts = [p if isinstance(p, list) else loaded.tokenizer.encode(p) for p in body.prompts()]
        call.prompt_ids[self.tokenizer_key] = prompts
        return prompts

    def _check_supported(self, body) -> None:
        extra = body.model_extra or {}
        if isinstance(body, ChatCompletionRequest):
            for name in _UNSUPPORTED_CHAT:
                if extra.get(name):
                    raise GatewayError(400, f"'{name}' is not supported by embedded tiers", param=name)
            fmt = extra.get("response_format")
            if fmt and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
                raise GatewayError(400, "only response_format {type: text} is supported", param="response_format")
        else:
            if body.echo:
                raise GatewayError(400, "echo is not supported by embedded tiers", param="echo")
            if body.suffix:
                raise GatewayError(400, "suffix is not supported by embedded tiers", param="suffix")
            if body.best_of is not None and body.best_of != body.n:
                raise GatewayError(400, "best_of other than n is not supported", param="best_of")
        if extra.get("logit_bias"):
            raise GatewayError(400, "logit_bias is not supported by embedded tiers", param="logit_bias")

    def _jobs(self, call: TierCall) -> list[tuple[int, list[int], SamplingParams]]:
        """(choice index, prompt ids, sampling) for every choice; raises before anything runs."""
        if self.engine is None:
            raise TierFailure(f"tier {self.name} is not loaded")
        body = call.body
        self._check_supported(body)
        chat = isinstance(body, ChatCompletionRequest)
        want_lp = (body.logprobs if chat else body.logprobs is not None) or call.want_logprobs
        top = body.num_top_logprobs if chat else (body.logprobs or 0)
        limit = self.engine.engine.max_model_len
        jobs = []
        for p_index, ids in enumerate(self._prompt_ids(call)):
            max_tokens = body.output_limit or max(1, limit - len(ids))
            for i in range(body.n):
                params = SamplingParams(
                    max_tokens=max_tokens, temperature=1.0 if body.temperature is None else body.temperature,
                    top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0, min_p=body.min_p or 0.0,
                    seed=derive_seed(body.seed, p_index * body.n + i), stop=body.stop_list(),
                    ignore_eos=body.ignore_eos, presence_penalty=body.presence_penalty or 0.0,
                    frequency_penalty=body.frequency_penalty or 0.0, logprobs=bool(want_lp), top_logprobs=top)
                try:
                    self.engine.engine.check_request(ids, params)
                except RequestTooLongError as exc:   # a larger tier may take it
                    raise TierUnfit(GatewayError(400, str(exc), param="messages" if chat else "prompt",
                                                 code="context_length_exceeded")) from None
                except InvalidRequestError as exc:
                    raise GatewayError(400, str(exc), param=exc.param) from None
                jobs.append((p_index * body.n + i, ids, params))
        return jobs

    @staticmethod
    def _scope(call: TierCall) -> tuple[str | None, int]:
        return call.ctx.prefix_scope, call.ctx.priority

    # ---- answers ----------------------------------------------------------------------
    async def complete(self, call: TierCall) -> TierAnswer:
        jobs = self._jobs(call)
        rid = call.ctx.request_id
        scope, priority = self._scope(call)
        results = [ChoiceResult(index) for index, _, _ in jobs]
        waiting_first = True

        async def run(slot: ChoiceResult, ids: list[int], params: SamplingParams) -> None:
            nonlocal waiting_first
            call.span.queued(queue_depth=self.engine.stats.queue_depth)
            events = EngineEvents(call.span)
            async for out in self.engine.generate(f"{rid}-{slot.index}", ids, params, scope, priority):
                events.observe(out)
                if waiting_first:
                    waiting_first = False
                    _first_token(call)
                slot.text += out.text
                if out.logprobs:
                    slot.logprobs.extend(out.logprobs)
                slot.prompt_tokens, slot.completion_tokens = out.prompt_tokens, out.completion_tokens
                slot.cached_tokens = out.cached_tokens
                if out.finished:
                    slot.finish_reason = out.finish_reason

        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels (and aborts) the others
                for slot, (_, ids, params) in zip(results, jobs):
                    group.create_task(run(slot, ids, params))
        except BaseExceptionGroup as group_error:
            raise _tier_error(group_error.exceptions[0]) from None
        usage = _usage(results, call.body.n)
        _finish_span(call, results, usage)
        chat = isinstance(call.body, ChatCompletionRequest)
        client_lp = call.body.logprobs if chat else call.body.logprobs is not None
        pieces = self.pieces if client_lp else None
        build = chat_body if chat else completion_body
        body = build(_response_id(call), int(time.time()), call.alias, results, usage.as_openai(), pieces)
        all_lps = [lp.logprob for r in results for lp in r.logprobs]
        mean = sum(all_lps) / len(all_lps) if all_lps else None
        return TierAnswer(json_bytes(body), usage, mean)

    async def stream(self, call: TierCall) -> AsyncIterator[bytes]:
        jobs = self._jobs(call)   # raises before the first byte: bad request or unfit tier
        body = call.body
        chat = isinstance(body, ChatCompletionRequest)
        client_lp = body.logprobs if chat else body.logprobs is not None
        writer = ChunkWriter(chat, _response_id(call), int(time.time()), call.alias, body.include_usage,
                             self.pieces if client_lp else None)
        rid = call.ctx.request_id
        scope, priority = self._scope(call)
        for _ in jobs:   # submitted together when the stream is first read
            call.span.queued(queue_depth=self.engine.stats.queue_depth)
        outputs = _merged(self.engine, [(f"{rid}-{i}", ids, p, i) for i, ids, p in jobs], scope, priority)
        results = {i: ChoiceResult(i) for i, _, _ in jobs}
        started = set()
        keep_text = call.span.content_allowed   # texts are kept only for an opted-in span
        events = {i: EngineEvents(call.span) for i in results}
        try:
            async for index, out in outputs:
                events[index].observe(out)
                slot = results[index]
                slot.prompt_tokens, slot.completion_tokens = out.prompt_tokens, out.completion_tokens
                slot.cached_tokens = out.cached_tokens
                if out.finished:
                    slot.finish_reason = out.finish_reason
                if keep_text:
                    slot.text += out.text
                if index not in started:
                    if not started:
                        _first_token(call)
                    started.add(index)
                    if chat:
                        yield writer.role(index)
                if out.text or out.finished or (client_lp and out.logprobs):
                    yield writer.delta(index, out.text, out.logprobs, out.finish_reason if out.finished else None)
        except (EngineDeadError, InvalidRequestError) as exc:
            raise _tier_error(exc) from None
        finally:
            await outputs.aclose()
            usage = _usage(list(results.values()), body.n)
            call.ctx.usage.add(usage)
            _finish_span(call, list(results.values()), usage)
        if body.include_usage:
            yield writer.usage(_usage(list(results.values()), body.n).as_openai())
        yield SSE_DONE


async def _merged(engine: AsyncEngine, jobs, scope, priority) -> AsyncIterator[tuple[int, object]]:
    """(choice index, engine output) of all jobs as they come. Closing it aborts every job."""
    if len(jobs) == 1:
        rid, ids, params, index = jobs[0]
        gen = engine.generate(rid, ids, params, scope, priority)
        try:
            async for out in gen:
                yield index, out
        finally:
            await gen.aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(rid, ids, params, index):
        try:
            async for out in engine.generate(rid, ids, params, scope, priority):
                queue.put_nowait((index, out))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(*job)) for job in jobs]
    try:
        remaining = len(jobs)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _first_token(call: TierCall) -> None:
    if call.ctx.first_token_at is None:
        call.ctx.first_token_at = time.perf_counter()
    call.span.first_token()


def _finish_span(call: TierCall, results: list[ChoiceResult], usage: Usage) -> None:
    """Response attributes and usage (partial when the stream was cut short) on the tier span."""
    span = call.span
    if not span.recording:
        return
    reasons = [r.finish_reason or "error" for r in results]
    span.finish(response_id=_response_id(call), response_model=call.alias, finish_reasons=reasons,
                input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                cache_read_tokens=usage.cached_tokens)
    span.record_output([r.text for r in results], reasons)


def _tier_error(exc: BaseException) -> BaseException:
    if isinstance(exc, EngineDeadError):
        return TierFailure(str(exc))
    if isinstance(exc, InvalidRequestError):  # refused in the engine thread (e.g. a duplicate id)
        return GatewayError(400, str(exc), param=exc.param)
    return exc


def _usage(results: list[ChoiceResult], n: int) -> Usage:
    # Every choice of one prompt shares that prompt: count it once per prompt.
    prompt = sum(r.prompt_tokens for r in results if r.index % n == 0)
    cached = sum(r.cached_tokens for r in results if r.index % n == 0)
    return Usage(prompt, sum(r.completion_tokens for r in results), cached)


def _response_id(call: TierCall) -> str:
    prefix = "chatcmpl" if call.endpoint == "chat" else "cmpl"
    return f"{prefix}-{call.ctx.request_id}" if call.ctx.request_id else f"{prefix}-{uuid.uuid4().hex}"

