"""Traffic reports (durable, numbered) and the cycle predictor's per-job summaries.

Reports get a gap-free `seq` from a counter row; the worker consumes them in
order and stores its cursor in the same transaction as the predictions and
decisions it derived, so each report takes effect exactly once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from app.engine.cross_connects import CrossConnect

from . import tables as t
from .fabric_repository import replace_desired
from .repository import NewDecision, Store, add_outbox, append_decisions, next_counter, utcnow

CURSOR = "traffic_cursor"


@dataclass(frozen=True, slots=True)
class ReportRow:
    seq: int
    job_id: str | None
    phase_started_at: float
    demands: list[list[Any]]  # [src, dst, bytes]
    attributed: list[str] | None = None  # jobs it fed when consumed (None: not yet)


@dataclass(frozen=True, slots=True)
class PredictionRow:
    job_id: str
    algorithm: str
    state: dict[str, Any]
    hits: int
    misses: int
    exposed_reconfig_s: float


class TrafficRepository:
    def __init__(self, store: Store) -> None:
        self.store = store

    def ingest(
        self, reports: Sequence[dict[str, Any]], idempotency_key: str | None = None
    ) -> tuple[int, int]:
        """Store a batch of validated reports and their event; returns (count, last seq).

        With an `idempotency_key` already seen, nothing is stored and the first
        answer is returned (a client retrying after a lost answer).
        """
        if idempotency_key is not None:
            seen = self._batch(idempotency_key)
            if seen is not None:
                return seen
        now = utcnow()
        try:
            return self._ingest(reports, idempotency_key, now)
        except IntegrityError:
            seen = self._batch(idempotency_key) if idempotency_key else None
            if seen is None:
                raise
            return seen

    def _batch(self, key: str) -> tuple[int, int] | None:
        with self.store.read_engine.connect() as conn:
            row = conn.execute(
                select(t.traffic_batches).where(t.traffic_batches.c.key == key)
            ).first()
        return (int(row.accepted), int(row.last_seq)) if row else None

    def _ingest(
        self, reports: Sequence[dict[str, Any]], key: str | None, now: Any
    ) -> tuple[int, int]:
        with self.store.write_engine.begin() as conn:
            first = next_counter(conn, "report_seq", len(reports))
            conn.execute(
                insert(t.traffic_reports),
                [
                    {
                        "seq": first + i,
                        "job_id": r.get("job_id"),
                        "phase_started_at": r["phase_started_at"],
                        "demands": r["demands"],
                        "received_at": now,
                    }
                    for i, r in enumerate(reports)
                ],
            )
            last = first + len(reports) - 1
            add_outbox(conn, "traffic", {"type": "ReportTraffic", "last_seq": last}, now)
            if key is not None:
                conn.execute(
                    insert(t.traffic_batches).values(
                        key=key, accepted=len(reports), last_seq=last, received_at=now
                    )
                )
        return len(reports), last

    def cursor(self) -> int:
        with self.store.read_engine.connect() as conn:
            value = conn.execute(
                select(t.counters.c.value).where(t.counters.c.name == CURSOR)
            ).scalar()
        return int(value or 0)

    def reports_after(self, seq: int, limit: int = 2000) -> list[ReportRow]:
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(
                select(t.traffic_reports)
                .where(t.traffic_reports.c.seq > seq)
                .order_by(t.traffic_reports.c.seq)
                .limit(limit)
            ).all()
        return [
            ReportRow(r.seq, r.job_id, r.phase_started_at, r.demands, r.attributed) for r in rows
        ]

    def reports_of_jobs(self, job_ids: Sequence[str], up_to: int) -> list[ReportRow]:
        """Reports already consumed that name one of `job_ids` or none (for replay)."""
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(
                select(t.traffic_reports)
                .where(t.traffic_reports.c.seq <= up_to)
                .where(
                    t.traffic_reports.c.job_id.in_(list(job_ids))
                    | t.traffic_reports.c.job_id.is_(None)
                )
                .order_by(t.traffic_reports.c.seq)
            ).all()
        return [
            ReportRow(r.seq, r.job_id, r.phase_started_at, r.demands, r.attributed) for r in rows
        ]

    def commit_predictions(
        self,
        cursor: int,
        predictions: Sequence[PredictionRow],
        decisions: Sequence[NewDecision],
        desired: Sequence[CrossConnect] | None = None,
        attributed: Mapping[int, tuple[str, ...]] | None = None,
    ) -> list[int]:
        """Advance the cursor, upsert summaries, rewire, log decisions: one transaction."""
        now = utcnow()
        with self.store.write_engine.begin() as conn:
            moved = conn.execute(
                update(t.counters)
                .where(t.counters.c.name == CURSOR)
                .where(t.counters.c.value < cursor)
                .values(value=cursor)
            ).rowcount
            if not moved:
                exists = conn.execute(
                    select(t.counters.c.value).where(t.counters.c.name == CURSOR)
                ).scalar()
                if exists is None:
                    conn.execute(insert(t.counters).values(name=CURSOR, value=cursor))
                elif int(exists) >= cursor:
                    return []  # already applied (a duplicate pass): nothing twice
            for p in predictions:
                values = {
                    "algorithm": p.algorithm,
                    "state": p.state,
                    "hits": p.hits,
                    "misses": p.misses,
                    "exposed_reconfig_s": p.exposed_reconfig_s,
                    "updated_at": now,
                }
                changed = conn.execute(
                    update(t.predictions).where(t.predictions.c.job_id == p.job_id).values(**values)
                ).rowcount
                if not changed:
                    conn.execute(insert(t.predictions).values(job_id=p.job_id, **values))
            if desired is not None:
                replace_desired(conn, desired)
            by_jobs: dict[tuple[str, ...], list[int]] = defaultdict(list)
            for seq, jobs in (attributed or {}).items():
                by_jobs[jobs].append(seq)
            for jobs, seqs in by_jobs.items():
                conn.execute(
                    update(t.traffic_reports)
                    .where(t.traffic_reports.c.seq.in_(seqs))
                    .values(attributed=list(jobs))
                )
            return append_decisions(conn, decisions, now)

    def prediction(self, job_id: str) -> PredictionRow | None:
        with self.store.read_engine.connect() as conn:
            r = conn.execute(select(t.predictions).where(t.predictions.c.job_id == job_id)).first()
        if r is None:
            return None
        return PredictionRow(r.job_id, r.algorithm, r.state, r.hits, r.misses, r.exposed_reconfig_s)

    def count_reports(self) -> int:
        with self.store.read_engine.connect() as conn:
            value = conn.execute(
                select(t.counters.c.value).where(t.counters.c.name == "report_seq")
            ).scalar()
        return int(value or 0)
