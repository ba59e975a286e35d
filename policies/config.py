"""The gateway's YAML configuration as pydantic models.

A bad file fails at start (or at reload) with the field path and the reason. The tier
schema lives in policies/tier_config.py, auth/tenants/classification/routing in
policies/policy_config.py; this module ties them together and checks cross references.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from policies.cascade import CascadeConfig
from policies.limits_config import LimitsConfig
from policies.policy_config import (
    KEY_DIGEST_PREFIX,
    PROFILES,
    AdminKeyConfig,
    ApiKeyConfig,
    AuthConfig,
    ClassificationConfig,
    ClassifyRule,
    ModelAliasConfig,
    RouteRule,
    RoutingConfig,
    TenantConfig,
    hash_api_key,
)
from policies.telemetry_config import TelemetryConfig
from policies.tier_config import (
    EmbeddedTierConfig,
    SpeculativeSettings,
    TierConfig,
    UpstreamTierConfig,
)

__all__ = [
    "PROFILES", "ApiKeyConfig", "AuthConfig", "ClassificationConfig", "ClassifyRule", "ConfigError",
    "AdminKeyConfig", "CascadeConfig", "EmbeddedTierConfig", "GatewayConfig",
    "ModelAliasConfig",
    "RouteRule", "RoutingConfig", "ServerConfig", "SpeculativeSettings", "TenantConfig", "UpstreamTierConfig",
    "hash_api_key", "is_loopback", "load_config", "parse_config",
]


class ConfigError(ValueError):
    """The configuration file is unreadable or invalid; the message names the field."""




# Tier names show in headers, metrics labels and log lines: plain identifiers only.
_TIER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")


def _tier_name(name: str) -> str:
    if not _TIER_NAME.match(name):
        raise ValueError("a tier's name is 1-128 letters, digits, '_', '.', ':', '/' or '-', starting with a letter "
                         "or digit")
    return name


TierName = Annotated[str, AfterValidator(_tier_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# A guessable secret would let a client derive another tenant's upstream cache salt.
MIN_PREFIX_SECRET_CHARS = 16


class ServerConfig(_Strict):
    host: str = Field("127.0.0.1", min_length=1, description="address or name to listen on")
    # strict: YAML's `true` or `8000.0` is a mistake, not port 1 or 8000
    port: int = Field(8000, ge=0, le=65535, strict=True)
    max_body_bytes: ByteSize = Field(ByteSize(4 * 2**20), gt=0, description="larger request bodies get 413")
    reload_poll_s: float = Field(2.0, ge=0, description="seconds between config file checks; 0: SIGHUP only")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body not fully received this long after "
                                                           "its headers gets 408 (a trickled body holds no slot)")
    max_choices_per_request: int = Field(128, ge=1, description="prompts x n (or best_of) of one request; "
                                                                "more gets 400")
    reload_settle_s: float = Field(1.0, ge=0, description="a changed config file is loaded once it has stayed the "
                                                          "same (size, mtime, content) this long")
    shutdown_grace_s: float = Field(
        30.0, gt=0, le=86400, description="on SIGTERM or SIGINT the server stops taking requests and lets those "
                                          "running finish for this long; then it cuts them (their budgets "
                                          "settled) and stops, whatever their own deadlines")
    log_requests: bool = Field(True, description="one log line per request with its routing decision")
    gil_switch_interval_ms: float = Field(
        1.0, gt=0, le=100, description="how long another thread (span exporter, engine step) may keep the "
                                       "GIL before the event loop gets it back; Python's default is 5 ms")
    prefix_cache_secret_env: str | None = Field(
        None, description="environment variable holding the secret prefix-cache scopes are derived from; "
                          "unset: a random secret per process (replicas then never share upstream cache salts)")
    _prefix_cache_secret: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_prefix_cache_secret(self) -> ServerConfig:
        # Read once per loaded config, so a request never sees the variable change under it.
        if self.prefix_cache_secret_env is not None:
            secret = os.environ.get(self.prefix_cache_secret_env, "")
            if len(secret) < MIN_PREFIX_SECRET_CHARS:
                raise ValueError(f"environment variable {self.prefix_cache_secret_env} (prefix_cache_secret_env) "
                                 f"must hold at least {MIN_PREFIX_SECRET_CHARS} characters")
            self._prefix_cache_secret = secret
        return self

    def prefix_cache_secret(self) -> str | None:
        return self._prefix_cache_secret


class GatewayConfig(_Strict):
    server: ServerConfig = ServerConfig()
    auth: AuthConfig = AuthConfig()
    tenants: dict[str, TenantConfig] = {}
    tiers: dict[TierName, TierConfig]
    default_tier: str | None = Field(None, description="tier of `tiergate generate`; default: the first")
    models: dict[str, ModelAliasConfig] = Field({}, description="model ids clients name; default: one per tier")
    classification: ClassificationConfig = ClassificationConfig()
    routing: RoutingConfig = RoutingConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    limits: LimitsConfig = Field(LimitsConfig(), description="budgets, rate limits, circuit breakers, retries")

    @model_validator(mode="after")
    def _cross_references(self) -> GatewayConfig:
        if not self.tiers:
            raise ValueError("at least one tier is required")
        if self.default_tier is None:
            self.default_tier = next(iter(self.tiers))
        elif self.default_tier not in self.tiers:
            raise ValueError(f"default_tier {self.default_tier!r} is not one of the tiers {sorted(self.tiers)}")
        self._check_served_names()
        if not self.models:
            self.models = {(t.served_name or name): ModelAliasConfig(chain=[name]) for name, t in self.tiers.items()}
        if not self.tenants:
            self.tenants = {self.auth.anonymous_tenant: TenantConfig()}
        self._check_tiers_named()
        self._check_gain_model_use()
        self._check_tenants_named()
        self._check_limits_named()
        self._check_keys_given()
        return self

    def _check_keys_given(self) -> None:
        if self.auth.enabled and not self.auth.keys:
            raise ValueError("auth.keys: auth is enabled but no API key is configured, so every request would "
                             "get 401 (list keys under auth.keys, or set auth.enabled: false to serve without "
                             "keys on loopback)")

    def _check_served_names(self) -> None:
        """Without a models section each tier is listed under its served name (or its own name):
        two tiers under one id would leave one of them unreachable."""
        if self.models:
            return
        owner: dict[str, str] = {}
        for name, tier in self.tiers.items():
            shown = tier.served_name or name
            if shown in owner:
                raise ValueError(f"tiers.{name}.served_name: model id {shown!r} is already tier {owner[shown]!r}'s "
                                 "(give each tier its own, or list the model ids under `models:`)")
            owner[shown] = name

    def _check_tiers_named(self) -> None:
        def check(chain: list[str], where: str) -> None:
            for tier in chain:
                if tier not in self.tiers:
                    raise ValueError(f"{where}: unknown tier {tier!r}; tiers: {sorted(self.tiers)}")
            repeated = sorted({t for t in chain if chain.count(t) > 1})
            if repeated:
                raise ValueError(f"{where}: tier {repeated[0]!r} is named twice (a tier that failed is not tried again)")

        def check_cascade(chain: list[str], cascade, where: str) -> None:
            check([cascade.to], f"{where}.to")
            if cascade.to == chain[0]:
                raise ValueError(f"{where}.to: {cascade.to!r} is the tier the cascade starts on")

        for alias, m in self.models.items():
            check(m.chain, f"models.{alias}.chain")
            if m.cascade:
                check_cascade(m.chain, m.cascade, f"models.{alias}.cascade")
        for i, rule in enumerate(self.routing.rules):
            check(rule.chain, f"routing.rules.{i}.chain")
            if rule.cascade:
                check_cascade(rule.chain, rule.cascade, f"routing.rules.{i}.cascade")
            for alias in _as_list(rule.match.model):
                if alias not in self.models:
                    raise ValueError(f"routing.rules.{i}.match.model: unknown model {alias!r}")
                if self.models[alias].pinned:
                    # The rule could never apply: a pinned alias is not re-routed.
                    raise ValueError(f"routing.rules.{i}.match.model: model {alias!r} is pinned "
                                     "(routing rules do not apply to it)")

    def _check_gain_model_use(self) -> None:
        """A predicted_gain cascade needs a gain model that reads the prefill; large_gain needs
        one that reads the text alone, with its threshold."""
        gain = self.classification.gain_model
        reads_prefill = gain is not None and gain.model.reads_prefill
        places = [(f"models.{alias}.cascade", m.cascade) for alias, m in self.models.items()]
        places += [(f"routing.rules.{i}.cascade", r.cascade) for i, r in enumerate(self.routing.rules)]
        for where, cascade in places:
            if cascade is not None and cascade.reads_prefill and not reads_prefill:
                raise ValueError(f"{where}: signal predicted_gain needs classification.gain_model with a model "
                                 "that reads the small tier's prefill")
        for i, rule in enumerate(self.routing.rules):
            if "large_gain" in _as_list(rule.match.needs):
                if gain is None or reads_prefill or gain.threshold is None:
                    raise ValueError(f"routing.rules.{i}.match.needs: large_gain needs classification.gain_model "
                                     "with a text-only model and a threshold (a model that reads the prefill is "
                                     "a cascade signal: cascade: {signal: predicted_gain})")

    def _check_tenants_named(self) -> None:
        if not self.auth.enabled and self.auth.anonymous_tenant not in self.tenants:
            raise ValueError(f"auth.anonymous_tenant: unknown tenant {self.auth.anonymous_tenant!r}")
        for i, key in enumerate(self.auth.keys):
            if key.tenant not in self.tenants:
                raise ValueError(f"auth.keys.{i}.tenant: unknown tenant {key.tenant!r}")
        for name, tenant in self.tenants.items():
            for alias in tenant.models or []:
                if alias not in self.models:
                    raise ValueError(f"tenants.{name}.models: unknown model {alias!r}")
        # A misspelt tenant or class in a rule would leave the rule never matching, silently.
        classes = {tenant.tenant_class for tenant in self.tenants.values()}
        places = [(f"routing.rules.{i}.match", rule.match) for i, rule in enumerate(self.routing.rules)]
        places += [(f"classification.rules.{i}.when", rule.when) for i, rule in enumerate(self.classification.rules)]
        for where, condition in places:
            for name in _as_list(condition.tenant):
                if name not in self.tenants:
                    raise ValueError(f"{where}.tenant: unknown tenant {name!r}; tenants: {sorted(self.tenants)}")
            for name in _as_list(condition.tenant_class):
                if name not in classes:
                    raise ValueError(f"{where}.tenant_class: no tenant has class {name!r}; classes: "
                                     f"{sorted(classes)}")

    def _check_limits_named(self) -> None:
        # A misspelt tier or tenant would silently leave it without limits (or price).
        limits = self.limits
        for where, names, kind, known in (("limits.tiers.by_id", limits.tiers.by_id, "tier", self.tiers),
                                          ("limits.prices", limits.prices, "tier", self.tiers),
                                          ("limits.breakers.by_name", limits.breakers.by_name, "tier", self.tiers),
                                          ("limits.tenants.by_id", limits.tenants.by_id, "tenant", self.tenants)):
            for name in names:
                if name not in known:
                    raise ValueError(f"{where}: unknown {kind} {name!r}; {kind}s: {sorted(known)}")
        key_ids = {key.scope_id() for key in self.auth.keys}
        for name in limits.api_keys.by_id:
            # With auth off a request's key id is the digest of whatever key it presents.
            anonymous_digest = not self.auth.enabled and name.startswith(KEY_DIGEST_PREFIX)
            if name not in key_ids and not anonymous_digest:
                raise ValueError(f"limits.api_keys.by_id: unknown API key {name!r} (a key's id is its name, else "
                                 f"{KEY_DIGEST_PREFIX!r} and 12 hex digits of its digest); keys: {sorted(key_ids)}")


def _as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


class DuplicateKeyError(yaml.YAMLError):
    pass


class StrictYamlLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: silently
    keeping the last (YAML's default) would drop a whole tier or server section. Checked on each
    mapping's own keys before `<<:` merges are flattened into it (a merge's keys may be
    overridden), once per mapping: a merged anchor is flattened before it is constructed."""

    def flatten_mapping(self, node):
        checked = self.__dict__.setdefault("_checked_mappings", set())
        if id(node) not in checked:
            checked.add(id(node))
            _check_unique_keys(self, node)
        super().flatten_mapping(node)


def _check_unique_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    first_line: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in first_line:
                raise DuplicateKeyError(f"the key {key!r} is given twice, on lines {first_line[key]} and {line}")
            first_line[key] = line
        except TypeError:
            continue                    # an unhashable key: the constructor reports it


def _format_location(loc: tuple) -> str:
    parts = list(loc)
    # Drop the tagged-union tag pydantic inserts after a tier name (tiers.small.embedded.dtype).
    if len(parts) >= 3 and parts[0] == "tiers" and parts[2] in ("embedded", "upstream"):
        del parts[2]
    # and the union member it tried (profile.literal['latency',...], needs.list[...]): not a field
    parts = [p for p in parts if not (isinstance(p, str) and _UNION_MEMBER.match(p))]
    if parts and parts[-1] == "[key]":      # a mapping's key itself was refused: show it quoted
        parts = parts[:-2] + [repr(parts[-2])] if len(parts) >= 2 else parts[:-1]
    return ".".join(str(p) for p in parts)


_UNION_MEMBER = re.compile(r"^(literal|list|function-[a-z]+|union|nullable|dict|tuple|set)\[")


def parse_config(text: str, source: str = "<config>", base_dir: Path | None = None) -> GatewayConfig:
    """`base_dir`: where relative file names in the config (a gain model's) are looked up."""
    try:
        raw = yaml.load(text, Loader=StrictYamlLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML ({exc})".replace("\n", " ")) from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        return GatewayConfig.model_validate(raw or {}, context={"base_dir": base_dir})
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = _format_location(first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        prefix = f"{where}: " if where else ""  # cross-reference errors name their own field
        raise ConfigError(f"{source}: {prefix}{msg}{more}".replace("\n", " ")) from None


def load_config(path: str | Path) -> GatewayConfig:
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_config(decode_config(data, str(path)), str(path), path.parent)


def decode_config(data: bytes, source: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
