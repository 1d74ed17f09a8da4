"""The usage ledger: who uses deprecated behaviour, kept per hour in a database (SQLite by default, PostgreSQL for a
fleet) and read back by the admin endpoints, the status page and ``gateway usage``.

- ``query``: reading windows (the ``usage.ledger`` section's schema is ``config.ledger``);
- ``ledger``: the running gateway's side (background writes, reads for the admin endpoints);
- ``store``: the database side (SQLAlchemy Core, Alembic migrations in ``migrations/``), imported only when a
  database is opened.
"""

from ...config.ledger import LedgerConfig
from .ledger import Ledger, LedgerFamilies, LedgerUnavailable
from .query import DEFAULT_SINCE, Query, check_name, parse_when, window

__all__ = ("DEFAULT_SINCE", "Ledger", "LedgerConfig", "LedgerFamilies", "LedgerUnavailable", "Query", "check_name",
           "parse_when", "window")
