"""Bounded state: what the leader deletes, and what it keeps for audit and replay.

Run from the worker's tick (leader only, so fenced like every worker write), at
most once per `interval_s`, each table in short batches:

- decisions older than `decisions_s` (the log stays gap-free from its oldest
  kept seq; consumers that fall further behind resume from there);
- traffic reports already consumed (`ord` at or below the worker's cursor) and
  older than `reports_s`; reports not yet consumed are never deleted;
- idempotency keys of traffic batches older than `idempotency_s` (a retry after
  that window is stored again);
- published outbox rows older than `outbox_s` (unpublished rows are kept);
- dead letters older than `dead_letters_s`;
- ended jobs (completed, failed, cancelled) that ended more than `jobs_s` ago,
  with their dependent rows (prediction row, any server assignment left); the
  decisions naming them follow the decisions window. Queued and placed jobs
  are never deleted, whatever their age. A `job_id` whose row is gone can be
  submitted again as a new job;
- prediction rows whose job no longer exists.

Predictor state is not a replay log: each placed job has one `predictions` row
(its predictor summary and accounting), overwritten in place, so a new leader
reads one row per job and never the report history.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, func, select

from app.engine.job import JobState

from . import tables as t
from .repository import Store, utcnow

log = logging.getLogger("lightpath.retention")

CURSOR = "traffic_cursor"


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    decisions_s: float = 7 * 86400.0
    reports_s: float = 86400.0
    idempotency_s: float = 86400.0
    outbox_s: float = 3600.0
    dead_letters_s: float = 7 * 86400.0
    jobs_s: float = 30 * 86400.0
    batch: int = 5000  # rows per delete statement (one short transaction each)
    max_batches: int = 20  # per table per run: a backlog is worked off over runs


def _ago(seconds: float) -> dt.datetime:
    return utcnow() - dt.timedelta(seconds=seconds)


class Retention:
    def __init__(self, store: Store, policy: RetentionPolicy) -> None:
        self.store = store
        self.policy = policy

    def run(self) -> dict[str, int]:
        """Delete what is past its window; returns rows deleted per table."""
        p = self.policy
        d, r, b, o, x = t.decisions, t.traffic_reports, t.traffic_batches, t.outbox, t.dead_letters
        deleted = {
            "decisions": self._drain(d, d.c.seq, d.c.at < _ago(p.decisions_s)),
            "traffic_reports": self._drain(
                r,
                r.c.seq,
                r.c.received_at < _ago(p.reports_s),
                r.c.ord.is_not(None),
                r.c.ord <= self._cursor(),
            ),
            "traffic_batches": self._drain(b, b.c.key, b.c.received_at < _ago(p.idempotency_s)),
            "outbox": self._drain(o, o.c.id, o.c.published_at < _ago(p.outbox_s)),
            "dead_letters": self._drain(x, x.c.ord, x.c.at < _ago(p.dead_letters_s)),
            "jobs": self._drain_jobs(),
            "predictions": self._drain(
                t.predictions,
                t.predictions.c.job_id,
                t.predictions.c.job_id.not_in(select(t.jobs.c.job_id).scalar_subquery()),
            ),
        }
        if any(deleted.values()):
            log.info("retention deleted rows", extra=deleted)
        return deleted

    def _cursor(self) -> int:
        with self.store.read_engine.connect() as conn:
            value = conn.execute(
                select(t.counters.c.value).where(t.counters.c.name == CURSOR)
            ).scalar()
        return int(value or 0)

    def _drain(self, table: Any, key: Any, *where: Any) -> int:
        total = 0
        for _ in range(self.policy.max_batches):
            with self.store.write_engine.begin() as conn:
                n = _delete_batch(conn, table, key, where, self.policy.batch)
            total += n
            if n < self.policy.batch:
                break
        return total

    def _drain_jobs(self) -> int:
        """Ended jobs past their window, each batch with its dependent rows."""
        j = t.jobs
        ended = [s.value for s in JobState if s.ended]
        total = 0
        for _ in range(self.policy.max_batches):
            with self.store.write_engine.begin() as conn:
                ids = list(
                    conn.execute(
                        select(j.c.job_id)
                        .where(j.c.state.in_(ended), j.c.completed_at < _ago(self.policy.jobs_s))
                        .order_by(j.c.completed_at)
                        .limit(self.policy.batch)
                    ).scalars()
                )
                if ids:
                    conn.execute(delete(t.predictions).where(t.predictions.c.job_id.in_(ids)))
                    conn.execute(
                        delete(t.server_assignments).where(t.server_assignments.c.job_id.in_(ids))
                    )
                    # the state is checked again: a row is deleted only while it is ended
                    conn.execute(delete(j).where(j.c.job_id.in_(ids), j.c.state.in_(ended)))
            total += len(ids)
            if len(ids) < self.policy.batch:
                break
        return total


def _delete_batch(conn: Connection, table: Any, key: Any, where: Any, limit: int) -> int:
    ids = select(key).where(*where).order_by(key).limit(limit)
    return int(conn.execute(delete(table).where(key.in_(ids.scalar_subquery()))).rowcount)


def table_sizes(store: Store) -> dict[str, int]:
    """Row counts of the tables that grow (for the soak bench and operators)."""
    out = {}
    with store.read_engine.connect() as conn:
        for table in (
            t.jobs,
            t.decisions,
            t.traffic_reports,
            t.traffic_batches,
            t.outbox,
            t.dead_letters,
            t.predictions,
        ):
            out[table.name] = int(
                conn.execute(select(func.count()).select_from(table)).scalar() or 0
            )
    return out
