"""The code detector (policies/request_signals.py): evidence is weighed, so one weak word never
fires alone; strong syntax does; the work is bounded by the window whatever the prompt's size."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from policies.request_signals import WINDOW_CHARS, code_signal, prompt_window


@pytest.mark.parametrize("text,why", [
    ("Here is my code:\n```\nprint('hi')\n```\nWhy does it fail?", "fenced code"),
    ("def area(r):\n    return 3.14 * r * r", "syntax def"),
    ("import numpy as np\nx = np.zeros(3)", "syntax import"),
    ("from collections import Counter", "syntax import"),
    ("import React, { useState } from 'react'", "syntax import"),
    ("import {a, b} from \"./lib\"", "syntax import"),
    ("class Point(Base):\n    pass", "syntax class"),
    ("export class Store<T> {", "syntax class"),
    ("  pub fn parse<'a>(s: &'a str)", "syntax fn"),
    ("    at com.acme.App.main(App.java:12)", "syntax traceback"),
    ("#include <stdio.h>\nint main(void) { return 0; }", "syntax #include"),
    ("function add(a, b) {\n  return a + b\n}", "syntax function"),
    ("SELECT name, age FROM users WHERE age > 30", "syntax SELECT…FROM"),
    ("const inc = (x) => x + 1", "syntax =>, declaration"),
    ("for (i = 0; i < n; i++) { total += a[i]; } if (x) { y(); }", "braces/semicolons"),
    ("Traceback (most recent call last):\n  File \"a.py\", line 3", "syntax traceback"),
    ("Write a python function that reverses a string", "words function, python"),
    ("Why does my regex not match in JavaScript?", "words javascript, regex"),
    ("My C++ code segfaults when the compiler optimizes it", "words c++, compiler"),
    ("Can you show me VBA Code to export my Calendar items to an excel File", "words vba"),   # one software word
    ("using swift vapor can I generate a swagger api automatically?", "words api, swagger"),
    ("Write a function that adds two numbers", "asks to write"),                          # weak word + request
])
def test_fires_on_code(text, why):
    assert why in (code_signal(text) or "")


@pytest.mark.parametrize("text", [
    "The python is a large snake found in Africa and Asia; it squeezes its prey.",   # one weak word
    "I found a bug in my garden this morning.",
    "The function of the liver is to filter the blood.",
    "How does the liver function?",
    "Write a poem about the sea.",
    "Write a letter to my landlord about the broken heater.",
    "Please select one from the list of options.",                                  # not SQL
    "What is the capital of France?",
    "I am debugging my decoder ring with a friend.",                               # no whole domain word
    "Tell me a story about a dragon who learns to fly. " * 400,                    # long prose
    "",
])
def test_stays_quiet_on_prose(text):
    assert code_signal(text) is None


def test_code_past_the_window_in_the_middle_is_not_read():
    filler = "Tell me about the sea and the sky. " * (WINDOW_CHARS // 10)
    middle = filler + "\ndef hidden(x):\n    return x\n" + filler
    assert code_signal(middle) is None                          # only the ends are looked at
    assert code_signal(filler + "\ndef at_the_end(x):\n    return x\n") == "syntax def"
    assert code_signal("def at_the_start(x):\n    return x\n" + filler) == "syntax def"


def test_prompt_window_keeps_both_ends_without_joining_everything():
    parts = ["a" * 10, "b" * (4 * WINDOW_CHARS), "c" * 10]
    window = prompt_window(parts)
    assert window.startswith("a" * 10 + "\n" + "b") and window.endswith("b\n" + "c" * 10)
    assert len(window) <= 2 * WINDOW_CHARS + 1
    assert prompt_window(["x", "y"]) == "x\ny"


# Runs of what two neighbouring parts of a pattern could both match, after the keyword that lets
# the pattern run: with backtracking, one such prompt of 16 KB took minutes on the event loop.
ADVERSARIAL = {
    "import_spaces": "'import ' + ' ' * 16000", "import_tabs": "'import ' + '\\t' * 16000",
    "import_items": "'import a' + ', a' * 5000", "class_letters": "'class ' + 'a' * 16000",
    "class_spaces": "'class x' + ' ' * 16000", "fence_newlines": "'\\n' * 16000 + '```'",
    "function_spaces": "'function' + ' ' * 16000 + 'f'", "at_colons": "'    at x(' + ':' * 16000",
    "phrase_spaces": "'regular' + ' ' * 16000 + 'x expression'", "fn_spaces": "'pub fn ' + ' ' * 16000",
}


def test_no_prompt_makes_the_detector_backtrack_through_a_run():
    """All the shapes together finish in seconds (each is a fraction of a millisecond; before the
    patterns were made possessive the first alone ran for minutes). In a child process, so that
    a regression fails at the timeout instead of hanging the suite."""
    script = textwrap.dedent(f"""
        from policies.request_signals import code_signal
        for text in [{", ".join(ADVERSARIAL.values())}]:
            code_signal(text)
        print("done")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "done", done.stderr
