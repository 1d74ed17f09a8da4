"""The configuration file: YAML and its schema. Every problem is reported at once with its path.

Schema only: a chain entry is a policy name and its raw options, and the rollout section's date flags are raw dates;
the policy registry validates both against what the policies declare (``gateway.policies.check_config``), which is
what ``gateway.app.load_config`` runs. This module imports no policy.

Defaults that come from the service spec live here: a company created on or after 2026-05-21 has restricted file
access and the forbid-legacy-uploads setting on, unless the config says otherwise; forbid without restricted
access is an error.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Collection, Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from yarl import URL

from .core.spec import RESTRICTED_BY_DEFAULT_FROM, TEMPLATE_PARAM
from .core.spool import SpoolConfig
from .core.tenants import Tenant, TenantResolver, canonical_host
from .ops.tracing_options import TracingConfig
from .proxy.options import UpstreamConfig
from .rollout.behaviour import Behaviour
from .rollout.config import RolloutConfig, TenantRollout
from .rollout.plan import RolloutPlan

__all__ = (
    "ChainEntry",
    "ConfigError",
    "GatewayConfig",
    "ListenAddress",
    "LoadedConfig",
    "RouteConfig",
    "TenantConfig",
    "loc",
    "parse_listen",
    "parse_model",
    "Secrets",
    "expand_references",
    "pydantic_problems",
    "read_yaml",
)

_NAME_RE = r"^[a-z][a-z0-9_\-]*$"
_METHOD_RE = re.compile(r"^[A-Z][A-Z0-9\-_]*$")
_TEMPLATE_RE = re.compile(rf"^(/([A-Za-z0-9\-._~!$&'()*+,=:@]+|{TEMPLATE_PARAM}))+$")
_HOST_RE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9\-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9\-]*[a-z0-9])?)*$")


class ConfigError(Exception):
    """Raised with every problem found; ``str()`` is the one message an operator reads."""

    def __init__(self, problems: Sequence[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n" + "\n".join(f"  {p}" for p in self.problems))


@dataclass(frozen=True, slots=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(value: Any) -> ListenAddress:
    if isinstance(value, ListenAddress):
        return value
    if not isinstance(value, str):
        raise ValueError("expected 'host:port'")
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected 'host:port', got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid port in {value!r}")
    if host not in ("localhost",):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"listen host must be an IP address or localhost, got {host!r}") from None
    return ListenAddress(host, int(port))


Listen = Annotated[ListenAddress, BeforeValidator(parse_listen)]


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One policy in a chain: its config name and its (not yet validated) options."""

    name: str
    options: Mapping[str, Any]


def _parse_chain_entry(value: Any, info: ValidationInfo) -> ChainEntry:
    if isinstance(value, ChainEntry):
        return value
    options: Any
    if isinstance(value, str):
        name, options = value, {}
    elif isinstance(value, dict) and len(value) == 1:
        ((name, options),) = value.items()
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise ValueError(f"options of policy {name!r} must be a mapping")
    else:
        raise ValueError("a chain entry is a policy name, or a mapping of one policy name to its options")
    if not isinstance(name, str):
        raise ValueError("a policy name is a string")
    # The names the registry knows, when the caller gives them (parse_model(..., policies=...)): an unknown one is
    # reported with the other problems of the schema. Its options are the registry's to check.
    known = (info.context or {}).get("policies")
    if known is not None and name not in known:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(known))})")
    return ChainEntry(name, options)


Chain = list[Annotated[ChainEntry, BeforeValidator(_parse_chain_entry)]]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Model):
    listen: Listen = Field(default_factory=lambda: ListenAddress("127.0.0.1", 8080))
    admin_listen: Listen = Field(default_factory=lambda: ListenAddress("127.0.0.1", 9090))
    # Largest request line and header field the listener accepts (aiohttp's max_line_size / max_field_size).
    max_header_bytes: int = Field(default=16384, ge=1024, le=1 << 20)
    # On SIGTERM: readiness answers 503 for this long before the listener stops accepting.
    drain_delay: float = Field(default=0.0, ge=0, le=600)
    # Then, how long in-flight requests may take to finish.
    shutdown_timeout: float = Field(default=30.0, gt=0, le=3600)
    # Longest wait for the next piece of a request body being forwarded; then 408 and the upstream request is dropped.
    client_body_timeout: float = Field(default=60.0, gt=0, le=3600)
    # A request's head (line and headers) must arrive whole within this of the connection's opening or of the first
    # byte of a later request on it; then the connection is closed (slowloris, silent connections).
    client_header_timeout: float = Field(default=15.0, gt=0, le=3600)
    # A kept-alive connection with no request for this long is closed.
    client_keepalive_timeout: float = Field(default=60.0, gt=0, le=86400)
    # Most client connections open at once; over it a new one is answered 503 (Retry-After) and closed. 0: no bound.
    max_connections: int = Field(default=10_000, ge=0, le=1_000_000)
    # The listening socket's backlog (connections the kernel queues before the gateway accepts them).
    backlog: int = Field(default=1024, ge=16, le=65535)
    # The event loop: uvloop (libuv) when installed ("auto"), or Python's own ("asyncio").
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # Trust the client's X-Forwarded-Proto/Host, Forwarded, X-Real-IP, X-Client-IP (only behind a trusted load
    # balancer); otherwise the gateway sets the first two and removes the others.
    trust_forwarded_headers: bool = False
    # Send the upstream an RFC 7239 Forwarded header for this hop.
    forwarded_header: bool = False
    # A POST form body's _method field, on a path where it could route the request to a guarded route: how much of
    # the body may be read (and held) before its override, a file part or its end shows (docs/policies/
    # legacy_upload_guard.md, "Method overrides"); over it, 413 METHOD_OVERRIDE_UNDECIDED.
    method_override_look_ahead: int = Field(default=1 << 20, ge=4 << 10, le=64 << 20)


class AccessLogConfig(_Model):
    enabled: bool = True


class MetricsConfig(_Model):
    # Per-request metric updates (requests, durations); off only to measure what they cost.
    enabled: bool = True


class UsageConfig(_Model):
    # "Who still uses deprecated behaviour" (admin /deprecations): the window and the clients kept per bucket.
    window_seconds: float = Field(default=3600.0, ge=60, le=7 * 86400)
    max_clients: int = Field(default=1000, ge=10, le=100_000)


class TenantBridges(_Model):
    """The migration bridges a company's clients get; an exemption's ``bridge`` decides for one client."""

    # board_cards: a client whose phase still shows cards gets them rebuilt from the paginated card list when the
    # service itself no longer returns them.
    card_backfill: bool = False
    # legacy_upload_guard: an upload the forbid setting refuses is performed on the restricted route instead.
    upload_upgrade: bool = False


class TenantConfig(_Model):
    name: str = Field(pattern=_NAME_RE)
    hosts: list[str] = Field(min_length=1)
    upstream: str
    created: dt.date | None = None
    restricted_file_access: bool | None = None
    forbid_legacy_uploads: bool | None = None
    # Send the client's Host to the upstream instead of the upstream's own authority.
    preserve_host: bool = False
    # Per-tenant overrides of the rollout section (dates, timezone, brownouts, exemptions): see rollout.py.
    rollout: TenantRollout = TenantRollout()
    bridges: TenantBridges = TenantBridges()

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == "none":
            raise ValueError('"none" is reserved: it is the metrics\' tenant label of requests refused before a tenant '
                             "was known")
        return name

    @field_validator("hosts")
    @classmethod
    def _valid_hosts(cls, hosts: list[str]) -> list[str]:
        out = []
        for host in hosts:
            name = canonical_host(host) if not host.startswith("*.") else host.lower()
            try:
                ipaddress.ip_address(name.strip("[]"))
            except ValueError:
                if not _HOST_RE.match(name):
                    raise ValueError(f"invalid host name {host!r}") from None
            out.append(name)
        return out

    @field_validator("upstream")
    @classmethod
    def _valid_upstream(cls, value: str) -> str:
        url = URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"upstream must be an http:// or https:// URL, got {value!r}")
        if url.query_string or url.fragment:
            raise ValueError("upstream must not have a query or fragment")
        return value

    @model_validator(mode="after")
    def _file_settings(self) -> TenantConfig:
        if self.forbid_legacy_uploads and self.restricted_file_access is False:
            raise ValueError(
                "forbid_legacy_uploads requires restricted_file_access (spec: the forbid setting is nested under it)"
            )
        if self.forbid_legacy_uploads and self.restricted_file_access is None and not self._new_company:
            raise ValueError(
                "forbid_legacy_uploads is on but restricted_file_access is off by default for a company created "
                "before 2026-05-21: set restricted_file_access: true"
            )
        return self

    @property
    def _new_company(self) -> bool:
        return self.created is not None and self.created >= RESTRICTED_BY_DEFAULT_FROM

    def resolve(self) -> Tenant:
        restricted = self._new_company if self.restricted_file_access is None else self.restricted_file_access
        forbid = (self._new_company and restricted) if self.forbid_legacy_uploads is None else self.forbid_legacy_uploads
        return Tenant(
            name=self.name,
            hosts=tuple(self.hosts),
            upstream=URL(self.upstream.rstrip("/")),
            created=self.created,
            restricted_file_access=restricted,
            forbid_legacy_uploads=forbid,
            preserve_host=self.preserve_host,
            card_backfill=self.bridges.card_backfill,
            upload_upgrade=self.bridges.upload_upgrade,
        )


class RouteConfig(_Model):
    name: str = Field(pattern=_NAME_RE)
    methods: list[str] | None = None
    paths: list[str] = Field(min_length=1)
    prefixes: list[str] = ["/api/v1", "/api/latest"]
    chain: Chain = []

    @field_validator("methods")
    @classmethod
    def _valid_methods(cls, methods: list[str] | None) -> list[str] | None:
        if methods is None:
            return None
        upper = [m.upper() for m in methods]
        bad = [m for m in upper if not _METHOD_RE.match(m)]
        if bad or not upper:
            raise ValueError(f"invalid methods {bad or methods!r}")
        return upper

    @field_validator("paths", "prefixes")
    @classmethod
    def _valid_templates(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not _TEMPLATE_RE.match(path):
                raise ValueError(f"{path!r} is not a path template like /cards/{{card_id}}/files")
        return paths


class CatchAllConfig(_Model):
    chain: Chain = []


class GatewayConfig(_Model):
    server: ServerConfig = ServerConfig()
    upstream: UpstreamConfig = UpstreamConfig()
    access_log: AccessLogConfig = AccessLogConfig()
    metrics: MetricsConfig = MetricsConfig()
    usage: UsageConfig = UsageConfig()
    # W3C trace context on every upstream request, the trace in the access log, OpenTelemetry export (ops/tracing.py).
    tracing: TracingConfig = TracingConfig()
    # Request bytes a policy holds on disk (the upload upgrade's file parts before a comment's text), per process.
    spool: SpoolConfig = SpoolConfig()
    rollout: RolloutConfig = RolloutConfig()
    tenants: list[TenantConfig] = Field(min_length=1)
    default_tenant: str | None = None
    global_chain: Chain = [ChainEntry("request_id", {})]
    routes: list[RouteConfig] = []
    catch_all: CatchAllConfig = CatchAllConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        problems: list[str] = []
        seen_tenants: set[str] = set()
        seen_hosts: dict[str, str] = {}
        for tenant in self.tenants:
            if tenant.name in seen_tenants:
                problems.append(f"tenant name {tenant.name!r} is used twice")
            seen_tenants.add(tenant.name)
            for host in tenant.hosts:
                if host in seen_hosts:
                    problems.append(f"host {host!r} belongs to both {seen_hosts[host]!r} and {tenant.name!r}")
                seen_hosts[host] = tenant.name
        if self.default_tenant is not None and self.default_tenant not in seen_tenants:
            problems.append(f"default_tenant {self.default_tenant!r} is not a tenant name")
        seen_routes: set[str] = set()
        for route in self.routes:
            if route.name in seen_routes or route.name == "catch_all":
                problems.append(f"route name {route.name!r} is used twice or reserved")
            seen_routes.add(route.name)
        if problems:
            raise ValueError("; ".join(problems))
        return self


_REFERENCE_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_USERINFO_RE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s\"']+@")


@dataclass(frozen=True, slots=True)
class Secrets:
    """Values the config took from the environment (``${NAME}``), shown as their reference wherever the config is
    shown: ``check-config``, the admin ``/config``, problems and log lines. Credentials in a URL are masked too."""

    shown: Mapping[str, str] = dataclasses.field(default_factory=dict)  # value -> what is shown instead

    def redact(self, text: str) -> str:
        for value, reference in self.shown.items():
            text = text.replace(value, reference)
        return _USERINFO_RE.sub(r"\g<scheme><redacted>@", text)

    def redact_data(self, data: Any) -> Any:
        """A JSON-ready structure with every string redacted."""
        if isinstance(data, str):
            return self.redact(data)
        if isinstance(data, dict):
            return {key: self.redact_data(value) for key, value in data.items()}
        if isinstance(data, list):
            return [self.redact_data(value) for value in data]
        return data


def expand_references(data: Any, environ: Mapping[str, str]) -> tuple[Any, Secrets, list[str]]:
    """``${NAME}`` in any string of the config becomes the environment variable's value (``$$`` is a literal ``$``),
    so that a credential need not sit in the file (or a ConfigMap). Returns the data, the secrets to redact, and a
    problem for each variable that is not set."""
    shown: dict[str, str] = {}
    problems: list[str] = []

    def expand(value: Any, where: list[int | str]) -> Any:
        if isinstance(value, dict):
            return {key: expand(item, [*where, str(key)]) for key, item in value.items()}
        if isinstance(value, list):
            return [expand(item, [*where, i]) for i, item in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "$"
            if name not in environ:
                problems.append(f"{loc(where)}: environment variable {name} is not set")
                return ""
            secret = environ[name]
            if secret:
                shown[secret] = match.group(0)
            return secret

        return _REFERENCE_RE.sub(substitute, value)

    return expand(data, []), Secrets(shown), problems


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A config checked whole: the schema, and every chain entry's options parsed by its policy's model (built by
    the policy registry, ``gateway.policies.check_config``)."""

    model: GatewayConfig
    chains: Mapping[str, tuple[tuple[str, BaseModel], ...]]  # route name (and "catch_all") -> policies and options
    source: str
    behaviours: Mapping[str, Behaviour]  # the dated behaviours the policies declare, by name
    secrets: Secrets = dataclasses.field(default_factory=Secrets)

    def tenants(self) -> list[Tenant]:
        return [t.resolve() for t in self.model.tenants]

    def tenant_resolver(self) -> TenantResolver:
        """Host -> tenant for this config (``default_tenant`` for hosts no tenant names)."""
        tenants = self.tenants()
        default = next((t for t in tenants if t.name == self.model.default_tenant), None)
        return TenantResolver(tenants, default)

    def shown(self) -> dict[str, Any]:
        """The config as loaded, for people: secrets shown as their references, credentials in URLs masked."""
        data: dict[str, Any] = self.secrets.redact_data(self.model.model_dump(mode="json"))
        return data

    def rollout_plan(self) -> RolloutPlan:
        """Every tenant's schedule of every dated behaviour, from this config."""
        tenants = [(t.resolve(), t.rollout) for t in self.model.tenants]
        return RolloutPlan.build(self.model.rollout, tenants, self.behaviours)


def loc(parts: Sequence[int | str]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def pydantic_problems(err: ValidationError, prefix: Sequence[int | str] = ()) -> list[str]:
    problems = []
    for item in err.errors(include_url=False):
        msg = item["msg"].removeprefix("Value error, ")
        problems.append(f"{loc([*prefix, *item['loc']])}: {msg}")
    return problems


class _UniqueKeyLoader(yaml.SafeLoader):
    """A duplicated key in the file is a mistake, not a silent override."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_model(data: Any, source: str = "config", *, policies: Collection[str] | None = None) -> GatewayConfig:
    """The schema's reading of parsed YAML (or a dict), or ConfigError with every problem. ``policies``: the policy
    names a chain entry may use (the registry's), checked here so that they are reported with the rest."""
    if not isinstance(data, dict):
        raise ConfigError(["(top level): expected a mapping"], source)
    try:
        return GatewayConfig.model_validate(data, context={"policies": policies} if policies is not None else None)
    except ValidationError as err:
        raise ConfigError(pydantic_problems(err), source) from None


def read_yaml(path: str | Path) -> Any:
    """The file's YAML (duplicated keys refused), or ConfigError."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([f"cannot read the file: {err.strerror or err}"], source) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigError([f"{where}invalid YAML: {problem}"], source) from None
    return data
