"""What a learned router reads of a prompt: named sparse features of its text, the same at
training time (bench/routing/train_router.py) and when a request arrives.

Each feature is a name with a value, mostly 1.0 for "present": the prompt's words (lowered,
each counted once), its first words (how a request opens — "write", "hi", "translate" — says
much of what it asks), buckets of its length in characters, words and lines, the share of
letters outside ASCII, and the verdicts of the hand-written detectors (code, language), which
a linear model can then weigh against everything else.

The work is bounded whatever the prompt's size: words come from the prompt's first
WORDS_WINDOW_CHARS characters (at most MAX_WORDS of them), the detectors read their own
bounded windows, and every pattern is linear in what it reads; a few hundred microseconds on a
long prompt.
"""

from __future__ import annotations

import math
import re

from policies.language_signal import language_signal

# Raising this changes what every feature means: a model file names the version it was fitted on.
FEATURES_VERSION = 1
WORDS_WINDOW_CHARS = 4 * 1024    # words, openings and scripts are read from the prompt's start
LANGUAGE_WINDOW_CHARS = 2 * 1024
MAX_WORDS = 512
MAX_WORD_CHARS = 24
OPENING_WORDS = 2

_WORD = re.compile(r"[^\W_]+|[#+]{1,2}", re.UNICODE)


def _bucket(value: int) -> int:
    """log2 buckets: 0, 1, 2-3, 4-7, ..."""
    return 0 if value <= 0 else int(math.log2(value)) + 1


def prompt_vector(text: str, code: str | None) -> dict[str, float]:
    """prompt_features scaled to unit length: a long prompt's hundreds of words then weigh as
    much in all as a short prompt's few (what a linear model reads, at training and serving)."""
    features = prompt_features(text, code)
    norm = math.sqrt(sum(v * v for v in features.values()))
    return {name: v / norm for name, v in features.items()} if norm else features


def prompt_features(text: str, code: str | None) -> dict[str, float]:
    """The prompt's features by name. `text` is the user's prompt as the detectors see it
    (request_signals.prompt_window of the messages' text); `code` is request_signals.code_signal
    of it, which the caller has (the gateway runs the detector once for rules and model alike)."""
    words = _WORD.findall(text, 0, WORDS_WINDOW_CHARS)
    out: dict[str, float] = {}
    for i, word in enumerate(words[:OPENING_WORDS]):
        out[f"open{i}:{word.lower()[:MAX_WORD_CHARS]}"] = 1.0
    letters = outside = 0
    for word in words[:MAX_WORDS]:
        out["w:" + word.lower()[:MAX_WORD_CHARS]] = 1.0
        letters += len(word)
        if not word.isascii():
            outside += sum(1 for c in word if ord(c) > 127)
    out[f"chars:{_bucket(len(text))}"] = 1.0
    out[f"words:{_bucket(len(words))}"] = 1.0
    out[f"lines:{_bucket(text.count(chr(10)))}"] = 1.0
    if letters:
        out[f"non_ascii:{min(10, int(10 * outside / letters))}"] = 1.0
    if "?" in text:
        out["question_mark"] = 1.0
    if code is not None:
        out["code_signal"] = 1.0
    if language_signal(text[:LANGUAGE_WINDOW_CHARS]) is not None:
        out["non_english_signal"] = 1.0
    return out
