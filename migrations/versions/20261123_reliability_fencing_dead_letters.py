"""fencing row, decision tokens, dead-lettered reports, idempotency body hashes

Revision ID: reliability_fencing
Revises: launcher_lifecycle
Create Date: 2026-11-23 05:00:00

- `fencing`: the newest leader token the database has seen; every worker
  transaction compares its lease token with it (a deposed leader is refused).
- `decisions.token`: the leader token that wrote each decision (audit).
- `dead_letters`: traffic reports the engine could not use, with the reason.
- `traffic_batches.body_hash`: an Idempotency-Key reused with another body is refused.
"""

from alembic import op
import sqlalchemy as sa


revision = 'reliability_fencing'
down_revision = 'launcher_lifecycle'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'fencing',
        sa.Column('name', sa.String(64), primary_key=True),
        sa.Column('token', sa.BigInteger(), nullable=False),
    )
    op.execute("INSERT INTO fencing (name, token) VALUES ('worker', 0)")
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('traffic_batches', schema=None) as batch_op:
        batch_op.add_column(sa.Column('body_hash', sa.String(64), nullable=True))
    op.create_table(
        'dead_letters',
        sa.Column('ord', sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column('job_id', sa.String(200), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('report', sa.JSON(), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('dead_letters')
    with op.batch_alter_table('traffic_batches', schema=None) as batch_op:
        batch_op.drop_column('body_hash')
    with op.batch_alter_table('decisions', schema=None) as batch_op:
        batch_op.drop_column('token')
    op.drop_table('fencing')
