"""The Llama-family architecture description shared by loaders and the model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engines.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = {"default", "linear", "llama3"}


@dataclass(frozen=True)
class Architecture:
    """What tells one member of the family from another, for the loaders and the model."""
    name: str                          # GGUF `general.architecture`; ModelConfig.architecture
    hf_architectures: tuple[str, ...]  # config.json `architectures` read as this one; to_hf writes the first
    hf_model_type: str
    gguf_prefix: str                   # GGUF metadata keys: f"{gguf_prefix}.block_count", ...
    # llama.cpp's converter permutes the Q/K rows of `llama` models for its interleaved RoPE;
    # it leaves qwen2's in rotate-half order.
    gguf_permuted_qk: bool
    # Biases fixed by the architecture; None: as the checkpoint's config says (attention_bias,
    # which in HF Llama covers q/k/v and o alike, and mlp_bias).
    qkv_bias: bool | None
    o_proj_bias: bool | None
    mlp_bias: bool | None
    tie_word_embeddings: bool          # the default when config.json does not say

    def biases(self, attention_bias: bool, mlp_bias: bool) -> dict[str, bool]:
        """ModelConfig's bias fields: the architecture's where it fixes them, else the checkpoint's."""
        def pick(fixed: bool | None, configured: bool) -> bool:
            return configured if fixed is None else fixed
        return {"qkv_bias": pick(self.qkv_bias, attention_bias), "o_proj_bias": pick(self.o_proj_bias, attention_bias),
                "mlp_bias": pick(self.mlp_bias, mlp_bias)}


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", ("LlamaForCausalLM", "MistralForCausalLM"), "llama", "llama",
                 gguf_permuted_qk=True, qkv_bias=None, o_proj_bias=None, mlp_bias=None, tie_word_embeddings=False),
    Architecture("qwen2", ("Qwen2ForCausalLM",), "qwen2", "qwen2",
                 gguf_permuted_qk=False, qkv_bias=True, o_proj_bias=False, mlp_bias=False, tie_word_embeddings=False),
)}
SUPPORTED_ARCHITECTURES = {hf: a.name for a in ARCHITECTURES.values() for hf in a.hf_architectures}


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ModelLoadError(f"architecture {name!r} is not supported; tiergate runs {sorted(ARCHITECTURES)}") from None


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    architecture: str = "llama"        # a key of ARCHITECTURES

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Read a Hugging Face config.json dict (transformers 4.x and 5.x spellings)."""
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        known = [SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES]
        if not known:
            raise ModelLoadError(f"unsupported architecture {archs}; tiergate runs {sorted(SUPPORTED_ARCHITECTURES)}")
        arch = ARCHITECTURES[known[0]]
        if raw.get("use_sliding_window"):
            raise ModelLoadError("sliding-window attention (use_sliding_window) is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ModelLoadError(f"unsupported hidden_act {raw.get('hidden_act')!r}; expected 'silu'")
        # transformers 5 folds rope_theta and rope_scaling into rope_parameters.
        rope_params = dict(raw.get("rope_parameters") or {})
        scaling_raw = raw.get("rope_scaling") or rope_params
        theta = raw.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        try:
            heads = raw["num_attention_heads"]
            hidden = raw["hidden_size"]
            cfg = cls(
                vocab_size=raw["vocab_size"],
                hidden_size=hidden,
                intermediate_size=raw["intermediate_size"],
                num_hidden_layers=raw["num_hidden_layers"],
                num_attention_heads=heads,
                num_key_value_heads=raw.get("num_key_value_heads") or heads,
                head_dim=raw.get("head_dim") or hidden // heads,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
                rope_theta=float(theta),
                rope_scaling=_rope_scaling(scaling_raw),
                max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch.tie_word_embeddings)),
                **arch.biases(bool(raw.get("attention_bias", False)), bool(raw.get("mlp_bias", False))),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_id=raw.get("eos_token_id"),
                architecture=arch.name,
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required field {exc.args[0]!r}") from None
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ModelLoadError("num_attention_heads must be a multiple of num_key_value_heads")
        return cfg

    def to_hf(self) -> dict[str, Any]:
        """The config.json transformers loads as this architecture (LlamaForCausalLM, Qwen2ForCausalLM)."""
        arch = architecture(self.architecture)
        raw = asdict(self)
        scaling = raw.pop("rope_scaling")
        raw["rope_scaling"] = None if scaling["rope_type"] == "default" else scaling
        del raw["architecture"], raw["qkv_bias"], raw["o_proj_bias"]
        if arch.qkv_bias is None:       # HF Llama's one switch for the q/k/v and o biases
            if self.qkv_bias != self.o_proj_bias:
                raise ModelLoadError(f"{arch.name} cannot have a q/k/v bias without an o_proj bias")
            raw["attention_bias"] = self.qkv_bias
        raw.update(architectures=[arch.hf_architectures[0]], model_type=arch.hf_model_type, hidden_act="silu")
        return raw


def _rope_scaling(raw: dict[str, Any] | None) -> RopeScaling:
    if not raw:
        return RopeScaling()
    rope_type = raw.get("rope_type") or raw.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(f"unsupported rope scaling {rope_type!r}; supported: {sorted(SUPPORTED_ROPE_TYPES)}")
    defaults = RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(raw.get("factor", defaults.factor)),
        low_freq_factor=float(raw.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(raw.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            raw.get("original_max_position_embeddings", defaults.original_max_position_embeddings)
        ),
    )
