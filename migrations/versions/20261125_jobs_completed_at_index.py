"""an index on jobs.completed_at for the retention of ended jobs

Revision ID: jobs_completed_at
Revises: reliability_fencing
Create Date: 2026-11-25 12:00:00

Retention deletes ended jobs older than `LIGHTPATH_RETAIN_JOBS_S` oldest first;
without an index it read every ended job (30 days of them) on each pass. The
index is partial: only ended jobs have `completed_at`.
"""

import sqlalchemy as sa
from alembic import op

revision = "jobs_completed_at"
down_revision = "reliability_fencing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_completed_at",
        "jobs",
        ["completed_at"],
        postgresql_where=sa.text("completed_at IS NOT NULL"),
        sqlite_where=sa.text("completed_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_completed_at", table_name="jobs")
