"""The usage ledger's tables (SQLAlchemy Core): one schema for SQLite and PostgreSQL, created and upgraded by the
migrations next to this module (Alembic), read and written by ``store``. Times are Unix seconds (UTC): ``bucket``
starts the hour requests arrived in, ``day`` the UTC day. An empty string stands for "none" in the key columns (no
Authorization header, no User-Agent): key columns are never NULL, so that the upserts' conflict targets always match.
Beside the hourly rows, per-client rollups written in the same transaction as each batch (``usage_client_state`` for
the whole rollout, ``usage_client_days``): readiness, trends and a freeze's record read tens of thousands of rows
where the hourly ones are millions.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Index, MetaData, String, Table

from ...config.ledger import AGENT_WIDTH, NAME_WIDTH

__all__ = ("EXAMPLE_WIDTH", "RULE_WIDTH", "batches", "client_days", "client_state", "clients", "metadata", "totals")

# An example call (a method and a route template, "PUT /api/v1/cards/{card_id}/files"), and the rule that decided
# a request ("exemption:NAME", "bridge", "brownout"...): cut to these before they are written.
EXAMPLE_WIDTH = 200
RULE_WIDTH = 80

metadata = MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
})

# Every request on deprecated behaviour, per hour, behaviour, tenant and decision; ``untracked``: how many of them
# came from clients beyond a process's usage.max_clients (or usage.ledger.max_pending_clients) in that hour, so that
# they have no row in usage_clients.
totals = Table(
    "usage_totals", metadata,
    Column("bucket", BigInteger, primary_key=True),
    Column("behaviour", String(NAME_WIDTH), primary_key=True),
    Column("tenant", String(NAME_WIDTH), primary_key=True),
    Column("decision", String(NAME_WIDTH), primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("untracked", BigInteger, nullable=False),
)

# Per hour, behaviour, tenant, client (token fingerprint), User-Agent and decision.
clients = Table(
    "usage_clients", metadata,
    Column("bucket", BigInteger, primary_key=True),
    Column("behaviour", String(NAME_WIDTH), primary_key=True),
    Column("tenant", String(NAME_WIDTH), primary_key=True),
    Column("client", String(NAME_WIDTH), primary_key=True),
    Column("user_agent", String(AGENT_WIDTH), primary_key=True),
    Column("decision", String(NAME_WIDTH), primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("first_seen", Double, nullable=False),
    Column("last_seen", Double, nullable=False),
)

# The batches written, by id, for a week: a batch sent again after an attempt whose outcome was unknown is
# recognised and not counted twice.
batches = Table(
    "usage_batches", metadata,
    Column("id", String(32), primary_key=True),
    Column("written_at", Double, nullable=False),
    Index(None, "written_at"),
)

# Per company, client and behaviour, for the whole rollout: when it was first and last seen, its requests, and of its
# latest request the decision and User-Agent; an example call and the rule that decided it (of its first request in
# the latest batch); ``last_refused``: when a request of it was last refused (0: never).
client_state = Table(
    "usage_client_state", metadata,
    Column("tenant", String(NAME_WIDTH), primary_key=True),
    Column("client", String(NAME_WIDTH), primary_key=True),
    Column("behaviour", String(NAME_WIDTH), primary_key=True),
    Column("first_seen", Double, nullable=False),
    Column("last_seen", Double, nullable=False),
    Column("requests", BigInteger, nullable=False),
    Column("last_decision", String(NAME_WIDTH), nullable=False),
    Column("user_agent", String(AGENT_WIDTH), nullable=False),
    Column("example", String(EXAMPLE_WIDTH), nullable=False),
    Column("rule", String(RULE_WIDTH), nullable=False),
    Column("last_refused", Double, nullable=False),
)

# Per UTC day, company, client and behaviour: its requests, and how many were refused (trends, a client's own view).
client_days = Table(
    "usage_client_days", metadata,
    Column("day", BigInteger, primary_key=True),
    Column("tenant", String(NAME_WIDTH), primary_key=True),
    Column("client", String(NAME_WIDTH), primary_key=True),
    Column("behaviour", String(NAME_WIDTH), primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("refused", BigInteger, nullable=False),
    Index(None, "tenant", "client", "day"),
)
