from pathlib import Path

import pytest

from policies.config import ConfigError, hash_api_key, is_loopback, load_config, parse_config
from policies.tier_config import EmbeddedTierConfig, UpstreamTierConfig

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_is_the_three_tier_embedded_default():
    cfg = load_config(ROOT / "config" / "default.yaml")
    assert cfg.default_tier in cfg.tiers
    assert set(cfg.tiers) == {"small", "large", "fast"}
    assert all(isinstance(t, EmbeddedTierConfig) for t in cfg.tiers.values())
    small, large, fast = cfg.tiers["small"], cfg.tiers["large"], cfg.tiers["fast"]
    assert small.model == fast.model == "default" and large.model == "qwen"
    assert (large.quantization, large.kv_cache_dtype) == ("int4-gguf", "int8")
    # the latency tier speculates; FP8 weights are a storage format on a CPU (dequantized per matmul)
    assert fast.speculative.method == "ngram" and fast.quantization == "w4a8-gguf"
    assert (small.quantization, small.kv_cache_dtype) == ("w4a8-gguf", "int8") and small.speculative is None
    assert all(t.dtype == "auto" for t in cfg.tiers.values())
    assert not cfg.auth.enabled and is_loopback(cfg.server.host)
    assert list(cfg.models) == ["auto", "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"]
    assert cfg.models["smollm2-135m-instruct"].chain == ["small", "fast"]
    assert cfg.models["qwen2.5-coder-0.5b-instruct"].chain == ["large"]
    assert not cfg.models["auto"].pinned and all(cfg.models[m].pinned for m in list(cfg.models)[1:])


@pytest.mark.parametrize("name", ["upstream.yaml", "auth.yaml", "profile_routing.yaml"])
def test_example_configs_are_valid(name, monkeypatch):
    path = ROOT / "config" / "examples" / name
    monkeypatch.setenv("TIERGATE_KEY_ACME", "sk-acme-example")
    monkeypatch.setenv("UPSTREAM_API_KEY", "sk-upstream-example")
    load_config(path)


@pytest.mark.parametrize("text,needle", [
    ("tiers:\n  small:\n    dtype: int3\n", "tiers.small.dtype"),
    ("tiers:\n  small:\n    bogus: 1\n", "tiers.small.bogus"),
    ("tiers: {}\n", "at least one tier"),
    ("tiers:\n  small: {}\ndefault_tier: big\n", "default_tier"),
    ("tiers: [unclosed\n", "not valid YAML"),
    ("- a list\n", "top level must be a mapping"),
    ("tiers:\n  small:\n    max_num_seqs: 64\n    max_num_batched_tokens: 32\n", "at least max_num_seqs"),
    ("tiers:\n  small:\n    quantization: int3\n", "tiers.small.quantization"),
    ("tiers:\n  small:\n    kv_cache_dtype: int2\n", "tiers.small.kv_cache_dtype"),
    ("tiers:\n  s:\n    speculative: {method: draft}\n", "tiers.s.speculative: method 'draft' needs draft_model"),
    ("tiers:\n  s:\n    speculative: {method: ngram, ngram_min: 5, ngram_max: 2}\n", "tiers.s.speculative"),
    ("tiers:\n  r:\n    kind: upstream\n    model: m\n    base_url: ftp://x\n", "tiers.r: base_url must start"),
    ("tiers:\n  r:\n    kind: upstream\n    base_url: http://x/v1\n", "tiers.r.model: Field required"),
    ("tiers:\n  r:\n    kind: remote\n", "tiers.r"),
    ("tiers:\n  r:\n    kind: upstream\n    model: m\n    base_url: http://x\n    api_key_env: NOPE_NOT_SET\n",
     "NOPE_NOT_SET"),
    ("tiers: {a: {}}\nauth: {keys: [{tenant: t, sha256: abc}]}\ntenants: {t: {}}\n", "auth.keys.0: sha256 must"),
    ("tiers: {a: {}}\nauth: {keys: [{tenant: t}]}\ntenants: {t: {}}\n", "exactly one of sha256 or env"),
    ("tiers: {a: {}}\nauth: {keys: [{tenant: ghost, env: HOME}]}\ntenants: {t: {}}\n",
     "auth.keys.0.tenant: unknown tenant 'ghost'"),
    ("tiers: {a: {}}\nauth: {enabled: false, anonymous_tenant: x}\ntenants: {t: {}}\n", "anonymous_tenant"),
    ("tiers: {a: {}}\ntenants: {t: {models: [nope]}}\n", "tenants.t.models: unknown model 'nope'"),
    ("tiers: {a: {}}\nserver: {port: 70000}\n", "server.port"),
])
def test_bad_config_names_field_and_reason(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")) as info:
        load_config(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_defaults_fill_in_models_and_tenant():
    # auth is on by default, so the one section a minimal file needs is a key
    cfg = parse_config(f"auth: {{keys: [{{tenant: default, sha256: {hash_api_key('sk-test')}}}]}}\n"
                       "tiers:\n  a: {served_name: alpha}\n  b:\n    kind: upstream\n    model: m\n"
                       "    base_url: http://h:1/v1/\n")
    assert {k: v.chain for k, v in cfg.models.items()} == {"alpha": ["a"], "b": ["b"]}
    assert list(cfg.tenants) == ["default"] and cfg.auth.enabled
    assert isinstance(cfg.tiers["b"], UpstreamTierConfig) and cfg.tiers["b"].base_url == "http://h:1/v1"


def test_keys_from_env_are_hashed(monkeypatch):
    monkeypatch.setenv("MY_KEY", "sk-secret")
    cfg = parse_config("tiers: {a: {}}\ntenants: {t: {}}\nauth: {keys: [{tenant: t, env: MY_KEY}, "
                       f"{{tenant: t, sha256: {hash_api_key('other').upper()}}}]}}\n")
    assert [k.digest() for k in cfg.auth.keys] == [hash_api_key("sk-secret"), hash_api_key("other")]


def test_loopback_hosts():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")


def test_profile_routing_example_serves_the_default_tiers():
    """The benchmarks' profile-only routing (config/examples/profile_routing.yaml) measures the
    default's tiers: the same tiers, models and aliases, only the need rules and the cascades
    left out (each row measures the tier its profile names)."""
    default = load_config(ROOT / "config" / "default.yaml")
    example = load_config(ROOT / "config" / "examples" / "profile_routing.yaml")
    assert example.tiers == default.tiers and example.models == default.models
    assert [r.name for r in example.routing.rules] == ["latency", "memory", "throughput"]
    assert [r.model_copy(update={"cascade": None}) for r in default.routing.rules
            if r.name in ("latency", "memory", "throughput")] == example.routing.rules
