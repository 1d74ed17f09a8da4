"""Per-client rollups beside the hourly rows: each client's state for the whole rollout, and its requests per day;
both filled from the hourly rows already there, in the same transaction.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# The rules of this revision, as SQL (the store applies the same to each batch, ``ops.usage.refused``): a request
# the upload guard refused (blocked, refused), or a board answered without its cards (its action removed or
# backfill_failed), unless the client asked for that phase itself (a preview); the upload guard's "passed" is no
# deprecated call (nothing uploaded).
# (Written for sqlalchemy.text, where ":" starts a bind parameter unless escaped.)
_REFUSED = ("(decision IN ('blocked', 'refused') OR ((decision LIKE '%\\:removed' OR decision LIKE "
            "'%\\:backfill!_failed' ESCAPE '!') AND decision NOT LIKE '%(preview)%'))")
_CALLS = "decision <> 'passed'"


def upgrade() -> None:
    op.create_table(
        "usage_client_state",
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("behaviour", sa.String(64), nullable=False),
        sa.Column("first_seen", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("last_decision", sa.String(64), nullable=False),
        sa.Column("user_agent", sa.String(200), nullable=False),
        sa.Column("example", sa.String(200), nullable=False),
        sa.Column("rule", sa.String(80), nullable=False),
        sa.Column("last_refused", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "client", "behaviour", name="pk_usage_client_state"),
    )
    op.create_table(
        "usage_client_days",
        sa.Column("day", sa.BigInteger(), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("behaviour", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("refused", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("day", "tenant", "client", "behaviour", name="pk_usage_client_days"),
    )
    op.create_index("ix_usage_client_days_tenant", "usage_client_days", ["tenant", "client", "day"])
    # The rows already there: each client's totals, and of its latest hourly row (the latest last_seen; ties by
    # decision and User-Agent, so that every database picks the same) the decision and User-Agent. Rows written
    # before this revision have no example call and no rule: the next request of the client brings them.
    op.execute(sa.text(f"""
        INSERT INTO usage_client_state (tenant, client, behaviour, first_seen, last_seen, requests, last_decision,
                                        user_agent, example, rule, last_refused)
        SELECT g.tenant, g.client, g.behaviour, g.first_seen, g.last_seen, g.requests, l.decision, l.user_agent, '',
               '', g.last_refused
        FROM (SELECT tenant, client, behaviour, MIN(first_seen) AS first_seen, MAX(last_seen) AS last_seen,
                     SUM(requests) AS requests,
                     MAX(CASE WHEN {_REFUSED} THEN last_seen ELSE 0 END) AS last_refused
              FROM usage_clients WHERE {_CALLS} GROUP BY tenant, client, behaviour) AS g
        JOIN (SELECT tenant, client, behaviour, decision, user_agent,
                     ROW_NUMBER() OVER (PARTITION BY tenant, client, behaviour
                                        ORDER BY last_seen DESC, decision, user_agent) AS n
              FROM usage_clients WHERE {_CALLS}) AS l
          ON l.tenant = g.tenant AND l.client = g.client AND l.behaviour = g.behaviour AND l.n = 1
    """))
    # The day's length inline (a bound parameter would not let PostgreSQL group by the selected expression).
    op.execute(sa.text(f"""
        INSERT INTO usage_client_days (day, tenant, client, behaviour, requests, refused)
        SELECT bucket - bucket % 86400, tenant, client, behaviour, SUM(requests),
               SUM(CASE WHEN {_REFUSED} THEN requests ELSE 0 END)
        FROM usage_clients WHERE {_CALLS}
        GROUP BY bucket - bucket % 86400, tenant, client, behaviour
    """))


def downgrade() -> None:
    op.drop_index("ix_usage_client_days_tenant", table_name="usage_client_days")
    op.drop_table("usage_client_days")
    op.drop_table("usage_client_state")
