"""The configuration file: YAML and its schema, with every problem reported at once with its key's path (and line).
Schema only: a chain entry is a policy name and its raw options, the rollout's date flags are raw dates; the policy
registry checks both (``gateway.policies.check_config``). The defaults that come from the service spec live here.
Values are read as their key means them, strictly (docs/configuration.md)."""

from __future__ import annotations

import collections.abc
import dataclasses
import ipaddress
import re
import types
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

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

from ..core.keys import UNKNOWN_KEY, did_you_mean
from ..core.redaction import MASK, url_credentials, without_query_values, without_userinfo
from ..core.spec import RESTRICTED_BY_DEFAULT_FROM
from ..core.template import PARAM
from ..core.spool import SpoolConfig
from ..core.tenants import Tenant, canonical_host
from ..rollout.behaviour import Behaviour
from ..rollout.config import ConfigDate, RolloutConfig, TenantRollout
from ..rollout.plan import RolloutPlan
from .ledger import NAME_WIDTH, LedgerConfig
from .tracing import TracingConfig
from .upstream import UpstreamConfig

__all__ = (
    "ADMIN_PATHS",
    "ChainEntry",
    "ConfigError",
    "Document",
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
    "read_document",
    "read_yaml",
)

_NAME_RE = r"^[a-z][a-z0-9_\-]*$"
_METHOD_RE = re.compile(r"^[A-Z][A-Z0-9\-_]*$")
_TEMPLATE_RE = re.compile(rf"^(/([A-Za-z0-9\-._~!$&'()*+,=:@]+|{PARAM}))+$")
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


class UsageConfig(_Model):
    # "Who still uses deprecated behaviour" (admin /deprecations and /status, gateway usage): the clients that get
    # rows per behaviour and hour in each process, and the ledger that keeps them (docs/operations.md).
    max_clients: int = Field(default=1000, ge=10, le=100_000)
    ledger: LedgerConfig = LedgerConfig()


class TenantBridges(_Model):
    """The migration bridges a company's clients get; an exemption's ``bridge`` decides for one client."""

    # board_cards: a client whose phase still shows cards gets them rebuilt from the paginated card list when the
    # service itself no longer returns them.
    card_backfill: bool = False
    # legacy_upload_guard: an upload the forbid setting refuses is performed on the restricted route instead.
    upload_upgrade: bool = False


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
        return _host_names(hosts)

    @field_validator("upstream")
    @classmethod
    def _valid_upstream(cls, value: str) -> str:
        # The message shows the value without its credentials: as the URL parser reads it, and (the value may not
        # parse) without anything between "://" and its last "@".
        shown = repr(_masked_url(value))
        if any(ord(c) < 0x20 or c == "\x7f" for c in value):
            raise ValueError(f"upstream must be a URL without control characters (percent-encode them), got {shown}")
        try:
            url = URL(value)
            host, port = url.host, url.port
        except (ValueError, TypeError):
            raise ValueError(f"upstream is not a valid URL: {shown}") from None
        if url.scheme not in ("http", "https") or not host or port == 0:
            raise ValueError(f"upstream must be an http:// or https:// URL, got {shown}")
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

    def cross_problems(self) -> list[str]:
        """What no single key shows: names and hosts used twice, a default tenant that is none. Each problem names
        the key that repeats or refers (so that a file's problem gets its line)."""
        problems: list[str] = []
        seen_tenants: set[str] = set()
        seen_hosts: dict[str, str] = {}
        for i, tenant in enumerate(self.tenants):
            if tenant.name in seen_tenants:
                problems.append(f"{loc(['tenants', i, 'name'])}: tenant name {tenant.name!r} is used twice")
            seen_tenants.add(tenant.name)
            for j, host in enumerate(tenant.hosts):
                if host in seen_hosts:
                    problems.append(f"{loc(['tenants', i, 'hosts', j])}: host {host!r} belongs to both "
                                    f"{seen_hosts[host]!r} and {tenant.name!r}")
                seen_hosts[host] = tenant.name
        if self.default_tenant is not None and self.default_tenant not in seen_tenants:
            problems.append(f"default_tenant: default_tenant {self.default_tenant!r} is not a tenant name")
        seen_routes: set[str] = set()
        for i, route in enumerate(self.routes):
            if route.name in seen_routes or route.name == "catch_all":
                problems.append(f"{loc(['routes', i, 'name'])}: route name {route.name!r} is used twice or reserved")
            seen_routes.add(route.name)
        return problems


def _masked_url(value: str) -> str:
    """A URL for a message: its userinfo masked as the parser reads it and, for a value that may not parse, also
    whatever lies between "://" and its last "@"."""
    value = without_userinfo(value)
    scheme, sep, rest = value.partition("://")
    if sep and "@" in rest:
        rest = MASK + "@" + rest.rpartition("@")[2]
    return scheme + sep + rest


_REFERENCE_RE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# A secret value shorter than this is not searched for in text: it would be found inside unrelated words (a password
# "e" in every "gateway"), and what gets masked would confirm a guessed value. It is masked where it stands instead:
# a config string that holds it (shown as written), a URL's userinfo.
_MIN_SEARCHED = 8


def _whole(value: str) -> str:
    """A pattern of ``value`` where it stands whole: not run on from a word (a letter, digit or ``_``) at an edge
    that is itself part of a word."""
    head = r"(?<!\w)" if re.match(r"\w", value[0]) else ""
    tail = r"(?!\w)" if re.match(r"\w", value[-1]) else ""
    return head + re.escape(value) + tail


@dataclass(frozen=True, slots=True)
class Secrets:
    """Values the config took from the environment (``${NAME}``), shown as their reference wherever the config is
    shown: ``check-config``, the admin ``/config``, problems and log lines. Credentials in a URL are masked too: the
    userinfo of any URL (found by the URL parser, ``core.redaction``), and every spelling of the credentials of the
    config's own URLs wherever they appear; and the query values of any URL. In free text a value is searched for
    only when it is 8 characters or longer, and only where it stands whole."""

    shown: Mapping[str, str] = dataclasses.field(default_factory=dict)  # value -> what is shown instead
    # A config string that held a reference, as expanded -> as written: shown as written, whatever its values' length.
    written: Mapping[str, str] = dataclasses.field(default_factory=dict)
    _searched: re.Pattern[str] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Longest first: a secret that contains another is replaced whole.
        values = sorted((value for value in self.shown if len(value) >= _MIN_SEARCHED), key=len, reverse=True)
        object.__setattr__(self, "_searched", re.compile("|".join(map(_whole, values))) if values else None)

    def redact(self, text: str) -> str:
        if self._searched is not None:
            text = self._searched.sub(lambda found: self.shown[found.group(0)], text)
        return without_userinfo(without_query_values(text))

    def reference(self, value: str) -> str | None:
        """The ``${NAME}`` the config took ``value`` from, or None (written in the file)."""
        shown = self.shown.get(value)
        return shown if shown is not None and shown.startswith("${") else None

    def with_values(self, values: Collection[str], shown: str = MASK) -> Secrets:
        """These secrets and more values (credentials of a URL, a token written in the file), shown as ``shown``."""
        added = {value: shown for value in values if value and value not in self.shown}
        return dataclasses.replace(self, shown={**self.shown, **added}) if added else self

    def with_url_credentials(self, urls: Collection[str]) -> Secrets:
        return self.with_values({c for url in urls for c in url_credentials(url)})

    def redact_data(self, data: Any) -> Any:
        """A JSON-ready structure with every string redacted (one that held a reference, as written)."""
        if isinstance(data, str):
            return self.redact(self.written.get(data, data))
        if isinstance(data, dict):
            return {key: self.redact_data(value) for key, value in data.items()}
        if isinstance(data, list):
            return [self.redact_data(value) for value in data]
        return data


def expand_references(data: Any, environ: Mapping[str, str],
                      unneeded: Callable[[Sequence[int | str]], bool] | None = None) -> tuple[Any, Secrets, list[str]]:
    """``${NAME}`` in any string of the config becomes the environment variable's value (``$$`` is a literal ``$``),
    so that a credential need not sit in the file (or a ConfigMap). Returns the data, the secrets to redact, and a
    problem for each variable that is not set. ``unneeded(path)``: whether the key at ``path`` is one the command
    does not use; an unset variable there stays as its reference, not a problem."""
    shown: dict[str, str] = {}
    written: dict[str, str] = {}
    problems: list[str] = []

    def expand(value: Any, where: list[int | str]) -> Any:
        if isinstance(value, dict):
            return {key: expand(item, [*where, str(key)]) for key, item in value.items()}
        if isinstance(value, list):
            return [expand(item, [*where, i]) for i, item in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value
        took: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "$"
            if name not in environ:
                if unneeded is not None and unneeded(where):
                    return match.group(0)
                problems.append(f"{loc(where)}: environment variable {name} is not set")
                return ""
            secret = environ[name]
            if secret:
                shown[secret] = match.group(0)
                took.append(name)
            return secret

        expanded = _REFERENCE_RE.sub(substitute, value)
        if took:  # shown with its references, its "$$" as the "$" they stand for
            written[expanded] = _REFERENCE_RE.sub(lambda match: match.group(0) if match.group(1) else "$", value)
        return expanded

    return expand(data, []), Secrets(shown, written), problems


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

    def shown(self) -> dict[str, Any]:
        """The config as loaded, for people: secrets shown as their references, credentials in URLs masked."""
        data: dict[str, Any] = self.secrets.redact_data(self.model.model_dump(mode="json"))
        return data

    def rollout_plan(self) -> RolloutPlan:
        """Every tenant's schedule of every dated behaviour, from this config."""
        tenants = [(t.resolve(), t.rollout) for t in self.model.tenants]
        return RolloutPlan.build(self.model.rollout, tenants, self.behaviours)


def loc(parts: Sequence[int | str]) -> str:
    """A key's path as problems name it: ``routes[3].chain[1].board_cards.cap`` (a key's unprintable characters as
    ``\\xNN``, so that a problem is one line of plain text)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if not text.isprintable():
                text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
            out += ("." if out else "") + text
    return out or "(top level)"


def pydantic_problems(err: ValidationError, prefix: Sequence[int | str] = (),
                      model: type[BaseModel] | None = None) -> list[str]:
    """Each error of ``model``'s validation as ``path: message``; an unknown key with the known key nearest to it."""
    problems = []
    for item in err.errors(include_url=False):
        msg = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden" and model is not None and item["loc"]:
            msg = UNKNOWN_KEY + did_you_mean(item["loc"][-1], _keys_at(model, item["loc"][:-1]))
        problems.append(f"{loc([*prefix, *item['loc']])}: {msg}")
    return problems


def _keys_at(model: type[BaseModel], path: Sequence[int | str]) -> set[str]:
    """The keys the schema knows in the mapping at ``path`` under ``model`` (none where the path cannot be followed
    through the annotations, as through a union's member named in the path)."""
    kinds: list[Any] = [model]
    for part in path:
        kinds = [inner for kind in kinds for option in _options(kind) for inner in _inside(option, part)]
    return {name for kind in kinds for option in _options(kind) if _is_model(option) for name in option.model_fields}


def _options(kind: Any) -> list[Any]:
    """``kind`` without Annotated's metadata, a union as its members."""
    origin = get_origin(kind)
    if origin is Annotated:
        return _options(get_args(kind)[0])
    if origin in (Union, types.UnionType):
        return [option for member in get_args(kind) for option in _options(member)]
    return [kind]


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def _inside(kind: Any, part: int | str) -> list[Any]:
    """What ``kind`` holds at ``part``: a model's field, a list's or tuple's item, a mapping's value."""
    origin, args = get_origin(kind), get_args(kind)
    if _is_model(kind) and isinstance(part, str):
        field = kind.model_fields.get(part)
        return [field.annotation] if field is not None else []
    if origin in (list, tuple, collections.abc.Sequence) and isinstance(part, int) and args:
        return [args[0]]
    if origin in (dict, collections.abc.Mapping) and len(args) == 2:
        return [args[1]]
    return []


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# Aliases let a small file stand for a huge (or endless) structure: more values than this is a problem.
_MAX_VALUES = 100_000


class _Loader(yaml.SafeLoader):
    """The file's YAML for the schema: a duplicated key is a mistake, not a silent override, and a timestamp stays
    the text it was (the key that holds it reads it: a date key says ``2026-02-30`` is no date, a string key keeps
    ``2026-01-01`` as written)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain value, not a list or mapping",
                                                    key_node.start_mark)
        if key in mapping:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


def _construct_text(loader: _Loader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(node))  # type: ignore[arg-type]  # an explicit !!timestamp: text as well


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(_TIMESTAMP_TAG, _construct_text)


class _Unreadable(Exception):
    def __init__(self, message: str, node: yaml.Node) -> None:
        super().__init__(message)
        self.line = node.start_mark.line + 1


def _key_lines(loader: _Loader, root: yaml.Node) -> dict[str, int]:
    """Each key's and item's path (as problems name it, ``loc``) -> the line it is written on. Refuses an alias
    that contains itself and a document of more than ``_MAX_VALUES`` values, before anything is built from it."""
    lines: dict[str, int] = {}
    count = 0
    open_nodes: set[int] = set()

    def walk(node: yaml.Node, path: list[int | str]) -> None:
        nonlocal count
        count += 1
        if count > _MAX_VALUES:
            raise _Unreadable(f"more than {_MAX_VALUES} values (aliases included)", node)
        if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            return
        if id(node) in open_nodes:
            raise _Unreadable("an alias refers to a mapping or list that contains it", node)
        open_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault(loc([*path, i]), item.start_mark.line + 1)
                walk(item, [*path, i])
        else:
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
                if isinstance(key, (str, int)):
                    lines.setdefault(loc([*path, key]), key_node.start_mark.line + 1)
                    walk(value_node, [*path, key])
                else:
                    walk(value_node, path)
        open_nodes.discard(id(node))

    walk(root, [])
    return lines


_PARENT_RE = re.compile(r"(\[\d+\]|\.[^.\[]*|^[^.\[]+)$")


@dataclass(frozen=True, slots=True)
class Document:
    """A config file's YAML and where each of its keys is written."""

    data: Any
    lines: Mapping[str, int] = dataclasses.field(default_factory=dict)  # loc(path) -> line (1-based)

    def line_of(self, path: str) -> int | None:
        """The line of ``path``, or of its nearest ancestor written in the file (a missing key: its mapping)."""
        while path:
            line = self.lines.get(path)
            if line is not None:
                return line
            path = _PARENT_RE.sub("", path)
        return None

    def annotate(self, problems: Sequence[str]) -> list[str]:
        """Each problem (``path: message``) with the line of its path: ``line 12: path: message``."""
        out = []
        for problem in problems:
            known = [i for i in range(len(problem)) if problem.startswith(": ", i) and problem[:i] in self.lines]
            path = problem[:known[-1]] if known else problem.partition(": ")[0]
            line = self.line_of(path)
            out.append(f"line {line}: {problem}" if line is not None else problem)
        return out


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


def read_document(path: str | Path) -> Document:
    """The file's YAML (duplicated keys refused) and the line of each key, or ConfigError."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as err:
        raise ConfigError([f"cannot read the file: {err.strerror or err}"], source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ConfigError([f"line {line}: the file is not UTF-8 text (byte {err.start + 1})"], source) from None
    try:
        loader = _Loader(text)  # its reader refuses characters YAML does not allow (NUL) at once
    except yaml.YAMLError as err:
        raise ConfigError([_yaml_problem(err)], source) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(None)
        lines = _key_lines(loader, node)
        return Document(loader.construct_document(node), lines)
    except yaml.YAMLError as err:
        raise ConfigError([_yaml_problem(err)], source) from None
    except _Unreadable as err:
        raise ConfigError([f"line {err.line}: {err}"], source) from None
    except RecursionError:
        raise ConfigError(["invalid YAML: nested too deeply"], source) from None
    finally:
        loader.dispose()


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    if mark is None and isinstance(err, yaml.reader.ReaderError):
        text = err.reason[:1].lower() + err.reason[1:]  # an unacceptable character: where, from its position
        return f"invalid YAML: {text} (character {err.position + 1})"
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(err, "problem", None) or str(err)
    return f"{where}invalid YAML: {problem}"


def read_yaml(path: str | Path) -> Any:
    """The file's YAML (duplicated keys refused), or ConfigError."""
    return read_document(path).data
