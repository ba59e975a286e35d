from pathlib import Path

import pytest

from policies.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_is_valid():
    cfg = load_config(ROOT / "config" / "default.yaml")
    assert cfg.default_tier in cfg.tiers


@pytest.mark.parametrize("text,needle", [
    ("tiers:\n  small:\n    dtype: int3\n", "tiers.small.dtype"),
    ("tiers:\n  small:\n    bogus: 1\n", "tiers.small.bogus"),
    ("tiers: {}\n", "at least one tier"),
    ("tiers:\n  small: {}\ndefault_tier: big\n", "default_tier"),
    ("tiers: [unclosed\n", "not valid YAML"),
    ("tiers:\n  small:\n    max_num_seqs: 64\n    max_num_batched_tokens: 32\n", "at least max_num_seqs"),
    ("tiers:\n  small:\n    quantization: int3\n", "tiers.small.quantization"),
])
def test_bad_config_names_field_and_reason(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle) as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
