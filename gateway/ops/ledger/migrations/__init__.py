"""Alembic's migrations of the usage ledger's schema (``env.py`` and ``versions/``), run by ``store.Store.migrate``."""

# The newest revision in versions/ (tests/test_usage.py checks it against Alembic's own reading): the gateway
# compares it with the database's at start without importing Alembic.
HEAD = "0002"
