"""YAML schema of tiers: embedded engines and remote OpenAI-compatible upstreams."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Discriminator, Field, FilePath, Tag, model_validator

from policies.needs import DEFAULT_CAPABILITIES, Capability
from policies.url_check import check_base_url


# What the engine accepts, restated here because policies never imports engines; each is defined
# once on the engine's side and tests/unit/test_settings_agree.py holds the two equal.
# engines.quantization.methods.ARTIFACT_METHODS
QuantizationMethod = Literal["int8", "int4-rtn", "int4-awq", "int4-gptq", "fp8", "int4-gguf", "w8a8", "w4a8", "w4a8-gguf"]
# engines.quantization.methods.INT4_GROUP_SIZES
Int4GroupSize = Literal[32, 64, 128, 256]
# the keys of engines.kv_cache.KV_CACHE_DTYPES
KvCacheDtype = Literal["int8", "fp8", "int4"]
# SpeculativeConfig.method
SpeculativeMethod = Literal["ngram", "draft", "self"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _TierBase(_Strict):
    """What every tier kind declares the same way."""
    capabilities: list[Capability] | None = Field(
        None, description="request features this tier can honour (tools, json_schema, logprobs); a request needing one "
                          "it lacks passes it over. Default: all of them")

    def capability_set(self) -> frozenset[str]:
        if self.capabilities is None:
            return DEFAULT_CAPABILITIES[self.kind]
        return frozenset(self.capabilities)


class SpeculativeSettings(_Strict):
    """engines.spec.config.SpeculativeConfig field for field, with the same defaults; the bounds are
    checked here so that a bad file fails at load with the field's path."""
    method: SpeculativeMethod
    num_tokens: int = Field(4, ge=1, le=16)
    draft_model: str | None = None
    draft_quantization: QuantizationMethod | None = "int4-rtn"
    draft_kv_cache_dtype: KvCacheDtype | None = "int8"
    ngram_max: int = Field(4, ge=1)
    ngram_min: int = Field(1, ge=1)
    adaptive: bool = True
    max_batch: int = Field(8, ge=1)
    verify_cost: float = Field(0.05, ge=0, allow_inf_nan=False,
                               description="adaptive k: cost of verifying one more token, in target steps")
    draft_group_size: Int4GroupSize = Field(32, description="method 'self': INT4 group size of the self-draft")

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeSettings:
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model")
        if self.ngram_min > self.ngram_max:
            raise ValueError("ngram_min must not exceed ngram_max")
        return self


class EmbeddedTierConfig(_TierBase):
    kind: Literal["embedded"] = "embedded"
    model: str = Field("default", description="'default' (bundled SmolLM2), a .gguf file or an HF directory")
    served_name: str | None = Field(None, description="model id shown to clients; defaults to the tier name")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="compute dtype; auto: the faster of the two for this model, measured at start")
    device: str = Field("cpu", pattern=r"^(cpu|auto|cuda(:\d+)?)$",
                        description="where the weights, KV cache and step tensors live: cpu, cuda[:N] or auto")
    max_model_len: int = Field(2048, gt=0)
    kv_cache_memory: ByteSize = Field(ByteSize(512 * 2**20), gt=0, description="KV pool size, e.g. '512MiB'")
    block_size: int = Field(16, gt=0, le=256)
    max_num_seqs: int = Field(128, gt=0)
    max_num_batched_tokens: int = Field(2048, gt=0)
    enable_prefix_caching: bool = True
    quantization: QuantizationMethod | None = Field(
        None, description="weight quantization; the artifact is built and cached on first start")
    quant_group_size: Int4GroupSize = 128
    kv_cache_dtype: KvCacheDtype | None = Field(None, description="None: the model dtype")
    dense_prefill: Literal["auto", "off"] = Field(
        "auto", description="block-quantized weights (w4a8-gguf) on a CPU: auto times a dense copy against the "
                            "blocks at prefill-sized steps at start and keeps it (2 bytes per weight) where it "
                            "is clearly faster, as on CPUs with AMX; off: every step multiplies the blocks")
    speculative: SpeculativeSettings | None = None
    threads: int | None = Field(
        None, ge=1, le=256, description="CPU threads of this tier's engine (its OpenMP team); None: every core. "
                                        "1 keeps a batch-1 tier on one core: there it runs faster than two threads "
                                        "that wake each other per op, and leaves the other cores to the rest")
    engine_processes: int = Field(
        0, ge=0, le=64, description="0: the engine steps in a thread of the gateway's process. N: N engine processes, "
                                    "each a whole engine (weights, KV pool) running `threads` threads, the tier's "
                                    "requests spread over them: no GIL shared with the gateway, and on a small CPU "
                                    "N one-thread engines outrun one engine whose threads wake each other per op")
    solo_threads: int | None = Field(
        None, ge=1, le=256, description="engine processes only: CPU threads while no other embedded tier has calls "
                                        "in flight, back to `threads` as soon as one has. Their OpenMP workers spin "
                                        "briefly between ops (GOMP_SPINCOUNT) rather than sleep, which pays only on "
                                        "cores nothing else is using: a batch-1 latency tier on an idle machine")
    max_in_flight: int | None = Field(
        None, gt=0, description="above this many calls open to the tier, routing passes it over for the next "
                                "tier of the chain; when every tier left is busy, the first busy one takes it")

    @model_validator(mode="after")
    def _budget_covers_batch(self) -> EmbeddedTierConfig:
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least max_num_seqs")
        if self.solo_threads is not None:
            if not self.engine_processes:
                raise ValueError("solo_threads needs engine_processes: the thread count of an engine in the "
                                 "gateway's process is not switched per step")
            if self.threads is None or self.solo_threads <= self.threads:
                raise ValueError("solo_threads must be above threads (set both)")
        return self


class UpstreamTierConfig(_TierBase):
    """An OpenAI-compatible server (vLLM, SGLang, another tiergate) reached over pooled HTTP."""
    kind: Literal["upstream"]
    base_url: str = Field(description="e.g. http://10.0.0.5:8000/v1 (the prefix before /chat/completions)")
    model: str = Field(description="model name the upstream expects in the request body")
    served_name: str | None = None
    api_key_env: str | None = Field(None, description="environment variable holding the upstream's API key")
    connect_timeout_s: float = Field(5.0, gt=0)
    # A whole (non-streamed) answer's first byte comes when it is all generated: below the longest
    # generation the tier is asked for, one tenant's long answers time out and open its breaker
    # for every tenant.
    read_timeout_s: float = Field(120.0, gt=0, description="longest wait for the next byte of the answer "
                                  "(for a whole answer: its whole generation)")
    max_in_flight: int | None = Field(
        None, gt=0, description="above this many calls open to the tier, routing passes it over for the next "
                                "tier of the chain; when every tier left is busy, the first busy one takes it")
    max_connections: int = Field(256, gt=0)
    max_model_len: int | None = Field(None, gt=0, description="context length, if known (else the upstream checks)")
    tokenizer: FilePath | None = Field(
        None, description="the upstream model's tokenizer.json: budget reservations count prompts with it "
                          "(tighter than the bound from their UTF-8 length used without it)")
    transport: Literal["pooled", "httpcore"] = Field(
        "pooled", description="httpx transport: tiergate's lean HTTP/1.1 pool, or httpx's default httpcore")
    verify_tls: bool = True
    pool_timeout_s: float = Field(5.0, gt=0, description="longest wait for a free connection (or for one of the "
                                                         "tenant's share); past it the call is the gateway's own "
                                                         "overload (503 / 429), never counted against the tier")
    tenant_share: float = Field(
        0.5, gt=0, le=1, description="fraction of max_connections one tenant may hold at once, so that one "
                                     "tenant's slow or stalled calls cannot take every connection; 1: no cap")
    client_write_timeout_s: float = Field(
        30.0, gt=0, description="a streaming client that takes no bytes for this long is cut off and its "
                                "upstream call closed (a stalled reader would otherwise hold a connection)")
    max_response_bytes: ByteSize = Field(
        ByteSize(32 * 2**20), gt=0, description="largest whole answer, and largest single stream event, read "
                                                "from the upstream; a bigger one is a tier failure")
    extra_body_fields: list[str] = Field(
        [], description="request body fields beyond OpenAI's and the known vLLM extensions that this upstream "
                        "accepts; forwarded as the client sent them")
    unknown_fields: Literal["reject", "drop"] = Field(
        "reject", description="any other body field: 'reject' answers 400 naming it, 'drop' removes it")
    supports_cache_salt: bool = Field(
        False, description="the upstream accepts vLLM's `cache_salt`: it gets one derived from the tenant's "
                           "prefix-cache scope (and the request's salt); otherwise no cache_salt is sent, and (its one "
                           "cache serving every tenant) the cached_tokens it reports reach a client as 0 unless "
                           "auth is off and the request has no cache_salt")
    supports_continuous_usage: bool = Field(
        False, description="the upstream accepts vLLM's `stream_options.continuous_usage_stats` (usage in every "
                           "chunk): a stream that asks for it passes it on; otherwise it is not sent, and the "
                           "stream carries usage only in its closing chunk")

    @model_validator(mode="after")
    def _check(self) -> UpstreamTierConfig:
        self.base_url = check_base_url(self.base_url, "base_url").rstrip("/")
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"environment variable {self.api_key_env} (api_key_env) is not set")
        return self

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


def _tier_kind(value) -> str:
    # `kind` may be left out: a tier is embedded unless it says otherwise.
    if isinstance(value, dict):
        return value.get("kind", "embedded")
    return getattr(value, "kind", "embedded")


TierConfig = Annotated[
    Annotated[EmbeddedTierConfig, Tag("embedded")] | Annotated[UpstreamTierConfig, Tag("upstream")],
    Discriminator(_tier_kind, custom_error_type="tier_kind",
                  custom_error_message="kind must be 'embedded' or 'upstream'"),
]
