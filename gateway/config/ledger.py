"""The usage ledger's options: the ``usage.ledger`` section of the config (schema only; read by ``ops.ledger``).

The URL is checked here for what it must be (a SQLite file, or a PostgreSQL database reached with psycopg) without
being echoed: it may hold a password (usually as ``${NAME}``, already expanded when this runs), and a problem is
printed where anyone can read it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator
from yarl import URL

__all__ = ("AGENT_WIDTH", "DEFAULT_URL", "NAME_WIDTH", "LedgerConfig", "database_url")

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
        if rest and not rest.startswith("/"):
            raise ValueError("a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path")
        return f"sqlite://{rest}"
    if scheme in _POSTGRES:
        try:
            parsed = URL(url)
            port = parsed.explicit_port
        except ValueError:
            raise ValueError("not a valid URL: postgresql://USER:PASSWORD@HOST:PORT/DATABASE (a password with "
                             "reserved characters is percent-encoded)") from None
        if not parsed.path.strip("/"):
            raise ValueError("a PostgreSQL URL names its database: postgresql://USER:PASSWORD@HOST:PORT/DATABASE")
        if not parsed.raw_host and "host" not in parsed.query or port is not None and not 0 < port < 65536:
            raise ValueError("a PostgreSQL URL names its host and port (or ?host=/run/postgresql for a socket)")
        return f"postgresql+psycopg://{rest}"
    shown = scheme if scheme.replace("+", "").isalnum() and len(scheme) < 30 else "?"
    raise ValueError(f"unsupported database {shown!r}: use sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB")


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
    # totals (as untracked clients), never in a client's row. A row costs up to 800 bytes (a User-Agent of 200
    # characters, tests/test_usage.py measures it): the default bound, at most about 80 MiB.
    max_pending_clients: int = Field(default=100_000, ge=100, le=10_000_000)

    @field_validator("url")
    @classmethod
    def _valid_url(cls, url: str) -> str:
        database_url(url)
        return url
