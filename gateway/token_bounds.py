"""Upper bounds on the tokens one request can consume at a tier: what its budget reservation holds.

Reconciling after the answer cannot take tokens back, so a reservation below what the tier
then counts lets concurrent requests overshoot a budget. The bound is therefore never an
average guess: it must be at least what the tier can report.

Prompt, at an upstream tier (embedded tiers count their very ids: request_limits.py):
- every text the upstream's chat template may render is counted: each message's role, name,
  text parts and extra fields (tool calls ...; as indented JSON), and the body's extra fields
  (tools, documents ...; as indented JSON, the longest form templates render them in);
- without a tokenizer, each text costs its UTF-8 length. Why that bounds the count: byte-level
  BPE (GPT-2, Llama 3, Qwen, SmolLM, tiktoken's encodings) maps every byte into exactly one
  token and no token covers less than one byte; SentencePiece with byte fallback (Llama 2,
  Mistral, Gemma) spends at most one token per byte of an unknown character and at most one
  dummy-prefix token per text; WordPiece and character vocabularies spend at most one token per
  character. A text of n bytes is thus at most n + 1 tokens (SEGMENT_SLACK covers the + 1 and
  one more for a boundary that splits differently inside the rendered prompt). A tokenizer may
  first normalize the text, and Unicode normal forms can be longer than the text (U+0958 is 3
  bytes, 6 in NFC; U+FDFA 3, 33 in NFKC): n is the longest of the text and its four normal forms;
- with the upstream's own tokenizer.json, each text is counted by it, special-token strings as
  plain text (which is never fewer tokens than the special token they may turn into), with the
  same slack per text; the smaller of the two counts is used, since both are bounds;
- what the template adds itself is bounded by MESSAGE_OVERHEAD per message (the markers around
  one message: ChatML, Llama 3 and Gemma spend 4, Mistral at most 3) and CHAT_OVERHEAD per
  request (BOS, the generation prompt, and the default system prompt some templates insert when
  the request has none: SmolLM2's costs 21 tokens with its markers), plus TOOLS_OVERHEAD when
  tools are given (the instructions templates wrap around tool definitions: ~100-150 tokens in
  Qwen 2.5 and Llama 3.1);
- an upstream that knows its context length (max_model_len) refuses a longer prompt, so the
  prompt bound is also at most that.
This holds for templates that render each field at most once; a per-request template (vLLM's
`chat_template` field) is outside it, as is a tokenizer other than the one configured.

Completion: max_tokens x choices x prompts, where the client gave max_tokens; else the tier's
context per choice (an upstream cannot generate past it; an embedded tier exactly its context
minus the prompt); else DEFAULT_OUTPUT_BOUND per choice, which is then also sent to the upstream
as its max_tokens, so the bound is one it cannot exceed.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Sequence

from gateway.schema import ChatCompletionRequest, CompletionRequest, RequestBody

# Counts tokens of each text (a tokenizer); None: UTF-8 bytes only.
TextCounter = Callable[[Sequence[str]], list[int]]

SEGMENT_SLACK = 2          # per text: a dummy prefix, and a boundary that splits differently
MESSAGE_OVERHEAD = 8       # per chat message: the template's markers around it
CHAT_OVERHEAD = 64         # per chat request: BOS, generation prompt, a default system prompt
TOOLS_OVERHEAD = 512       # per chat request with tools: the template's tool instructions
PROMPT_OVERHEAD = 4        # per completions prompt: BOS/EOS the server may add
DEFAULT_OUTPUT_BOUND = 4096  # per choice, when neither the client nor the tier bounds the output
_TOOL_FIELDS = ("functions",)      # the deprecated form, kept as sent in model_extra
_NORMAL_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


def utf8_length(text: str) -> int:
    """The UTF-8 length of `text` or of its longest Unicode normal form (what a tokenizer's
    normalizer may turn it into); ASCII is its own normal form."""
    # surrogatepass: a lone surrogate (legal in JSON) is 3 bytes, as the upstream then sees it.
    length = len(text.encode("utf-8", "surrogatepass"))
    if text.isascii():
        return length
    for form in _NORMAL_FORMS:
        length = max(length, len(unicodedata.normalize(form, text).encode("utf-8", "surrogatepass")))
    return length


def utf8_lengths(texts: Sequence[str]) -> list[int]:
    return [utf8_length(text) for text in texts]


def _as_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, indent=4, default=str)


def _chat_texts(body: ChatCompletionRequest) -> tuple[list[str], int]:
    texts: list[str] = []
    fixed = CHAT_OVERHEAD + MESSAGE_OVERHEAD * len(body.messages)
    for message in body.messages:
        texts.append(message.role)
        if message.name:
            texts.append(message.name)
        if isinstance(message.content, str):
            texts.append(message.content)
        elif message.content:
            for part in message.content:
                texts.append(part.text)
                if part.model_extra:
                    texts.append(_as_json(part.model_extra))
        if message.model_extra:
            texts.append(_as_json(message.model_extra))
    if body.tools:        # modelled (gateway/schema_tools.py): rendered into the prompt as JSON
        texts.append(_as_json([t.model_dump(exclude_unset=True) for t in body.tools]))
        fixed += TOOLS_OVERHEAD
    extra = body.model_extra
    if extra:
        texts.append(_as_json(extra))
        if not body.tools and any(extra.get(name) for name in _TOOL_FIELDS):
            fixed += TOOLS_OVERHEAD
    return texts, fixed


def _completion_texts(body: CompletionRequest) -> tuple[list[str], int]:
    texts: list[str] = []
    fixed = 0
    for prompt in body.prompts():
        fixed += PROMPT_OVERHEAD
        if isinstance(prompt, str):
            texts.append(prompt)
        else:
            fixed += len(prompt)            # token ids are counted as given
        if body.suffix:                     # the suffix goes with every prompt
            texts.append(body.suffix)
    return texts, fixed


def prompt_texts(body: RequestBody) -> tuple[list[str], int]:
    """The texts an upstream may tokenize for this request's prompt, and the tokens it may add
    around them (overheads; token-id prompts)."""
    if isinstance(body, ChatCompletionRequest):
        return _chat_texts(body)
    return _completion_texts(body)


def prompt_bound(body: RequestBody, counter: TextCounter | None = None) -> int:
    """At least as many prompt tokens as an upstream can count for `body` (see the module notes);
    `counter`: the upstream's own tokenizer, when configured."""
    texts, fixed = prompt_texts(body)
    fixed += SEGMENT_SLACK * len(texts)
    by_bytes = fixed + sum(utf8_lengths(texts))
    if counter is None or not texts:
        return by_bytes
    try:
        by_tokens = fixed + sum(counter(texts))
    except Exception:  # noqa: BLE001 - a text the tokenizer refuses: the byte bound still holds
        return by_bytes
    return min(by_bytes, by_tokens)


def choices(body: RequestBody) -> int:
    """Sequences generated per prompt (best_of generates that many, n are returned)."""
    if isinstance(body, CompletionRequest):
        return max(body.n, body.best_of or 0)
    return body.n


def prompt_count(body: RequestBody) -> int:
    return len(body.prompts()) if isinstance(body, CompletionRequest) else 1


def sequences(body: RequestBody) -> int:
    """Sequences the request generates side by side: every prompt's choices. Its completion
    tokens are spread over them (time per output token divides by this, not by n)."""
    return choices(body) * prompt_count(body)


def output_bound(body: RequestBody, context: int | None, exact_prompt: int | None = None) -> tuple[int, int | None]:
    """(completion tokens reserved over every choice and prompt, the max_tokens the tier must be
    sent so that it cannot generate more, or None when the client's or the context's limit
    already holds it). `exact_prompt`: the prompt's exact token count over all prompts, where the
    tier counts it itself (an embedded tier gives each choice its context minus its prompt)."""
    per_prompt = choices(body)
    prompts = prompt_count(body)
    limit = body.output_limit
    if limit is not None:
        return limit * per_prompt * prompts, None
    if context:
        if exact_prompt is not None:    # sum over prompts of (context - prompt), each at least 1
            return per_prompt * max(prompts, prompts * context - exact_prompt), None
        return context * per_prompt * prompts, None
    return DEFAULT_OUTPUT_BOUND * per_prompt * prompts, DEFAULT_OUTPUT_BOUND
