"""Is a prompt written in a language other than English? A cheap, pure detector for routing.

Small English-only models (SmolLM2 was trained on English web text) lose most against a
multilingual model on other languages, so a route rule may send those prompts to a larger tier.
Two kinds of evidence, each bounded to the first WINDOW_CHARS characters:

- script: most letters outside ASCII (Cyrillic, Greek, CJK, Arabic, Hangul, ...);
- vocabulary: a prompt in a Latin-script language of enough words in which hardly any are
  among the most common English words ("the", "and", "what", ...). Every English sentence of
  a few words has some; Spanish, Portuguese, Croatian or German prose has almost none.

Code and identifiers are not words of any language: a prompt the code detector fires on is
judged by the routing rule for code first (rules are ordered), so this one stays simple.
"""

from __future__ import annotations

import re

WINDOW_CHARS = 4 * 1024
MIN_WORDS = 3                # fewer words say nothing about the language
MIN_LETTERS = 8
ENGLISH_SHARE_BELOW = 0.05   # share of common English words under which a Latin-script prompt is not English
NON_ASCII_SHARE_ABOVE = 0.3  # share of letters outside ASCII above which the script is not English's

_WORD = re.compile(r"[^\W\d_]+")
_COMMON_ENGLISH = frozenset("""
a an the and or but if so as at by for from in into of on to with about over under than then
is are was were be been being am do does did done have has had having will would shall should can could may
might must not no yes it its this that these those there here what which who whom whose why when where how
i me my mine you your yours he him his she her we us our they them their all any some each every
please give write tell make explain list use using create show need want like get know help thanks thank
just also very more most much many one two new good best way time
""".split())


def language_signal(text: str) -> str | None:
    """Why the prompt looks like it is not in English ("script: 92 % of letters outside ASCII",
    "words: 0 of 7 common in English"), or None."""
    text = text[:WINDOW_CHARS]
    words = _WORD.findall(text)
    letters = sum(len(w) for w in words)
    if letters < MIN_LETTERS:
        return None
    outside = sum(1 for w in words for c in w if ord(c) > 127)
    if outside / letters > NON_ASCII_SHARE_ABOVE:
        return f"script: {100 * outside / letters:.0f} % of letters outside ASCII"
    if len(words) < MIN_WORDS:
        return None
    common = sum(1 for w in words if w.lower() in _COMMON_ENGLISH)
    if common / len(words) < ENGLISH_SHARE_BELOW:
        return f"words: {common} of {len(words)} common in English"
    return None
