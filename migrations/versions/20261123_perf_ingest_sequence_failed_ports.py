"""traffic reports numbered by a sequence and by the worker; failed ports by an index

Ingest took the `report_seq` counter row and held it to commit, serialising
every POST /v1/traffic. `traffic_reports.seq` now comes from a sequence
(SQLite: the rowid) and the worker numbers committed reports gap-free in
`ord`, the unit of its cursor; rows already stored keep ord = seq, so the
stored cursor stays valid. A partial index finds the failed confirmed ports.

Revision ID: perf_ingest_seq
Revises: 0004
Create Date: 2026-11-23 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "perf_ingest_seq"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    postgres = bind.dialect.name == "postgresql"
    if postgres:
        op.execute("CREATE SEQUENCE traffic_reports_seq_seq OWNED BY traffic_reports.seq")
        op.execute(
            "SELECT setval('traffic_reports_seq_seq', GREATEST("
            "(SELECT COALESCE(max(value), 0) FROM counters WHERE name = 'report_seq'),"
            "(SELECT COALESCE(max(seq), 0) FROM traffic_reports)) + 1, false)"
        )
        op.execute(
            "ALTER TABLE traffic_reports ALTER COLUMN seq "
            "SET DEFAULT nextval('traffic_reports_seq_seq')"
        )
        op.add_column("traffic_reports", sa.Column("ord", sa.BigInteger(), nullable=True))
    else:
        # INTEGER PRIMARY KEY makes `seq` the rowid: SQLite assigns it on insert
        with op.batch_alter_table("traffic_reports", recreate="always") as batch_op:
            batch_op.alter_column(
                "seq", existing_type=sa.BigInteger(), type_=sa.Integer(), autoincrement=True
            )
            batch_op.add_column(sa.Column("ord", sa.BigInteger(), nullable=True))
    op.execute("UPDATE traffic_reports SET ord = seq")
    op.execute(
        "INSERT INTO counters (name, value) "
        "SELECT 'report_ord', COALESCE(max(seq), 0) FROM traffic_reports "
        "WHERE NOT EXISTS (SELECT 1 FROM counters WHERE name = 'report_ord')"
    )
    op.create_index("uq_traffic_reports_ord", "traffic_reports", ["ord"], unique=True)
    op.create_index(
        "ix_traffic_reports_unnumbered",
        "traffic_reports",
        ["seq"],
        postgresql_where=sa.text("ord IS NULL"),
        sqlite_where=sa.text("ord IS NULL"),
    )
    op.create_index(
        "ix_confirmed_ports_failed",
        "confirmed_ports",
        ["oxc_id", "port"],
        postgresql_where=sa.text("failed"),
        sqlite_where=sa.text("failed = 1"),
    )


def downgrade() -> None:
    op.drop_index("ix_confirmed_ports_failed", table_name="confirmed_ports")
    op.drop_index("ix_traffic_reports_unnumbered", table_name="traffic_reports")
    op.drop_index("uq_traffic_reports_ord", table_name="traffic_reports")
    op.execute("DELETE FROM counters WHERE name = 'report_ord'")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE traffic_reports ALTER COLUMN seq DROP DEFAULT")
        op.drop_column("traffic_reports", "ord")
        op.execute("DROP SEQUENCE traffic_reports_seq_seq")
    else:
        with op.batch_alter_table("traffic_reports", recreate="always") as batch_op:
            batch_op.drop_column("ord")
            batch_op.alter_column("seq", existing_type=sa.Integer(), type_=sa.BigInteger())
