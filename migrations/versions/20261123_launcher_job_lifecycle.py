"""job lifecycle: owner, lease, exit code; release jobs whose id holds '/'

Revision ID: launcher_lifecycle
Revises: perf_ingest_seq
Create Date: 2026-11-23 12:00:00

Ids containing '/' are refused from now on (no route could address them, so
such a job held its servers forever). Any such job left queued or placed is
cancelled here and its servers are released.
"""

from alembic import op
import sqlalchemy as sa


revision = 'launcher_lifecycle'
down_revision = 'perf_ingest_seq'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(64), nullable=True))
        batch_op.add_column(sa.Column('lease_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('exit_code', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('end_reason', sa.Text(), nullable=True))
    jobs = sa.table(
        'jobs',
        sa.column('job_id', sa.String),
        sa.column('state', sa.String),
        sa.column('completed_at', sa.DateTime(timezone=True)),
        sa.column('end_reason', sa.Text),
    )
    assignments = sa.table('server_assignments', sa.column('job_id', sa.String))
    stuck = sa.select(jobs.c.job_id).where(
        jobs.c.job_id.contains('/'), jobs.c.state.in_(['queued', 'placed'])
    )
    op.execute(sa.delete(assignments).where(assignments.c.job_id.in_(stuck)))
    op.execute(
        sa.update(jobs)
        .where(jobs.c.job_id.contains('/'), jobs.c.state.in_(['queued', 'placed']))
        .values(state='cancelled', completed_at=sa.func.now(), end_reason='unaddressable job id')
    )


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('end_reason')
        batch_op.drop_column('exit_code')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('lease_s')
        batch_op.drop_column('owner')
