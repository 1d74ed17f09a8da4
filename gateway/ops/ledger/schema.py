"""The usage ledger's tables (SQLAlchemy Core): one schema for SQLite and PostgreSQL, created and upgraded by the
migrations next to this module (Alembic), read and written by ``store``.

Times are Unix seconds (UTC). ``bucket`` is the start of the hour the requests arrived in. An empty string stands
for "none" in the key columns (no Authorization header, no User-Agent): key columns are never NULL, so that the
upserts' conflict targets always match.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Index, MetaData, String, Table

from ...config.ledger import AGENT_WIDTH, NAME_WIDTH

__all__ = ("batches", "clients", "metadata", "totals")

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
