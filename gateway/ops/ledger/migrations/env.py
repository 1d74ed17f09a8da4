"""Alembic's environment for the usage ledger: always given a connection in a transaction (``store.Store.migrate``
opens it, holding the lock that keeps two processes from migrating at once), never a URL of its own."""

from __future__ import annotations

from alembic import context

from gateway.ops.ledger.schema import metadata

connection = context.config.attributes["connection"]
# SQLite cannot alter most of a table in place: batch mode copies it (the way Alembic documents for SQLite).
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite", transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
