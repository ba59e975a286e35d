"""Compile constraints off the engine thread, once per digest.

Compiling a grammar (building its lexer and parser over the tokenizer) takes about a millisecond
for an ordinary schema and can take far longer for a hostile one, so it never runs on the engine
thread: `submit` hands it to this compiler's own worker thread and returns a future; the async
engine awaits it (with a timeout) before the request enters the engine. Compiled grammars are
kept in a bounded LRU keyed by the spec's digest (errors too, so a bad schema sent again fails at
once); every request gets its own matcher, a deep copy of the cached one, made in the worker too.

llguidance's parser limits bound the work a grammar may cause at compile time and per token, so
a compile that passes the timeout still ends; the client has had its 400 by then.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from engines.grammar.errors import GrammarError
from engines.grammar.llg_tokenizer import build_llg_tokenizer, token_reference
from engines.grammar.spec import JSON_OPTIONS, GrammarSpec
from engines.grammar.state import GrammarState
from engines.tokenizer import TextTokenizer

MAX_CACHED = 256
COMPILE_TIMEOUT_S = 10.0
MAX_ERROR_CHARS = 300
# Tighter than llguidance's defaults (500k symbols, 1M lexer fuel): a schema the gateway admits
# (bounded size and depth) compiles far below these.
LIMITS = dict(max_grammar_size=200_000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
              step_max_items=50_000, max_lexer_states=100_000, verbose_errors=False)


def _grammar_text(spec: GrammarSpec) -> str:
    """The spec as llguidance's grammar text; ValueError when it does not parse."""
    if spec.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=JSON_OPTIONS)
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    if spec.kind in ("choice", "grammar"):
        return llguidance.LLMatcher.grammar_from_lark(llguidance.grammar_from(spec.kind, spec.text))
    return llguidance.LLMatcher.grammar_from_lark(spec.text)


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


class GrammarCompiler:
    def __init__(self, tokenizer: TextTokenizer, vocab_size: int, max_cached: int = MAX_CACHED,
                 timeout_s: float = COMPILE_TIMEOUT_S):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        self.timeout_s = timeout_s
        self._llg: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar | GrammarError] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
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

    def token_reference(self, text: str) -> str | None:
        """A Lark reference to the special token spelling `text`, if there is one (see llg_tokenizer)."""
        return token_reference(self.llg_tokenizer, self.tokenizer, text)

    # ---- compiling -----------------------------------------------------------------------
    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar, from the cache or built now (in the caller's thread)."""
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
        if isinstance(hit, GrammarError):
            raise GrammarError(str(hit), spec.param)     # named after this request's field
        return hit

    def new_state(self, spec: GrammarSpec) -> GrammarState:
        return self.compile(spec).new_state()

    def submit(self, spec: GrammarSpec) -> Future[GrammarState]:
        """A fresh state for one request, compiled (or copied) in the compiler's worker thread."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiergate-grammar")
            pool = self._pool
        return pool.submit(self.new_state, spec)

    async def state_for(self, spec: GrammarSpec) -> GrammarState:
        """`submit`, awaited with the compile timeout: past it the request is refused (a 400
        naming its field); the worker finishes the compile under llguidance's limits."""
        future = asyncio.wrap_future(self.submit(spec))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            raise GrammarError(f"{spec.param}: the constraint took longer than {self.timeout_s:g} s to compile",
                               spec.param) from None

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _build(self, spec: GrammarSpec) -> CompiledGrammar | GrammarError:
        started = time.perf_counter()
        llg = self.llg_tokenizer
        try:
            grammar = _grammar_text(spec)
        except ValueError as exc:
            return GrammarError(f"{spec.param}: {_short(str(exc))}", spec.param)
        matcher = llguidance.LLMatcher(llg, grammar, log_level=0, limits=llguidance.LLParserLimits(**LIMITS))
        if matcher.is_error():
            what = "schema" if spec.kind == "json_schema" else "constraint"
            return GrammarError(f"{spec.param}: the {what} cannot be enforced ({_short(matcher.get_error())})",
                                spec.param)
        elapsed = time.perf_counter() - started
        self.compile_seconds.append(elapsed)
        return CompiledGrammar(spec, matcher, tuple(llg.eos_tokens), elapsed)


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + "..."
