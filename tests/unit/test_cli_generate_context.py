"""`tiergate generate --model` checks the prompt plus --max-tokens against the model's context, as
the --tier path does, instead of allocating a cache for whatever was asked."""

from __future__ import annotations

import pytest

from engines.errors import ContextLengthError
from engines.loaded_model import load_model
from engines.simple_generate import SimpleSampling, generate_tokens
from gateway.cli.main import main
from tests.tiny_models import write_tiny_checkpoint

CONTEXT = 256    # the tiny checkpoint's max_position_embeddings


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-generate")
    write_tiny_checkpoint(path, seed=3)
    return path


def test_past_the_context_is_refused_when_called(tiny_dir):
    loaded = load_model(str(tiny_dir), "float32")
    # Raised by the call itself, before the first token: nothing of the request is allocated.
    with pytest.raises(ContextLengthError, match=f"context length {CONTEXT}"):
        generate_tokens(loaded.model, [5, 6, 7], SimpleSampling(max_tokens=100_000_000))
    assert len(list(generate_tokens(loaded.model, [5, 6, 7], SimpleSampling(max_tokens=CONTEXT - 3,
                                                                            ignore_eos=True)))) == CONTEXT - 3


def test_cli_exits_2_with_one_line(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--dtype", "float32", "--max-tokens", "100000000",
                 "w5 w6"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"context length {CONTEXT}" in err, err


def test_cli_within_the_context_still_generates(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--dtype", "float32", "--max-tokens", "4", "w5 w6"]) == 0
    assert capsys.readouterr().out.strip()
