import pytest

from engines.errors import ModelLoadError
from engines.model_config import ModelConfig

BASE = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def test_transformers_v4_and_v5_rope_spellings_agree():
    v4 = ModelConfig.from_hf({**BASE, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    v5 = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0}})
    assert v4 == v5
    assert v4.rope_theta == 5e5 and v4.rope_scaling.rope_type == "llama3" and v4.head_dim == 16


def test_round_trip_through_hf_dict():
    cfg = ModelConfig.from_hf({**BASE, "tie_word_embeddings": True, "eos_token_id": [2, 7]})
    assert ModelConfig.from_hf(cfg.to_hf()) == cfg


@pytest.mark.parametrize("raw,needle", [
    ({**BASE, "architectures": ["GPT2LMHeadModel"]}, "unsupported architecture"),
    ({**BASE, "hidden_act": "gelu"}, "hidden_act"),
    ({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4}}, "yarn"),
    ({k: v for k, v in BASE.items() if k != "vocab_size"}, "vocab_size"),
    ({**BASE, "num_key_value_heads": 3}, "multiple"),
])
def test_bad_configs_fail_with_a_reason(raw, needle):
    with pytest.raises(ModelLoadError, match=needle):
        ModelConfig.from_hf(raw)
