"""YAML schema of who may call (API keys, tenants) and how requests are classified and routed."""

from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from policies.cascade import CascadeConfig
from policies.gain_model import GainModel, GainModelError, load_gain_model, resolve_gain_model_path
from policies.needs import Need

Profile = Literal["latency", "throughput", "memory"]
PROFILES: tuple[str, ...] = ("latency", "throughput", "memory")
Endpoint = Literal["chat", "completions"]

# limits.api_keys ids of keys without a name: this, then 12 hex digits of the key's SHA-256
KEY_DIGEST_PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_GROUP_NAME = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def hash_api_key(key: str) -> str:
    """Keys are stored and compared as SHA-256 hex digests, never as plain text. Surrounding
    whitespace is not part of a key: a presented key is read stripped from its header
    (gateway/auth.py), so a configured one is hashed stripped too, or a key kept in a mounted
    secret (which usually ends in a newline) could never match."""
    return hashlib.sha256(key.strip().encode()).hexdigest()


class KeySource(_Strict):
    """Where a key's digest comes from: given as SHA-256 hex, or read from the environment."""
    sha256: str | None = Field(None, description="hex SHA-256 of the key (`tiergate hash-key KEY` prints it)")
    env: str | None = Field(None, description="environment variable holding the key itself")
    name: str | None = Field(None, description="label for logs")

    @model_validator(mode="after")
    def _one_source(self) -> KeySource:
        if (self.sha256 is None) == (self.env is None):
            raise ValueError("give exactly one of sha256 or env")
        if self.sha256 is not None:
            self.sha256 = self.sha256.lower()
            if not _HEX64.match(self.sha256):
                raise ValueError("sha256 must be 64 hex digits")
        elif not os.environ.get(self.env or "", "").strip():
            raise ValueError(f"environment variable {self.env} is not set or holds only whitespace")
        return self

    def digest(self) -> str:
        return self.sha256 if self.sha256 is not None else hash_api_key(os.environ[self.env or ""])

    def scope_id(self) -> str:
        """The key's id in limits.api_keys (gateway/request_limits.py api_key_label): its name,
        else a prefix of its digest (never the key)."""
        return self.name or KEY_DIGEST_PREFIX + self.digest()[:12]


class ApiKeyConfig(KeySource):
    tenant: str


class AdminKeyConfig(KeySource):
    """A key for the operator's endpoints (/metrics, the detailed /readyz) off loopback."""


class AuthConfig(_Strict):
    enabled: bool = True
    keys: list[ApiKeyConfig] = []
    admin_keys: list[AdminKeyConfig] = Field([], description="needed for /metrics and the detailed /readyz when the "
                                                             "server listens off loopback")
    anonymous_tenant: str = Field("default", description="tenant of every request when auth is off")


class PrefixCacheGroup(_Strict):
    """A prefix-cache scope shared by exactly the tenants that name the same group."""
    group: str = Field(pattern=f"^{_GROUP_NAME}$", description="tenants naming the same group share cached prefixes")


# Who may hit (and so observe, through cached_tokens or timing) a tenant's cached prompt blocks.
PrefixCacheMode = Literal["isolated", "shared"] | PrefixCacheGroup


class TenantConfig(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    tenant_class: str = Field("standard", alias="class", description="used by classification and routing rules")
    allow_profile_hint: bool = Field(True, description="honour the x-tiergate-profile header")
    models: list[str] | None = Field(None, description="model aliases this tenant may use; null: all")
    prefix_cache: PrefixCacheMode = Field(
        "isolated", description="isolated (default): this tenant's cached prefixes serve only it; shared: the scope "
                                "every 'shared' tenant joins; {group: NAME}: shared with the tenants naming NAME")
    priority: int = Field(0, description="engine scheduling priority (higher first)")
    record_content: bool = Field(False, description="record this tenant's prompts and completions in traces "
                                                   "(only where telemetry.record_content allows it too)")

    @field_validator("prefix_cache", mode="before")
    @classmethod
    def _prefix_cache_form(cls, value):
        # Checked by hand so that a bad value gets one message naming the three forms, not one
        # error per branch of the union.
        if isinstance(value, str) and value in ("isolated", "shared"):
            return value
        if isinstance(value, dict) and set(value) == {"group"}:
            name = value["group"]
            if not isinstance(name, str) or not re.fullmatch(_GROUP_NAME, name):
                raise ValueError("group must be 1-64 letters, digits or _.:- (starting with a letter or digit)")
            return PrefixCacheGroup(group=name)
        if isinstance(value, PrefixCacheGroup):
            return value
        raise ValueError("must be 'isolated', 'shared' or {group: NAME}")


class NumberCondition(_Strict):
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None

    @model_validator(mode="after")
    def _bounds_hold_a_number(self) -> NumberCondition:
        bounds = {name: getattr(self, name) for name in ("gt", "gte", "lt", "lte")}
        given = {name: value for name, value in bounds.items() if value is not None}
        if not given:
            raise ValueError("give at least one of gt, gte, lt, lte")
        if any(math.isnan(value) for value in given.values()):
            raise ValueError("a bound must be a number, not nan (nothing compares true with it)")
        # A rule whose range holds no number never matches, silently.
        for low_name in ("gt", "gte"):
            for high_name in ("lt", "lte"):
                low, high = given.get(low_name), given.get(high_name)
                if low is None or high is None:
                    continue
                if low > high or (low == high and (low_name == "gt" or high_name == "lt")):
                    raise ValueError(f"{low_name} {low:g} and {high_name} {high:g} leave no number in range")
        return self


class ClassifyWhen(_Strict):
    """All conditions given must hold. Strings accept one value or a list of values."""
    prompt_tokens: NumberCondition | None = None
    max_tokens: NumberCondition | None = None
    n: NumberCondition | None = None
    stream: bool | None = None
    endpoint: Endpoint | list[Endpoint] | None = None
    tenant: str | list[str] | None = None
    tenant_class: str | list[str] | None = None
    model: str | list[str] | None = None
    code: bool | None = Field(None, description="the prompt looks like a programming request "
                                                "(policies/request_signals.py)")
    tools: bool | None = Field(None, description="the request carries tools")


class ClassifyRule(_Strict):
    name: str | None = None
    profile: Profile
    when: ClassifyWhen


class GainModelConfig(_Strict):
    """A learned router: a model of how much better the large tier answers a prompt
    (policies/gain_model.py). Read from the prompt's text alone: at or above `threshold` the
    request needs `large_gain`, which a routing rule can send to the large tier. A model that
    also reads the small tier's prefill is a cascade's signal instead
    (`cascade: {to: large, signal: predicted_gain, threshold: ...}`)."""
    file: str = Field(description="a bundled model's name (smollm2-qwen2.5-coder) or the path of one "
                                  "(`tiergate bench routing-train` writes it), relative to the config file")
    threshold: float | None = Field(None, description="predicted gain in bits per byte of the answer: at or above "
                                                      "it a request needs large_gain (a text-only model; the "
                                                      "model's file names the threshold that sent 30 % of its "
                                                      "training prompts to large)")
    _model: GainModel | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> GainModelConfig:
        base = (info.context or {}).get("base_dir")
        try:
            self._model = load_gain_model(resolve_gain_model_path(self.file, Path(base) if base else None))
        except GainModelError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def model(self) -> GainModel:
        assert self._model is not None
        return self._model


class ClassificationConfig(_Strict):
    default_profile: Profile = "throughput"
    honour_hint: bool = Field(True, description="accept x-tiergate-profile from tenants that allow it")
    rules: list[ClassifyRule] = Field([], description="first match wins")
    long_context_tokens: int = Field(4096, gt=0, description="a prompt of at least this many tokens needs "
                                                             "long_context (known when prompt tokens are counted)")
    gain_model: GainModelConfig | None = Field(None, description="a learned router: requests it predicts the large "
                                                                 "tier answers markedly better need large_gain")


class RouteMatch(_Strict):
    tenant: str | list[str] | None = None
    tenant_class: str | list[str] | None = None
    model: str | list[str] | None = None
    profile: Profile | list[Profile] | None = None
    needs: Need | list[Need] | None = Field(None, description="every need listed must be among the request's "
                                                              "(code, non_english, large_gain, long_context, tools, "
                                                              "json_schema, logprobs)")


_ESCALATE_REPLACED = ("'escalate' was replaced by 'cascade: {to: TIER, tokens: K, signal: mean_logprob|"
                      "mean_entropy, threshold: X}' (judged on the first K tokens, before any is sent)")


class _CascadeHolder(_Strict):
    cascade: CascadeConfig | None = Field(
        None, description="the first tier's first tokens are held back and judged; unsure, the request is answered "
                          "by `to` instead, before any byte reaches the client")

    @model_validator(mode="before")
    @classmethod
    def _escalate_replaced(cls, value):
        # The whole-answer escalation of earlier configs became the cascade: its threshold meant
        # something else (a whole answer), so it is not carried over silently.
        if isinstance(value, dict) and "escalate" in value:
            raise ValueError(_ESCALATE_REPLACED)
        return value


class RouteRule(_CascadeHolder):
    name: str | None = None
    match: RouteMatch = RouteMatch()
    chain: list[str] = Field(min_length=1, description="tiers in order: the first ready one answers")


class RoutingConfig(_Strict):
    rules: list[RouteRule] = Field([], description="first match wins; else the model alias's chain")


class ModelAliasConfig(_CascadeHolder):
    """A model id clients may name. A routed alias (the default) is re-routed by routing rules; a
    pinned one always walks its own chain, so a client can name a concrete model and get it."""
    chain: list[str] = Field(min_length=1, description="default tier order for this model id")
    pinned: bool = Field(False, description="routing rules never re-route this alias: its own chain is walked")
