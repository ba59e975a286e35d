"""Compile constraints off the engine thread, once per digest.

Compiling a grammar (building its lexer and parser over the tokenizer) takes about a millisecond
for an ordinary schema and can take far longer for a hostile one, so it never runs on the engine
thread: `submit` hands it to this compiler's own worker thread and returns a future; the async
engine awaits it (with a timeout) before the request enters the engine. Compiled grammars are
kept in a bounded LRU keyed by the spec's digest (errors too, so a bad schema sent again fails at
once); every request gets its own matcher, a deep copy of the cached one, made in the worker too.

One worker serves every caller, so one caller's huge grammars must not hold up another's small
one: the worker takes cached specs first, then the others by arrival with a delay for their
length (a stand-in for compile cost: big grammars are long), at most half the timeout, so a long
spec waits for short ones sent soon after it but not for ever. A compile's own run is what the
timeout judges (past it: the client's 400, too costly a constraint); a request whose compile has
not started by then was held up by others, gets a retryable 503, and its compile is dropped
from the queue, as is the compile of a request whose caller stopped waiting.

llguidance's parser limits bound the work a grammar may cause at compile time and per token, so
a compile that passes the timeout still ends; the client has had its 400 by then. llguidance
releases the GIL while it compiles.

Every compile runs on that worker, synchronous callers' too (`compile` hands the spec over and
waits), because llguidance recurses once per link of a chain of references or rules: a 64 KiB
schema or grammar of such links needs up to 16 MiB of stack, which would crash the process on a
default 8 MiB thread. The worker's stack is COMPILE_STACK_BYTES; what may reach it is bounded in
size by the callers (gateway/response_format.py, gateway/schema_extensions.py).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import itertools
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future

import llguidance

from engines.errors import EngineDeadError, GrammarCompilerBusyError
from engines.grammar.errors import GrammarError
from engines.grammar.llg_tokenizer import build_llg_tokenizer
from engines.grammar.spec import JSON_OPTIONS, GrammarSpec
from engines.grammar.state import GrammarState
from engines.tokenizer import TextTokenizer

MAX_CACHED = 256
COMPILE_TIMEOUT_S = 10.0
MAX_ERROR_CHARS = 300
# Queue delay per character of a spec not yet compiled: about what a large Lark grammar takes to
# compile per character on these CPUs (a 0.9 MB one took 4.5 s).
QUEUE_DELAY_PER_CHAR_S = 5e-6
# Tighter than llguidance's defaults (500k symbols, 1M lexer fuel): a schema the gateway admits
# (bounded size and depth) compiles far below these.
# Virtual address space, taken only as deep compiles touch it: 16x what the worst 64 KiB chain used.
COMPILE_STACK_BYTES = 256 << 20
LIMITS = dict(max_grammar_size=200_000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
              step_max_items=50_000, max_lexer_states=100_000, verbose_errors=False)


def _grammar_text(spec: GrammarSpec) -> str:
    """The spec as llguidance's grammar text; ValueError when it does not parse."""
    if spec.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    if spec.kind == "choice":
        return llguidance.LLMatcher.grammar_from_lark(_choice_lark(json.loads(spec.text)))
    if spec.kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(llguidance.grammar_from(spec.kind, spec.text))
    return llguidance.LLMatcher.grammar_from_lark(spec.text)


def _choice_lark(options: list[str]) -> str:
    """One terminal that is any of the options: the lexer matches them all at once. As alternatives
    of a rule (llguidance's own `choice`) each option is a parser item of one row, and past 2,000
    of them the parser stops mid-answer."""
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(option, ensure_ascii=False) for option in options)


class _Refusal:
    """A cached compile error: its reason, named after each request's own field when raised."""

    def __init__(self, reason: str):
        self.reason = reason

    def error(self, spec: GrammarSpec) -> GrammarError:
        return GrammarError(f"{spec.param}: {self.reason}", spec.param)


class CompiledGrammar:
    """A compiled constraint: a matcher at its start, copied for every request that uses it."""

    def __init__(self, spec: GrammarSpec, template: llguidance.LLMatcher, eos_ids: tuple[int, ...],
                 compile_s: float):
        self.spec = spec
        self.template = template
        self.eos_ids = eos_ids
        self.compile_s = compile_s

    def new_state(self) -> GrammarState:
        return GrammarState(self.template.deep_copy(), self.eos_ids, self.spec.digest)


class _CompileJob(Future):
    """A future for one request's grammar state (or, with `compiled_only`, the compiled grammar);
    `started` is set when the worker takes it."""

    def __init__(self, compiled_only: bool = False) -> None:
        super().__init__()
        self.started: float | None = None
        self.compiled_only = compiled_only


class GrammarCompiler:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, max_cached: int = MAX_CACHED,
                 timeout_s: float = COMPILE_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        self.timeout_s = timeout_s
        self._llg: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar | _Refusal] = OrderedDict()
        # The worker's queue: [when it may start, arrival counter, spec, job], earliest first.
        self._queue: list[list] = []
        self._queued = threading.Condition(self._lock)
        self._order = itertools.count()
        self._worker: threading.Thread | None = None
        self._closed = False
        self.compile_seconds: deque[float] = deque(maxlen=4096)   # fresh compiles, newest last
        self.hits = 0
        self.misses = 0

    # ---- the tokenizer -----------------------------------------------------------------
    @property
    def llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._llg is None:
                self._llg = build_llg_tokenizer(self.tokenizer, self.vocab_size)
            return self._llg

    # ---- compiling -----------------------------------------------------------------------
    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar, from the cache or built now on the worker (the caller waits)."""
        if threading.current_thread() is not self._worker:
            return self.submit(spec, compiled_only=True).result()
        digest = spec.digest
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                self.hits += 1
        if hit is None:
            hit = self._build(spec)
            with self._lock:
                self.misses += 1
                self._cache[digest] = hit
                while len(self._cache) > self.max_cached:
                    self._cache.popitem(last=False)
        if isinstance(hit, _Refusal):
            raise hit.error(spec)
        return hit

    def new_state(self, spec: GrammarSpec) -> GrammarState:
        return self.compile(spec).new_state()

    def submit(self, spec: GrammarSpec, compiled_only: bool = False) -> _CompileJob:
        """A fresh state for one request, compiled (or copied) in the compiler's worker thread,
        cached specs first, then by arrival delayed by length (see the module's notes)."""
        job = _CompileJob(compiled_only)
        with self._lock:
            if self._closed:
                job.set_exception(EngineDeadError("the engine shut down before the constraint was compiled"))
                return job
            now = time.monotonic()
            if spec.digest in self._cache:
                due = now - self.timeout_s      # a copy of a cached matcher: before any compile
            else:
                due = now + min(len(spec.text) * QUEUE_DELAY_PER_CHAR_S, self.timeout_s / 2)
            heapq.heappush(self._queue, [due, next(self._order), spec, job])
            if self._worker is None:
                self._worker = _deep_thread(self._work, "tiergate-grammar")
            self._queued.notify()
        return job

    async def state_for(self, spec: GrammarSpec) -> GrammarState:
        """`submit`, awaited. A compile that runs longer than the timeout is refused (a 400 naming
        its field; the worker finishes it under llguidance's limits); one still queued when the
        timeout has passed is dropped, and the request gets GrammarCompilerBusyError."""
        job = self.submit(spec)
        waiting = asyncio.wrap_future(job)
        try:
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), self.timeout_s)
            except TimeoutError:
                pass
            if job.cancel():                      # never started: others' compiles held it up
                raise GrammarCompilerBusyError("the constraint compiler is busy with other requests; retry shortly")
            ran = time.monotonic() - job.started if job.started is not None else 0.0
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), max(0.0, self.timeout_s - ran))
            except TimeoutError:
                raise GrammarError(f"{spec.param}: the constraint took longer than {self.timeout_s:g} s to compile",
                                   spec.param) from None
        except asyncio.CancelledError:
            job.cancel()                          # the caller left: a compile not started is dropped
            raise

    def shutdown(self) -> None:
        """Stop the worker; requests whose compile had not started fail with EngineDeadError."""
        with self._lock:
            self._closed = True
            pending, self._queue = self._queue, []
            self._queued.notify_all()
        for *_, job in pending:
            if job.set_running_or_notify_cancel():
                job.set_exception(EngineDeadError("the engine shut down before the constraint was compiled"))

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._queued.wait()
                if self._closed:
                    return
                *_, spec, job = heapq.heappop(self._queue)
            if not job.set_running_or_notify_cancel():
                continue                      # its request stopped waiting
            job.started = time.monotonic()
            try:
                job.set_result(self.compile(spec) if job.compiled_only else self.new_state(spec))
            except BaseException as exc:  # noqa: BLE001 - handed to the request that waits
                job.set_exception(exc)

    def _build(self, spec: GrammarSpec) -> CompiledGrammar | _Refusal:
        started = time.perf_counter()
        llg = self.llg_tokenizer
        try:
            grammar = _grammar_text(spec)
        except ValueError as exc:
            return _Refusal(_short(str(exc)))
        matcher = llguidance.LLMatcher(llg, grammar, log_level=0, limits=llguidance.LLParserLimits(**LIMITS))
        if not matcher.is_error():
            # The first token's mask, on a copy: a grammar that admits no string at all (a schema
            # that is only a reference to itself) fails there, before any request runs it.
            probe = matcher.deep_copy()
            probe.compute_bitmask()
            matcher = matcher if not probe.is_error() else probe
        if matcher.is_error():
            what = "schema" if spec.kind == "json_schema" else "constraint"
            return _Refusal(f"the {what} cannot be enforced ({_short(matcher.get_error())})")
        elapsed = time.perf_counter() - started
        self.compile_seconds.append(elapsed)
        return CompiledGrammar(spec, matcher, tuple(llg.eos_tokens), elapsed)


_STACK_SIZE_LOCK = threading.Lock()


def _deep_thread(target, name: str) -> threading.Thread:
    """A started daemon thread with COMPILE_STACK_BYTES of stack (the size applies to threads
    started while it is set, so it is set and put back under a lock)."""
    with _STACK_SIZE_LOCK:
        previous = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    return thread


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
