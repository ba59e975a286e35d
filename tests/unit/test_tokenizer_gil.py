"""Tokenizing a long prompt lets other Python threads run: the gateway tokenizes big bodies in a
worker thread so that the event loop (every other request) goes on meanwhile, which it can only
if the tokenizer lets go of the GIL. `tokenizers` holds it through `encode`/`decode` and releases
it in their batch forms; long inputs go through those, with the same ids and text.

How it is observed without timing anything: a counting thread starts when the call starts, and the
interpreter is told not to switch threads on its own for the duration; whatever it counted by the
time the call returns, it counted while the call ran, which it can only do if the GIL was free."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from engines.tokenizer import TextTokenizer

TEXT = "hello world, {\"key\": [1, 2, 3]} " * 40_000          # about 1.3 MB


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.tiny_models import write_tiny_byte_checkpoint

    path = tmp_path_factory.mktemp("bytes")
    write_tiny_byte_checkpoint(path)
    return TextTokenizer.from_file(path / "tokenizer.json", {})


def _counted_while(call):
    """(call's result, what a second thread counted while it ran)."""
    go, stop = threading.Event(), threading.Event()
    count = [0]

    def counter():
        go.wait()
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)                # gives the GIL back at once whenever it has it

    thread = threading.Thread(target=counter)
    thread.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)          # no forced switch: only a released GIL lets it count
    try:
        go.set()
        result = call()
        counted = count[0]
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        thread.join()
    return result, counted


def test_a_long_text_is_encoded_with_the_gil_released_and_the_same_ids(tok):
    ids, counted = _counted_while(lambda: tok.encode(TEXT, add_special_tokens=False))
    assert counted > 0
    assert ids == tok.backend.encode(TEXT, add_special_tokens=False).ids


def test_a_long_id_list_is_decoded_with_the_gil_released_and_the_same_text(tok):
    ids = tok.backend.encode(TEXT, add_special_tokens=False).ids
    text, counted = _counted_while(lambda: tok.decode(ids))
    assert counted > 0
    assert text == tok.backend.decode(ids)
