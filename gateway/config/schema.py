"""The config's schema: every section's model, with the defaults that come from the service spec, and
``parse_model``, which reads parsed YAML (or a dict) against it with every problem reported at once with its key's
path. Schema only: a chain entry is a policy name and its raw options, the rollout's date flags are raw dates; the
policy registry checks both (``gateway.policies.check_config``). Values are read as their key means them, strictly
(docs/configuration.md)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

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

from ..core.redaction import MASK, without_userinfo
from ..core.spec import RESTRICTED_BY_DEFAULT_FROM
from ..core.spool import SpoolConfig
from ..core.template import ROUTE_PARAM
from ..core.tenants import Tenant, canonical_host
from ..rollout.config import ConfigDate, RolloutConfig, TenantRollout
from .ledger import NAME_WIDTH, LedgerConfig, NamedClient, ReadinessConfig, SelfServiceConfig, client_problems
from .problems import ConfigError, loc, pydantic_problems
from .tracing import TracingConfig
from .upstream import UpstreamConfig

__all__ = (
    "ADMIN_PATHS",
    "ChainEntry",
    "GatewayConfig",
    "ListenAddress",
    "RouteConfig",
    "ServerConfig",
    "TenantConfig",
    "parse_listen",
    "parse_model",
)

_NAME_RE = r"^[a-z][a-z0-9_\-]*$"
_METHOD_RE = re.compile(r"^[A-Z][A-Z0-9\-_]*$")
_TEMPLATE_RE = re.compile(rf"^(/([A-Za-z0-9\-._~!$&'()*+,=:@]+|{ROUTE_PARAM}))+$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_HOST_RE = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9\-]*[a-z0-9])?)(\.[a-z0-9]([a-z0-9\-]*[a-z0-9])?)*$")


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
    number = _listen_port(port, value)
    return ListenAddress(_listen_host(host), number)


def _listen_port(port: str, value: str) -> int:
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid port in {value!r}")
    return int(port)


def _listen_host(host: str) -> str:
    """An IP address (an IPv6 one in brackets or not) or localhost, without its brackets."""
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"listen host must be an IP address or localhost, got {host!r}") from None
    return host


Listen = Annotated[ListenAddress, BeforeValidator(parse_listen)]

# The admin paths that need the admin token, as ``server.admin_open`` names them (``/status`` also covers
# ``/status.json``, ``/`` and ``/favicon.ico``); /livez and /readyz are always open.
ADMIN_PATHS = ("/metrics", "/config", "/rollout", "/deprecations", "/status")
AdminPath = Literal["/metrics", "/config", "/rollout", "/deprecations", "/status"]


def _host_names(hosts: Sequence[str]) -> list[str]:
    """Host names (``*.suffix`` wildcards included) or IP addresses, canonical; ValueError names a bad one."""
    out = []
    for host in hosts:
        name = canonical_host(host) if not host.startswith("*.") else host.lower()
        try:
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            if not _HOST_RE.match(name):
                raise ValueError(f"invalid host name {host[:80]!r}") from None
        out.append(name)
    return out


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One policy in a chain: its config name and its (not yet validated) options."""

    name: str
    options: Mapping[str, Any]


def _parse_chain_entry(value: Any, info: ValidationInfo) -> ChainEntry:
    if isinstance(value, ChainEntry):
        return value
    name, options = _chain_name_options(value)
    if not isinstance(name, str):
        raise ValueError("a policy name is a string")
    # The names the registry knows, when the caller gives them (parse_model(..., policies=...)): an unknown one is
    # reported with the other problems of the schema. Its options are the registry's to check.
    known = (info.context or {}).get("policies")
    if known is not None and name not in known:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(known))})")
    return ChainEntry(name, options)


def _chain_name_options(value: Any) -> tuple[Any, dict[str, Any]]:
    """A chain entry's policy name (not yet checked) and options: ``name`` or ``{name: options}``."""
    if isinstance(value, str):
        return value, {}
    if not isinstance(value, dict) or len(value) != 1:
        raise ValueError("a chain entry is a policy name, or a mapping of one policy name to its options")
    ((name, options),) = value.items()
    options = {} if options is None else options
    if not isinstance(options, dict):
        raise ValueError(f"options of policy {name!r} must be a mapping")
    return name, options


Chain = list[Annotated[ChainEntry, BeforeValidator(_parse_chain_entry)]]


class _Model(BaseModel):
    # strict: a value of the wrong YAML type is a problem, never coerced (true is not 1, "5" is not 5)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


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
    # The admin listener (docs/operations.md, "Admin listener"). Its token: every admin path but /livez and /readyz
    # (and those in admin_open) needs it, as "Authorization: Bearer <token>", HTTP Basic (the token as password), or
    # the session cookie a browser gets from "?token=<token>" once. Give it as ${NAME}; unset, those paths are closed.
    admin_token: str | None = Field(default=None, min_length=16, max_length=4096, pattern=r"^[\x21-\x7e]+$")
    # How long a browser's login (the session cookie "?token=<token>" sets) lasts, in seconds; a reload applies a
    # shorter one to the cookies already given.
    admin_login_lifetime: float = Field(default=43200.0, ge=60, le=30 * 86400)
    # Admin paths served without the token, opened on purpose: "/metrics" (an open scrape), any of ADMIN_PATHS, or
    # "all".
    admin_open: list[AdminPath] | Literal["all"] = []
    # Most connections open at once on the admin listener: over it, the oldest connection not being served is closed
    # to make room (or the new one, when all are being served), so the admin port never holds more descriptors than
    # this (it has the client time limits above too).
    admin_max_connections: int = Field(default=64, ge=1, le=10_000)
    # Host names the admin listener is known by, besides IP addresses and localhost: a request naming another Host
    # is refused (a DNS-rebinding page in an operator's browser names its own).
    admin_hosts: list[str] = []

    @field_validator("admin_hosts")
    @classmethod
    def _valid_admin_hosts(cls, hosts: list[str]) -> list[str]:
        return _host_names(hosts)

    def admin_open_paths(self) -> frozenset[str]:
        return frozenset(ADMIN_PATHS if self.admin_open == "all" else self.admin_open)


class AccessLogConfig(_Model):
    enabled: bool = True


class MetricsConfig(_Model):
    # Per-request metric updates (requests, durations); off only to measure what they cost.
    enabled: bool = True
    # Companies that get series of their own in the deprecation families, per process (each from its first count);
    # the others are counted under tenant="_other".
    max_companies: int = Field(default=1000, ge=0, le=100_000)


class UsageConfig(_Model):
    # "Who still uses deprecated behaviour" (admin /deprecations and /status, gateway usage): the clients that get
    # rows per behaviour and hour in each process, and the ledger that keeps them (docs/operations.md).
    max_clients: int = Field(default=1000, ge=10, le=100_000)
    ledger: LedgerConfig = LedgerConfig()
    # Clients named by the operator (token fingerprint and/or User-Agent): shown beside their fingerprints.
    clients: list[NamedClient] = Field(default=[], max_length=10_000)
    readiness: ReadinessConfig = ReadinessConfig()
    self_service: SelfServiceConfig = SelfServiceConfig()


class TenantBridges(_Model):
    """The migration bridges a company's clients get; an exemption's ``bridge`` decides for one client."""

    # board_cards: a client whose phase still shows cards gets them rebuilt from the paginated card list when the
    # service itself no longer returns them.
    card_backfill: bool = False
    # legacy_upload_guard: an upload the forbid setting refuses is performed on the restricted route instead.
    upload_upgrade: bool = False


# What a company that sets none has: one (frozen) object for all of them, where a default value would be copied for
# each (a deep copy apiece: a second of a config's validation at 10,000 companies).
_NO_OVERRIDES = TenantRollout()
_NO_BRIDGES = TenantBridges()


class TenantConfig(_Model):
    # At most the usage ledger's key columns hold: a longer name would stop every write to PostgreSQL.
    name: str = Field(pattern=_NAME_RE, max_length=NAME_WIDTH)
    hosts: list[str] = Field(min_length=1)
    upstream: str
    created: ConfigDate | None = None
    restricted_file_access: bool | None = None
    forbid_legacy_uploads: bool | None = None
    # Send the client's Host to the upstream instead of the upstream's own authority.
    preserve_host: bool = False
    # Per-tenant overrides of the rollout section (dates, timezone, brownouts, exemptions): see rollout.py.
    rollout: TenantRollout = Field(default_factory=lambda: _NO_OVERRIDES)
    bridges: TenantBridges = Field(default_factory=lambda: _NO_BRIDGES)

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
        return _host_names(hosts)

    @field_validator("upstream")
    @classmethod
    def _valid_upstream(cls, value: str) -> str:
        if _CONTROL_RE.search(value):
            raise _bad_upstream("upstream must be a URL without control characters (percent-encode them), got", value)
        url, host, port = _parsed_upstream(value)
        if url.scheme not in ("http", "https") or not host or port == 0:
            raise _bad_upstream("upstream must be an http:// or https:// URL, got", value)
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
        forbid = ((self._new_company and restricted) if self.forbid_legacy_uploads is None
                  else self.forbid_legacy_uploads)
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

    def cross_problems(self) -> list[str]:
        """What no single key shows: names and hosts used twice, a default tenant that is none. Each problem names
        the key that repeats or refers (so that a file's problem gets its line)."""
        return (self._tenant_problems() + self._route_problems() + client_problems(self.usage.clients)
                + self._usage_problems())

    def _tenant_problems(self) -> list[str]:
        problems: list[str] = []
        seen_tenants: set[str] = set()
        seen_hosts: dict[str, str] = {}
        for i, tenant in enumerate(self.tenants):
            if tenant.name in seen_tenants:
                problems.append(f"{loc(['tenants', i, 'name'])}: tenant name {tenant.name!r} is used twice")
            seen_tenants.add(tenant.name)
            problems += _host_clashes(i, tenant, seen_hosts)
        if self.default_tenant is not None and self.default_tenant not in seen_tenants:
            problems.append(f"default_tenant: default_tenant {self.default_tenant!r} is not a tenant name")
        return problems

    def _route_problems(self) -> list[str]:
        problems: list[str] = []
        seen_routes: set[str] = set()
        for i, route in enumerate(self.routes):
            if route.name in seen_routes or route.name == "catch_all":
                problems.append(f"{loc(['routes', i, 'name'])}: route name {route.name!r} is used twice or reserved")
            seen_routes.add(route.name)
        return problems

    def _usage_problems(self) -> list[str]:
        """A freeze without the ledger it reads; a route under the prefix the gateway answers itself."""
        if not self.usage.ledger.enabled:
            return self._freeze_problems()
        return self._self_service_problems() if self.usage.self_service.enabled else []

    def _freeze_problems(self) -> list[str]:
        freezes: list[list[int | str]] = [["rollout", "freezes", j] for j in range(len(self.rollout.freezes))]
        freezes += [["tenants", i, "rollout", "freezes", j] for i, t in enumerate(self.tenants)
                    for j in range(len(t.rollout.freezes or ()))]
        return [f"{loc(path)}: a freeze needs the usage ledger (who was seen before its date), and "
                "usage.ledger.enabled is false" for path in freezes]

    def _self_service_problems(self) -> list[str]:
        prefix = self.usage.self_service.prefix
        return [f"{loc(['routes', i, 'paths', j])}: {full!r} is under usage.self_service.prefix ({prefix}), which the "
                "gateway answers itself: choose another prefix or turn usage.self_service off"
                for i, j, full in self._route_paths() if (full + "/").lower().startswith(prefix.lower())]

    def _route_paths(self) -> Iterator[tuple[int, int, str]]:
        """Every path a route matches, with each of its prefixes: the route's index, the path's, the full path."""
        for i, route in enumerate(self.routes):
            for prefix in route.prefixes or [""]:
                for j, path in enumerate(route.paths):
                    yield i, j, prefix.rstrip("/") + path


def _host_clashes(i: int, tenant: TenantConfig, seen_hosts: dict[str, str]) -> list[str]:
    """The hosts of the ``i``-th tenant that an earlier one has (``seen_hosts``: host -> tenant, to which its own
    are added)."""
    problems = []
    for j, host in enumerate(tenant.hosts):
        if host in seen_hosts:
            problems.append(f"{loc(['tenants', i, 'hosts', j])}: host {host!r} belongs to both "
                            f"{seen_hosts[host]!r} and {tenant.name!r}")
        seen_hosts[host] = tenant.name
    return problems


def _parsed_upstream(value: str) -> tuple[URL, str | None, int | None]:
    """The upstream URL, its host and port (parsing either may fail), or the ValueError naming it."""
    try:
        url = URL(value)
        return url, url.host, url.port
    except (ValueError, TypeError):
        raise _bad_upstream("upstream is not a valid URL:", value) from None


def _bad_upstream(message: str, value: str) -> ValueError:
    """``message`` and the value without its credentials: as the URL parser reads it, and (the value may not parse)
    without anything between "://" and its last "@"."""
    return ValueError(f"{message} {_masked_url(value)!r}")


def _masked_url(value: str) -> str:
    """A URL for a message: its userinfo masked as the parser reads it and, for a value that may not parse, also
    whatever lies between "://" and its last "@"."""
    value = without_userinfo(value)
    scheme, sep, rest = value.partition("://")
    if sep and "@" in rest:
        rest = MASK + "@" + rest.rpartition("@")[2]
    return scheme + sep + rest


def parse_model(data: Any, source: str = "config", *, policies: Collection[str] | None = None) -> GatewayConfig:
    """The schema's reading of parsed YAML (or a dict), or ConfigError with every problem. ``policies``: the policy
    names a chain entry may use (the registry's), checked here so that they are reported with the rest."""
    if not isinstance(data, dict):
        raise ConfigError(["(top level): expected a mapping"], source)
    try:
        model = GatewayConfig.model_validate(data, context={"policies": policies} if policies is not None else None)
    except ValidationError as err:
        raise ConfigError(pydantic_problems(err, model=GatewayConfig), source) from None
    problems = model.cross_problems()
    if problems:
        raise ConfigError(problems, source)
    return model
