"""The usage ledger's options: the ``usage.ledger`` section of the config (schema only; read by ``ops.ledger``), and
the clients the operator names (``usage.clients``: ``ClientNames`` finds a request's), what readiness means
(``usage.readiness``) and the integrators' own view on the public listener (``usage.self_service``).

The URL is checked here for what it must be (a SQLite file, or a PostgreSQL database reached with psycopg) without
being echoed: it may hold a password (usually as ``${NAME}``, already expanded when this runs), and a problem is
printed where anyone can read it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from yarl import URL

from ..rollout.config import check_value_or_prefix, value_or_prefix_matches

__all__ = ("AGENT_WIDTH", "DEFAULT_URL", "NAME_WIDTH", "AgentMatch", "ClientNames", "LedgerConfig", "NamedClient",
           "ReadinessConfig", "SelfServiceConfig", "client_problems", "database_url")

# The widths of the ledger's key columns (``ops.ledger.schema``), in characters: every value that goes into one is
# bounded before it gets there (PostgreSQL refuses a longer one; SQLite would keep it, to fail after a move). Names
# (tenants, which the config bounds; behaviours and decisions, the policies'; token fingerprints, 12 characters) fit
# NAME_WIDTH; the usage counter cuts User-Agents to AGENT_WIDTH.
NAME_WIDTH = 64
AGENT_WIDTH = 200

# A file in the working directory: the demo and a single process work with no setup.
DEFAULT_URL = "sqlite:///gateway-usage.sqlite3"
_SQLITE = ("sqlite", "sqlite+pysqlite")
_POSTGRES = ("postgresql", "postgres", "postgresql+psycopg")


def database_url(url: str) -> str:
    """The URL as SQLAlchemy reads it: ``postgresql://`` and ``postgres://`` mean psycopg 3 (SQLAlchemy's default
    for them would be psycopg2, which the gateway does not ship). ValueError, naming no part of the URL but its
    scheme, when it is neither a SQLite nor a PostgreSQL URL."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise ValueError("expected sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    if scheme in _SQLITE:
        return _sqlite_url(rest)
    if scheme in _POSTGRES:
        return _postgres_url(url, rest)
    shown = scheme if scheme.replace("+", "").isalnum() and len(scheme) < 30 else "?"
    raise ValueError(f"unsupported database {shown!r}: use sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB")


def _sqlite_url(rest: str) -> str:
    if rest and not rest.startswith("/"):
        raise ValueError("a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path")
    return f"sqlite://{rest}"


def _postgres_url(url: str, rest: str) -> str:
    parsed, port = _parsed_postgres(url)
    if not parsed.path.strip("/"):
        raise ValueError("a PostgreSQL URL names its database: postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
    if not parsed.raw_host and "host" not in parsed.query or port is not None and not 0 < port < 65536:
        raise ValueError("a PostgreSQL URL names its host and port (or ?host=/run/postgresql for a socket)")
    return f"postgresql+psycopg://{rest}"


def _parsed_postgres(url: str) -> tuple[URL, int | None]:
    """The URL and its port as written (parsing either may fail), or the ValueError saying how to write one."""
    try:
        parsed = URL(url)
        return parsed, parsed.explicit_port
    except ValueError:
        raise ValueError("not a valid URL: postgresql://USER:PASSWORD@HOST:PORT/DATABASE (a password with "
                         "reserved characters is percent-encoded)") from None


class LedgerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)  # "5" is not 5

    # Off: nothing is counted or kept, and /deprecations, /status and `gateway usage` have no clients to show.
    enabled: bool = True
    # sqlite:///relative/path (from the working directory), sqlite:////absolute/path, or
    # postgresql://USER:${PASSWORD}@HOST:PORT/DATABASE for a fleet (every replica writes to one database).
    url: str = DEFAULT_URL
    # How often the counts held in memory are written (a SIGKILL loses at most this much).
    flush_interval: float = Field(default=10.0, ge=0.05, le=3600)
    # Longest a write (or the connection before it) may take before it counts as failed; also what SIGTERM gives
    # the last write after the requests in flight have finished.
    flush_timeout: float = Field(default=5.0, gt=0, le=300)
    # Hours older than this many days are deleted.
    retention_days: int = Field(default=400, ge=1, le=36500)
    # Most client rows held in memory while the database cannot be written; over it, requests still count in the
    # totals (as untracked clients), never in a client's row. A row costs up to 1,000 bytes (a User-Agent of 200
    # characters, each row a new client; tests/test_usage.py measures it): the default bound, about 100 MiB at most.
    max_pending_clients: int = Field(default=100_000, ge=100, le=10_000_000)
    # A freeze's record of who was seen before its date: read from the database this often (a replica learns of the
    # clients another one saw within its flush_interval and this), and kept in this file across restarts and
    # outages (default: beside a SQLite file; with PostgreSQL, in spool.dir or the system's temporary directory).
    sync_interval: float = Field(default=30.0, ge=0.1, le=300)
    known_clients_file: str | None = Field(default=None, min_length=1, max_length=4096)

    @field_validator("url")
    @classmethod
    def _valid_url(cls, url: str) -> str:
        database_url(url)
        return url


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


_FINGERPRINT = re.compile(r"[0-9a-f]{12}")


class AgentMatch(_Model):
    """A User-Agent, matched as an exemption's header is: ``value`` the whole of it, ``prefix`` its beginning; both
    case-sensitive (docs/rollout.md, "How a header matches")."""

    value: str | None = Field(default=None, max_length=AGENT_WIDTH)
    prefix: str | None = Field(default=None, min_length=1, max_length=AGENT_WIDTH)

    @model_validator(mode="after")
    def _one(self) -> AgentMatch:
        check_value_or_prefix(self.value, self.prefix)
        return self

    def matches(self, agent: str | None) -> bool:
        return value_or_prefix_matches(agent, self.value, self.prefix)

    def meets(self, other: AgentMatch) -> bool:
        """Whether some User-Agent matches both."""
        mine, theirs = self.prefix or self.value or "", other.prefix or other.value or ""
        # A prefix meets what begins with it; two values meet when they are one.
        return (mine == theirs or (other.prefix is not None and mine.startswith(theirs))
                or (self.prefix is not None and theirs.startswith(mine)))

    def __str__(self) -> str:
        return f"User-Agent = {self.value!r}" if self.prefix is None else f"User-Agent starting {self.prefix!r}"


class NamedClient(_Model):
    """A client the operator names: reports, the status page, the command line and the access log show the name
    beside its fingerprint. An internal one (the platform's own caller) is counted, but left out of readiness
    totals."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=NAME_WIDTH)
    owner: str = Field(default="", max_length=200)  # free text: a mail address, a team
    internal: bool = False
    token_fingerprint: str | None = None
    user_agent: AgentMatch | None = None

    @field_validator("token_fingerprint")
    @classmethod
    def _fingerprint(cls, value: str | None) -> str | None:
        if value is not None and not _FINGERPRINT.fullmatch(value):
            raise ValueError(f"a token fingerprint is 12 lowercase hex digits (the access log's client), got "
                             f"{value[:40]!r}")
        return value

    @model_validator(mode="after")
    def _named_by_something(self) -> NamedClient:
        if self.token_fingerprint is None and self.user_agent is None:
            raise ValueError("a named client is matched by token_fingerprint, user_agent, or both")
        return self

    def matches(self, fingerprint: str | None, agent: str | None) -> bool:
        if self.token_fingerprint is not None and fingerprint != self.token_fingerprint:
            return False
        return self.user_agent is None or self.user_agent.matches(agent)

    def meets(self, other: NamedClient) -> bool:
        """Whether one client could match both entries."""
        if None not in (self.token_fingerprint, other.token_fingerprint) and \
                self.token_fingerprint != other.token_fingerprint:
            return False
        return self.user_agent is None or other.user_agent is None or self.user_agent.meets(other.user_agent)

    @property
    def match(self) -> str:
        parts = [f"token fingerprint {self.token_fingerprint}"] if self.token_fingerprint is not None else []
        if self.user_agent is not None:
            parts.append(str(self.user_agent))
        return " and ".join(parts)


def client_problems(clients: Sequence[NamedClient], where: str = "usage.clients") -> list[str]:
    """Names used twice, and entries one client could match both of, each problem at the later entry's path: two
    with the same fingerprint (and User-Agents that can meet), two matched by their User-Agent alone whose
    User-Agents can meet. An entry with a fingerprint wins over one by User-Agent alone (``ClientNames.find``): a
    token named on its own is more precise than a family of User-Agents."""
    problems = _names_twice(clients, where)
    for a, b in _same_kind(clients):
        if clients[a].meets(clients[b]):
            problems.append(f"{where}[{b}]: one client can match both {clients[b].name!r} ({clients[b].match}) and "
                            f"{clients[a].name!r} at {where}[{a}] ({clients[a].match}): make them exclusive")
    return problems


def _names_twice(clients: Sequence[NamedClient], where: str) -> list[str]:
    problems: list[str] = []
    first: dict[str, int] = {}
    for i, client in enumerate(clients):
        if client.name in first:
            problems.append(f"{where}[{i}].name: the name {client.name!r} is used twice (first at {where}"
                            f"[{first[client.name]}])")
        first.setdefault(client.name, i)
    return problems


def _same_kind(clients: Sequence[NamedClient]) -> list[tuple[int, int]]:
    """Pairs of entries (earlier, later) with one fingerprint, or both by User-Agent alone; by the later one."""
    by_token: dict[str, list[int]] = {}
    anyone: list[int] = []
    for i, client in enumerate(clients):
        if client.token_fingerprint is None:
            anyone.append(i)
        else:
            by_token.setdefault(client.token_fingerprint, []).append(i)
    pairs: set[tuple[int, int]] = set()
    for group in [*by_token.values(), anyone]:
        pairs.update((a, b) for n, a in enumerate(group) for b in group[n + 1:])
    return sorted(pairs, key=lambda pair: (pair[1], pair[0]))


class ClientNames:
    """The named clients, found by a request's (or a ledger row's) fingerprint and User-Agent: the entry of its
    fingerprint that matches, else the entry by User-Agent alone that does (``client_problems`` refuses entries of
    one kind that overlap, so there is at most one of each)."""

    __slots__ = ("_by_token", "_by_agent", "entries")

    def __init__(self, clients: Iterable[NamedClient]) -> None:
        self.entries = tuple(clients)
        self._by_token: dict[str, list[NamedClient]] = {}
        self._by_agent: list[NamedClient] = []
        for client in self.entries:
            if client.token_fingerprint is None:
                self._by_agent.append(client)
            else:
                self._by_token.setdefault(client.token_fingerprint, []).append(client)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def find(self, fingerprint: str | None, agent: str | None) -> NamedClient | None:
        # An entry of the fingerprint first, then one by User-Agent alone.
        for client in itertools.chain(self._by_token.get(fingerprint or "", ()), self._by_agent):
            if client.matches(fingerprint, agent):
                return client
        return None


class ReadinessConfig(_Model):
    """What readiness means: a client is ``ready`` once it has made no deprecated call for ``quiet_days``; the
    clients read are those seen within ``window_days``."""

    quiet_days: int = Field(default=14, ge=1, le=365)
    window_days: int = Field(default=90, ge=2, le=36500)

    @model_validator(mode="after")
    def _window_covers_quiet(self) -> ReadinessConfig:
        if self.window_days <= self.quiet_days:
            raise ValueError(f"window_days ({self.window_days}) must be more than quiet_days ({self.quiet_days}): a "
                             "client quiet for quiet_days must still be in the window to be seen as ready")
        return self


class SelfServiceConfig(_Model):
    """A client's own usage, on the public listener under ``prefix`` (with its own token), and a ``Link`` to it on
    the answers to its deprecated calls. A path the gateway answers itself: it must not be one of the service's."""

    enabled: bool = True
    prefix: str = Field(default="/_gateway/", pattern=r"^(/[A-Za-z0-9._~\-]+)+/$", max_length=200)
