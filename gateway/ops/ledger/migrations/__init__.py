"""Alembic's migrations of the usage ledger's schema (``env.py`` and ``versions/``), run by ``store.Store.migrate``."""
