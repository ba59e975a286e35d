"""An upstream tier's `tokenizer:`: checked when the config loads, loaded once per file for the
budget estimate, and a file that will not load leaves the estimate on its byte bound."""

from __future__ import annotations

import pytest

from engines.loaded_model import resolve_checkpoint_dir
from gateway.tier_tokenizers import TierTokenizers
from policies.config import ConfigError, parse_config


def _config(tokenizer: str) -> str:
    return f"""
auth: {{enabled: false}}
tiers: {{up: {{kind: upstream, base_url: "http://127.0.0.1:9/v1", model: m, tokenizer: "{tokenizer}"}}}}
"""


def test_a_missing_tokenizer_fails_at_load_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match="tiers.up.*tokenizer"):
        parse_config(_config(str(tmp_path / "nope.json")))
    path = resolve_checkpoint_dir("default") / "tokenizer.json"
    assert parse_config(_config(str(path))).tiers["up"].tokenizer == path


async def test_a_tokenizer_is_loaded_once_and_a_bad_one_counts_nothing(tmp_path):
    tokenizers = TierTokenizers()
    path = resolve_checkpoint_dir("default") / "tokenizer.json"
    first, second = await tokenizers.counter(path), await tokenizers.counter(str(path))
    assert first is second and first(["Say something."]) == [3]
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    assert await tokenizers.counter(bad) is None
    assert await tokenizers.counter(None) is None
