"""Does a prompt look like a programming request? A cheap, pure detector for routing.

Evidence is weighed, so that one weak word never decides alone: prose about snakes that says
"python" once is not code, while "fix this python regex" (two domain words) or one line that
starts with `def f(` is. Strong evidence (a fenced block, syntax such as `#include` or `def
name(`, a density of braces and semicolons that prose never has, a word that only software
uses: "javascript", "nodejs", "sql", "vba") counts two points, each distinct domain word that
has another meaning ("python", "function", "bug") one; two points fire.

The words are what the routing benchmark found: on the tuning slice of ShareGPT the prompts a
coder model helps most ("write a VBA macro", "a babel plugin", "swift vapor and swagger")
named a technology and rarely showed syntax.

The work is bounded whatever the prompt's size: only its first and last WINDOW_CHARS characters
are looked at (code pasted into a long prompt sits at one end or the other far more often than
only in the middle), and every pattern is linear in what it reads: no two quantified parts that
follow each other can match the same characters (possessive quantifiers, `*+` and `++`, give up
nothing they took), so a prompt of spaces, tabs or letters after a keyword cannot make one
backtrack through every way of splitting the run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

WINDOW_CHARS = 8 * 1024      # looked at from each end of the prompt
FIRE_AT = 2                  # points of evidence that make a prompt "code"
_STRONG, _WEAK = 2, 1

_FENCE = re.compile(r"^[ \t]*+(```|~~~)", re.MULTILINE)

# Every byte that is not an ASCII letter, digit, '#' or '+' separates words; letters are lowered.
# One bytes.translate + split gives the prompt's words as a set (C loops only), which every test
# below looks up before running any regex: prose then costs a few set lookups per pattern.
_WORD_BYTES = bytes(
    (ord(chr(c).lower()) if chr(c).isalnum() or chr(c) in "#+" else 32) if c < 128 else 32 for c in range(256))

# (label, words or substrings that must occur, pattern): syntax that prose does not produce.
# Anchored to a line start where the keyword alone is an English word ("import", "class").
_SYNTAX: tuple[tuple[str, tuple[str, ...], re.Pattern[str]], ...] = (
    ("def", ("def",), re.compile(r"^[ \t]*+(?:async[ \t]++)?def[ \t]++\w++[ \t]*+\(", re.MULTILINE)),
    ("import", ("import",), re.compile(
        r"^[ \t]*+(?:import[ \t]++[\w.]++(?:[ \t]++as[ \t]++\w++)?[ \t]*+;?[ \t]*+$"
        r"|from[ \t]++[\w.]++[ \t]++import[ \t]++\w"
        r"|import[ \t]++(?:\{[^}\n]*+\}|\w++)(?:[ \t]*+,[ \t]*+(?:\{[^}\n]*+\}|\w++))*+[ \t]++from[ \t]++['\"])",
        re.MULTILINE)),
    ("#include", ("#include", "include"), re.compile(r"^[ \t]*+#[ \t]*+include[ \t]*+[<\"]", re.MULTILINE)),
    ("function", ("function",), re.compile(r"\bfunction\b[ \t]*+\w*+[ \t]*+\([^()\n]{0,200}\)[ \t]*+\{")),
    # Upper-case SQL, or `select * from` in any case ("select one from the list" is English).
    ("SELECT…FROM", ("select",), re.compile(r"\bSELECT\b[^\n;]{1,200}?\bFROM\b|(?i:\bselect[ \t]++\*[ \t]++from\b)")),
    ("=>", ("=>",), re.compile(r"[\w)\]][ \t]*+=>[ \t]*+[\w({\[\"']")),
    ("class", ("class",), re.compile(
        r"^[ \t]*+(?:export[ \t]++)?(?:public[ \t]++)?class[ \t]++\w++[\w \t,.()<>]*+[:{][ \t]*+$", re.MULTILINE)),
    ("declaration", ("const", "let", "var"),
     re.compile(r"^[ \t]*+(?:const|let|var)[ \t]++\w++[ \t]*+=[^=]", re.MULTILINE)),
    ("fn", ("fn",), re.compile(r"^[ \t]*+(?:pub[ \t]++)?fn[ \t]++\w++[ \t]*+[(<]", re.MULTILINE)),
    ("traceback", ("traceback", "\tat ", "    at "),
     re.compile(r"Traceback \(most recent call last\)|^[ \t]++at [\w$.<>]++\([^()\n]*?:\d", re.MULTILINE)),
    ("call;", (");",), re.compile(r"\w\([^()\n]{0,200}\)[ \t]*+;[ \t]*+$", re.MULTILINE)),
)

# Words of a coding assistant's domain: each is weak on its own (a python is also a snake).
# A phrase counts when all its words occur and the phrase itself does.
_DOMAIN_WORDS = (
    "python", "javascript", "typescript", "java", "golang", "rust", "c++", "c#", "sql", "bash", "shell script",
    "html", "css", "json", "yaml", "regex", "regexp", "regular expression", "stack trace", "traceback",
    "compile", "compiles", "compiler", "compilation", "bug", "bugs", "debug", "debugging", "exception",
    "segfault", "segmentation fault", "syntax error", "null pointer", "function", "functions", "variable",
    "variables", "api", "endpoint", "algorithm", "recursion", "refactor", "unit test", "unit tests", "git",
    "code", "coding", "programming", "script", "array", "string literal", "linked list", "dataframe",
)
# Words only software uses: each is strong evidence alone.
_TECH_WORDS = frozenset(w.encode() for w in """
javascript typescript nodejs npm jsx tsx php kotlin golang scala perl c++ c# cpp csharp sql mysql postgresql
postgres sqlite mongodb redis graphql html css json yaml xml regex regexp api apis sdk git github gitlab
vba powershell bash linux ubuntu docker kubernetes k8s nginx django flask fastapi laravel rails springboot
pandas numpy pytorch tensorflow dataframe jquery reactjs vuejs nextjs angularjs webpack babel eslint
frontend backend devops json5 http https ajax websocket oauth jwt stackoverflow vscode ide compiler
programming coding apex salesforce swagger postman selenium matlab arduino raspberry excel-vba
app apps database databases server servers website websites web software spreadsheet spreadsheets formula
formulas macro macros plugin plugins ui framework frameworks library libraries query queries schema android
ios cloud aws azure
""".split())
# Asking for something to be built: with one weak domain word ("write a function that ...") that
# is a programming request, without one ("write a poem") it is not.
_REQUEST_VERBS = frozenset(w.encode() for w in "write create build implement generate fix convert develop".split())
_SINGLE_WORDS = frozenset(w.encode() for w in _DOMAIN_WORDS if " " not in w) - _TECH_WORDS
_PHRASES = tuple((w, tuple(part.encode() for part in w.split()),
                  re.compile(r"(?<![\w#+])" + r"\s++".join(map(re.escape, w.split())) + r"(?![\w#+])", re.IGNORECASE))
                 for w in _DOMAIN_WORDS if " " in w)

_PUNCT_MIN = 6            # braces and semicolons: at least this many ...
_PUNCT_DENSITY = 0.015    # ... and this share of the non-space characters


def prompt_window(parts: Sequence[str], chars: int = WINDOW_CHARS) -> str:
    """The first and last `chars` characters of the parts joined by newlines, without building
    the whole join (the text code_signal looks at)."""
    total = sum(len(p) for p in parts) + max(0, len(parts) - 1)
    if total <= 2 * chars:
        return "\n".join(parts)
    head, tail = _take(parts, chars), _take([p[::-1] for p in reversed(parts)], chars)[::-1]
    return head + "\n" + tail


def _take(parts: Sequence[str], chars: int) -> str:
    out, left = [], chars
    for part in parts:
        if left <= 0:
            break
        piece = part[:left]
        out.append(piece)
        left -= len(piece) + 1
    return "\n".join(out)


def code_signal(text: str) -> str | None:
    """Why the text looks like a programming request ("fenced code", "syntax def, import",
    "words python, regex", ...), or None when the evidence falls short."""
    if len(text) > 2 * WINDOW_CHARS:
        text = text[:WINDOW_CHARS] + "\n" + text[-WINDOW_CHARS:]
    words = set(text.encode("utf-8", "surrogatepass").translate(_WORD_BYTES).split())
    points = 0
    why: list[str] = []
    if ("```" in text or "~~~" in text) and _FENCE.search(text):
        points += _STRONG
        why.append("fenced code")
    syntax = [label for label, needs, pattern in _SYNTAX
              if any(_occurs(need, words, text) for need in needs) and pattern.search(text)]
    if syntax:
        points += _STRONG * len(syntax)
        why.append("syntax " + ", ".join(syntax))
    punct = text.count("{") + text.count("}") + text.count(";")
    if punct >= _PUNCT_MIN:
        visible = len(text) - text.count(" ") - text.count("\n") - text.count("\t")
        if visible and punct / visible >= _PUNCT_DENSITY:
            points += _STRONG
            why.append(f"braces/semicolons {100 * punct / visible:.1f}%")
    tech = sorted(w.decode() for w in _TECH_WORDS.intersection(words))
    if tech:
        points += _STRONG
        why.append("words " + ", ".join(tech[:4]))
    if points < FIRE_AT:
        found = sorted(w.decode() for w in _SINGLE_WORDS.intersection(words))
        found += [phrase for phrase, parts, pattern in _PHRASES
                  if all(p in words for p in parts) and pattern.search(text)]
        if found:
            points += _WEAK * len(found)
            why.append("words " + ", ".join(found[:4]))
            verbs = sorted(w.decode() for w in _REQUEST_VERBS.intersection(words))
            if verbs:
                points += _WEAK
                why.append("asks to " + verbs[0])
    return "; ".join(why) if points >= FIRE_AT else None


def _occurs(need: str, words: set[bytes], text: str) -> bool:
    """A plain word is looked up in the prompt's word set; anything else is a substring."""
    return need.encode() in words if need.isalpha() or need.startswith("#") else need in text
