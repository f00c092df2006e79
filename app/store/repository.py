"""Reading and writing Lightpath's durable state; every SQL statement lives here.

One method is one transaction. Rows are mapped to engine values (`app.engine`)
and to plain records the API renders; nothing above this module sees SQL.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    bindparam,
    delete,
    func,
    insert,
    literal,
    null,
    select,
    text,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from app.engine.job import JobState, Placement
from app.engine.job_lease import LEASE_EXPIRED, JobLease

from . import tables as t
from .database import relaxed_commit
from .mapping import job_from_body, placement_to_json

log = logging.getLogger("lightpath.store")
T = TypeVar("T")


class DatabaseNotReady(Exception):
    """The database answers but cannot serve this build: another schema revision
    (`lightpath migrate`), or read-only (a standby after a failover). The message is
    what readiness reports."""


def _job_row(conn: Connection, job_id: str) -> Row[Any] | None:
    """The job's row, read on `conn` (inside a write's transaction: what it wrote, and
    no second connection to fail after the commit, answering 503 for a done change)."""
    return conn.execute(select(t.jobs).where(t.jobs.c.job_id == job_id)).first()


def _no_such_table(exc: Exception) -> bool:
    """SQLite's OperationalError and PostgreSQL's UndefinedTable for a missing table."""
    text_ = str(getattr(exc, "orig", exc)).lower()
    return "no such table" in text_ or "does not exist" in text_


class StoreError(Exception):
    """A storage operation failed for a reason other than the caller's input."""


class ConcurrentChange(StoreError):
    """Another writer changed a row this transaction relied on; retry with fresh state."""


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job row as the API shows it."""

    job_id: str
    state: str
    body: dict[str, Any]
    body_hash: str
    submitted_order: int
    examined: bool
    queue_reason: str | None
    placement: dict[str, Any] | None
    collective: dict[str, Any] | None
    submitted_at: dt.datetime
    placed_at: dt.datetime | None
    completed_at: dt.datetime | None
    owner: str | None = None
    lease_s: float | None = None
    heartbeat_at: dt.datetime | None = None
    exit_code: int | None = None
    end_reason: str | None = None


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    seq: int
    at: dt.datetime
    kind: str
    job_id: str | None
    reason: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NewDecision:
    """A decision to append to the log; the store gives it its seq."""

    kind: str
    job_id: str | None
    reason: str
    payload: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the scheduler needs to decide: the queue and who holds which server."""

    queued: tuple[Any, ...]  # engine Jobs in arrival order
    used: dict[str, str]  # server id -> job id
    placed: dict[str, dict[str, Any]]  # job id -> placement JSON of placed jobs
    unexamined: frozenset[str] = frozenset()  # queued jobs no admission pass has seen
    # switch (a ToR, or a pod for its spine) -> INC Gb/s held
    aggregator_used_gbps: dict[str, float] = field(default_factory=dict)
    # server -> epoch seconds its placed job is expected to end (jobs with walltime_s only)
    busy_until: dict[str, float] = field(default_factory=dict)
    leased: frozenset[str] = frozenset()  # queued jobs that hold a heartbeat lease
    # pod -> uplinks placed jobs' isolated slices hold (from their `network` views)
    uplinks_held: dict[str, float] = field(default_factory=dict)
    # OXC -> ports the switches report failed (read only when some job is queued)
    failed_ports: dict[str, frozenset[int]] = field(default_factory=dict)


@dataclass(slots=True)
class PlacedFacts:
    """What scheduling needs of one placed job, decoded once."""

    placement: dict[str, Any]  # the stored placement JSON (fixed once placed)
    servers: tuple[str, ...]
    ends: float | None  # epoch seconds its walltime runs out (None: no walltime)
    grants: dict[str, float]  # ToR -> INC Gb/s held, from its stored collective
    leased: bool = False  # the job holds a heartbeat lease
    # pod -> uplinks its isolated slice holds, from its stored `network` view
    ports: dict[str, float] = field(default_factory=dict)


def ports_of(collective: dict[str, Any] | None) -> dict[str, float]:
    """Uplinks per pod a job's isolated slice holds (its stored `network.pod_ports`)."""
    network = (collective or {}).get("network") or {}
    if network.get("mode") != "isolated":
        return {}
    return {pod: float(n) for pod, n in (network.get("pod_ports") or {}).items()}


def grants_of(collective: dict[str, Any] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for grant in (collective or {}).get("aggregator_grants", []):
        out[grant["tor"]] = out.get(grant["tor"], 0.0) + float(grant["gbps"])
    return out


class PlacedCache:
    """The worker's memory of placed jobs for scheduling, updated from what changed.

    `Store.load_snapshot` adds the jobs placed since its last call and drops
    the ones that ended; the fabric pass reports collectives it wrote
    (`set_collective`) so aggregator totals follow without re-reading rows.
    Server holders and expected ends are kept as running totals, so a
    snapshot costs copies, not a walk over every placed job. Thread-safe: the
    fabric pass runs on its own thread.
    """

    def __init__(self) -> None:
        self.facts: dict[str, PlacedFacts] = {}
        self.used: dict[str, str] = {}  # server -> job
        self.busy_until: dict[str, float] = {}  # server -> expected end
        self.warm = False  # loaded from the database at least once
        self._leased = 0  # placed jobs holding a heartbeat lease
        self._lock = threading.Lock()

    def update(self, placed_ids: set[str], rows: Iterable[Any]) -> None:
        with self._lock:
            for gone in [j for j in self.facts if j not in placed_ids]:
                facts = self.facts.pop(gone)
                self._leased -= facts.leased
                for server in facts.servers:
                    if self.used.get(server) == gone:
                        del self.used[server]
                        self.busy_until.pop(server, None)
            for r in rows:
                walltime = (r.body or {}).get("walltime_s")
                self._add(
                    r.job_id,
                    r.placement,
                    r.placed_at,
                    walltime,
                    r.collective,
                    r.lease_s is not None,
                )
            self.warm = True

    def add(
        self,
        job_id: str,
        placement: dict[str, Any],
        placed_at: dt.datetime,
        walltime_s: float | None,
        leased: bool,
        inc_use: dict[str, float] | None = None,
    ) -> None:
        """A job this process just placed (committed): no need to read it back.

        `inc_use` (ToR -> Gb/s): the aggregation its first fabric pass is expected to
        grant, counted until that pass reports the real grants (`set_collective`).
        """
        with self._lock:
            self._add(job_id, placement, placed_at, walltime_s, None, leased)
            if inc_use:
                self.facts[job_id].grants = dict(inc_use)

    def _add(
        self,
        job_id: str,
        placement: dict[str, Any] | None,
        placed_at: dt.datetime | None,
        walltime_s: float | None,
        collective: dict[str, Any] | None,
        leased: bool,
    ) -> None:
        placement = placement or {"units": []}
        servers = tuple(u["server"] for u in placement["units"])
        ends = None
        if walltime_s is not None and placed_at is not None:
            ends = as_utc(placed_at).timestamp() + float(walltime_s)  # type: ignore[union-attr]
        grants = grants_of(collective)
        previous = self.facts.get(job_id)
        self._leased += leased - (previous.leased if previous is not None else False)
        self.facts[job_id] = PlacedFacts(
            placement, servers, ends, grants, leased, ports_of(collective)
        )
        self.used.update(dict.fromkeys(servers, job_id))
        if ends is not None:
            self.busy_until.update(dict.fromkeys(servers, ends))

    def any_leased(self) -> bool:
        return self._leased > 0

    def clear(self) -> None:
        with self._lock:
            self.facts.clear()
            self.used.clear()
            self.busy_until.clear()
            self._leased = 0
            self.warm = False

    def set_collective(self, job_id: str, collective: dict[str, Any] | None) -> None:
        with self._lock:
            facts = self.facts.get(job_id)
            if facts is not None:
                facts.grants = grants_of(collective)
                facts.ports = ports_of(collective)

    def view(self) -> PlacedView:
        """Server holders, placements, aggregator Gb/s per ToR, expected ends, uplinks
        held per pod.

        Holders and ends are the cache's own dicts, not copies: read-only, and
        valid until the next `update`/`add` (both made by the scheduling thread).
        """
        with self._lock:
            aggregators: dict[str, float] = {}
            uplinks: dict[str, float] = {}
            for facts in self.facts.values():
                for tor, gbps in facts.grants.items():
                    aggregators[tor] = aggregators.get(tor, 0.0) + gbps
                for pod, n in facts.ports.items():
                    uplinks[pod] = uplinks.get(pod, 0.0) + n
            placed = {j: f.placement for j, f in self.facts.items()}
            return PlacedView(self.used, placed, aggregators, self.busy_until, uplinks)


@dataclass(frozen=True, slots=True)
class PlacedView:
    """`PlacedCache.view`: what a snapshot takes from the worker's memory."""

    used: dict[str, str]
    placed: dict[str, dict[str, Any]]
    aggregators: dict[str, float]
    busy_until: dict[str, float]
    uplinks_held: dict[str, float]


@dataclass(frozen=True, slots=True)
class Admitted:
    """What `record_admission` wrote: placed jobs with their decision seqs, and jobs that left."""

    placed: tuple[str, ...]
    seqs: tuple[int, ...]
    left: tuple[str, ...] = ()  # chosen, but no longer queued when written: not placed


def chunks(items: Sequence[T], size: int = 1000) -> Iterator[Sequence[T]]:
    """`items` in slices of at most `size` (bound parameters per statement stay bounded)."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime | None) -> dt.datetime | None:
    """SQLite hands back naive datetimes; everything we store is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _job_record(row: Any) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        state=row.state,
        body=row.body,
        body_hash=row.body_hash,
        submitted_order=row.submitted_order,
        examined=row.examined,
        queue_reason=row.queue_reason,
        placement=row.placement,
        collective=row.collective,
        submitted_at=as_utc(row.submitted_at),  # type: ignore[arg-type]
        placed_at=as_utc(row.placed_at),
        completed_at=as_utc(row.completed_at),
        owner=row.owner,
        lease_s=row.lease_s,
        heartbeat_at=as_utc(row.heartbeat_at),
        exit_code=row.exit_code,
        end_reason=row.end_reason,
    )


def next_counter(conn: Connection, name: str, n: int = 1) -> int:
    """Reserve `n` values of counter `name`; returns the first. Locks the counter row."""
    result = conn.execute(
        update(t.counters)
        .where(t.counters.c.name == name)
        .values(value=t.counters.c.value + n)
        .returning(t.counters.c.value)
    ).scalar_one_or_none()
    if result is None:
        try:
            with conn.begin_nested():
                conn.execute(insert(t.counters).values(name=name, value=n))
        except IntegrityError:
            return next_counter(conn, name, n)
        return 1
    return int(result) - n + 1


def append_decisions(conn: Connection, decisions: Sequence[NewDecision]) -> list[int]:
    """Append to the decision log inside the caller's transaction; returns the seqs.

    `at` is the time the seq counter was locked: the lock orders writers, so `at`
    never goes back as `seq` goes up (the worker's and the fabric process's writers
    stamped the time their pass began, up to 104 ms out of order)."""
    if not decisions:
        return []
    first = next_counter(conn, "decision_seq", len(decisions))
    at = utcnow()
    token = conn.info.get("fence_token")  # the leader's, when a fence opened this transaction
    rows = [
        {
            "seq": first + i,
            "at": at,
            "kind": d.kind,
            "job_id": d.job_id,
            "reason": d.reason,
            "payload": d.payload,
            "token": token,
        }
        for i, d in enumerate(decisions)
    ]
    conn.execute(insert(t.decisions), rows)
    return [first + i for i in range(len(rows))]


def add_outbox(conn: Connection, topic: str, payload: dict[str, Any], now: dt.datetime) -> None:
    """Record an event for the relay to publish, in the caller's transaction."""
    conn.execute(insert(t.outbox).values(topic=topic, payload=payload, created_at=now))


class Store:
    """Repositories over one database: jobs, servers, the decision log, the outbox."""

    def __init__(self, write_engine: Engine, read_engine: Engine | None = None) -> None:
        self.write_engine = write_engine
        self.read_engine = read_engine or write_engine

    def dispose(self) -> None:
        shared = self.read_engine.pool is self.write_engine.pool  # read options over one pool
        self.write_engine.dispose()
        if not shared:
            self.read_engine.dispose()

    def ping(self) -> None:
        """Raise when the database cannot answer, holds another schema revision than
        this build's or refuses writes (`DatabaseNotReady`)."""
        with self.write_engine.connect() as conn:
            try:
                found = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except (OperationalError, ProgrammingError) as exc:
                if not _no_such_table(exc):
                    raise
                found = None
            # a PostgreSQL standby (or `default_transaction_read_only`) answers reads
            # and refuses every write: not ready
            read_only = (
                self.write_engine.dialect.name == "postgresql"
                and conn.execute(text("SELECT current_setting('transaction_read_only')")).scalar()
                == "on"
            )
        if found != t.SCHEMA_REVISION:
            what = f"at schema revision {found}" if found else "not migrated"
            raise DatabaseNotReady(
                f"database {what}, this build needs {t.SCHEMA_REVISION}: run `lightpath migrate`"
            )
        if read_only:
            raise DatabaseNotReady("database is read-only (a standby?): writes are refused")

    # --- jobs -------------------------------------------------------------

    def submit_job(
        self,
        job_id: str,
        body: dict[str, Any],
        body_hash: str,
        *,
        servers_needed: int,
        priority: int,
        deadline: float | None,
        owner: str | None = None,
        publish: Callable[[dict[str, Any]], None] | None = None,
    ) -> tuple[JobRecord, bool]:
        """Record a new queued job and its AdmitJob event; (existing, False) if the id exists.

        One transaction and no read on the common path (a new id): the insert
        itself finds an existing id, and the new row is answered from what was
        written.

        `publish`: send the event from here once committed (the worker wakes
        without waiting for the relay's thread and transaction). No outbox row
        is written for a sent event; one is written for the relay if sending
        fails. A crash between the commit and the send loses only the wake-up:
        the worker's tick reads the queued row anyway.
        """
        now = utcnow()
        event = {"type": "AdmitJob", "job_id": job_id}
        try:
            with self.write_engine.begin() as conn:
                order = next_counter(conn, "job_order")
                conn.execute(
                    insert(t.jobs).values(
                        job_id=job_id,
                        submitted_order=order,
                        body=body,
                        body_hash=body_hash,
                        state=JobState.QUEUED.value,
                        servers_needed=servers_needed,
                        priority=priority,
                        deadline=deadline,
                        examined=False,
                        submitted_at=now,
                        owner=owner,
                        lease_s=body.get("lease_s"),
                    )
                )
                if publish is None:
                    add_outbox(conn, "jobs", event, now)
        except IntegrityError:
            existing = self.get_job(job_id)
            if existing is None:
                raise
            return existing, False
        if publish is not None:
            try:
                publish(event)
            except Exception as exc:  # the bus's errors say what failed; no traceback
                log.warning(
                    "AdmitJob not sent; left to the relay",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
                try:
                    with self.write_engine.begin() as conn:
                        add_outbox(conn, "jobs", event, now)
                except OperationalError as lost:
                    # the job is committed: only the wake-up is lost (see above)
                    log.warning(
                        "AdmitJob not kept for the relay; the worker's tick finds the job",
                        extra={"error": type(lost).__name__},
                    )
        record = JobRecord(
            job_id=job_id,
            state=JobState.QUEUED.value,
            body=body,
            body_hash=body_hash,
            submitted_order=order,
            examined=False,
            queue_reason=None,
            placement=None,
            collective=None,
            submitted_at=now,
            placed_at=None,
            completed_at=None,
            owner=owner,
            lease_s=body.get("lease_s"),
        )
        return record, True

    def get_job(self, job_id: str) -> JobRecord | None:
        with self.read_engine.connect() as conn:
            row = _job_row(conn, job_id)
        return _job_record(row) if row is not None else None

    def list_jobs(
        self, state: str | None = None, *, after_order: int = 0, limit: int = 100
    ) -> list[JobRecord]:
        query = select(t.jobs).where(t.jobs.c.submitted_order > after_order)
        if state is not None:
            query = query.where(t.jobs.c.state == state)
        query = query.order_by(t.jobs.c.submitted_order).limit(limit)
        with self.read_engine.connect() as conn:
            return [_job_record(r) for r in conn.execute(query)]

    def count_jobs_by_state(self) -> dict[str, int]:
        with self.read_engine.connect() as conn:
            rows = conn.execute(select(t.jobs.c.state, func.count()).group_by(t.jobs.c.state)).all()
        counts = {s.value: 0 for s in JobState}
        counts.update({state: int(n) for state, n in rows})
        return counts

    def complete_job(self, job_id: str) -> JobRecord | None:
        """Mark a placed job completed and free its servers; a second call changes nothing."""
        return self.end_job(job_id, JobState.COMPLETED, from_states=(JobState.PLACED,))

    def end_job(
        self,
        job_id: str,
        state: JobState,
        *,
        from_states: Sequence[JobState] = (JobState.QUEUED, JobState.PLACED),
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> JobRecord | None:
        """Move a job in `from_states` to the ended `state`, freeing its servers, all at once.

        Ports and aggregators follow: the fabric pass re-plans from the placed
        jobs and the snapshot counts aggregators of placed jobs only. A job in
        any other state is returned unchanged (the caller compares states), so
        every ending is idempotent; None for an unknown id.
        """
        now = utcnow()
        with self.write_engine.begin() as conn:
            changed = conn.execute(
                update(t.jobs)
                .where(t.jobs.c.job_id == job_id)
                .where(t.jobs.c.state.in_([s.value for s in from_states]))
                .values(state=state.value, completed_at=now, exit_code=exit_code, end_reason=reason)
            ).rowcount
            if changed:
                conn.execute(
                    delete(t.server_assignments).where(t.server_assignments.c.job_id == job_id)
                )
                add_outbox(conn, "jobs", {"type": "CompleteJob", "job_id": job_id}, now)
            row = _job_row(conn, job_id)
        return _job_record(row) if row is not None else None

    def heartbeat_job(self, job_id: str) -> JobRecord | None:
        """Renew the lease of a queued or placed job; an ended job is returned unchanged."""
        with self.write_engine.begin() as conn:
            conn.execute(
                update(t.jobs)
                .where(t.jobs.c.job_id == job_id)
                .where(t.jobs.c.state.in_([JobState.QUEUED.value, JobState.PLACED.value]))
                .values(heartbeat_at=utcnow())
            )
            row = _job_row(conn, job_id)
        return _job_record(row) if row is not None else None

    def server_holders(self) -> dict[str, list[str]]:
        """Job -> the servers it holds (sorted), every job that holds any."""
        query = select(t.server_assignments.c.server_id, t.server_assignments.c.job_id)
        out: dict[str, list[str]] = {}
        with self.read_engine.connect() as conn:
            for server_id, job_id in conn.execute(query):
                out.setdefault(job_id, []).append(server_id)
        return {job_id: sorted(servers) for job_id, servers in out.items()}

    def leased_jobs(self) -> list[JobLease]:
        """Placed jobs that asked for heartbeats, as the lease rule sees them."""
        query = select(
            t.jobs.c.job_id, t.jobs.c.lease_s, t.jobs.c.placed_at, t.jobs.c.heartbeat_at
        ).where(t.jobs.c.state == JobState.PLACED.value, t.jobs.c.lease_s.is_not(None))
        with self.read_engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            JobLease(
                r.job_id,
                float(r.lease_s),
                as_utc(r.placed_at).timestamp(),  # type: ignore[union-attr]
                as_utc(r.heartbeat_at).timestamp() if r.heartbeat_at is not None else None,  # type: ignore[union-attr]
            )
            for r in rows
        ]

    def grant_leases(self, since: dt.datetime) -> list[str]:
        """A new leader's grace: every placed job with a lease last heard from before
        `since` counts as heard from then (a launcher's heartbeats may have been refused
        while no leader ran). Returns the jobs whose lease moved."""
        placed = (t.jobs.c.state == JobState.PLACED.value, t.jobs.c.lease_s.is_not(None))
        silent = (t.jobs.c.placed_at < since) & (
            t.jobs.c.heartbeat_at.is_(None) | (t.jobs.c.heartbeat_at < since)
        )
        with self.write_engine.begin() as conn:
            ids = [r.job_id for r in conn.execute(select(t.jobs.c.job_id).where(*placed, silent))]
            if ids:
                conn.execute(
                    update(t.jobs)
                    .where(t.jobs.c.job_id.in_(ids), *placed, silent)
                    .values(heartbeat_at=since)
                )
        return ids

    def expire_lease(self, lease: JobLease) -> bool:
        """Fail a job whose lease ran out, unless a heartbeat landed since `lease` was read."""
        now = utcnow()
        beat = (
            dt.datetime.fromtimestamp(lease.heartbeat_at, dt.UTC)
            if lease.heartbeat_at is not None
            else None
        )
        with self.write_engine.begin() as conn:
            row = conn.execute(
                select(t.jobs.c.heartbeat_at).where(
                    t.jobs.c.job_id == lease.job_id, t.jobs.c.state == JobState.PLACED.value
                )
            ).first()
            if row is None or as_utc(row.heartbeat_at) != beat:
                return False
            conn.execute(
                update(t.jobs)
                .where(t.jobs.c.job_id == lease.job_id)
                .where(t.jobs.c.state == JobState.PLACED.value)
                .values(state=JobState.FAILED.value, completed_at=now, end_reason=LEASE_EXPIRED)
            )
            conn.execute(
                delete(t.server_assignments).where(t.server_assignments.c.job_id == lease.job_id)
            )
            add_outbox(conn, "jobs", {"type": "CompleteJob", "job_id": lease.job_id}, now)
        return True

    # --- scheduling -------------------------------------------------------

    def load_snapshot(self, cache: PlacedCache | None = None) -> Snapshot:
        """The queue (arrival order) and server holders, read in one transaction.

        With a `cache` (the worker's memory of placed jobs) only the ids of
        placed jobs are read, and the rows of jobs placed since the last call:
        the cost follows the change, not the number of jobs running. Without
        one every placed row is read and decoded.
        """
        cache = cache if cache is not None else PlacedCache()
        placed_count = (
            select(func.count())
            .select_from(t.jobs)
            .where(t.jobs.c.state == JobState.PLACED.value)
            .scalar_subquery()
        )
        with self.read_engine.connect() as conn:
            # the queue, and how many jobs are placed (one statement: a union keeps
            # the count when the queue is empty)
            current = conn.execute(
                select(
                    t.jobs.c.job_id,
                    t.jobs.c.body,
                    t.jobs.c.submitted_order,
                    t.jobs.c.examined,
                    t.jobs.c.lease_s,
                )
                .where(t.jobs.c.state == JobState.QUEUED.value)
                .union_all(select(null(), null(), placed_count, literal(False), null()))
                .order_by("submitted_order")
            ).all()
            count_row = next(r for r in current if r.job_id is None)
            queued_rows = [r for r in current if r.job_id is not None]
            # every placement is the leader's own and enters the cache when made, so
            # an equal count means nothing ended: the ids are read only when it differs
            if cache.warm and count_row.submitted_order == len(cache.facts):
                placed_ids = set(cache.facts)
            else:
                placed_ids = set(
                    conn.execute(
                        select(t.jobs.c.job_id).where(t.jobs.c.state == JobState.PLACED.value)
                    ).scalars()
                )
            fresh = placed_ids.difference(cache.facts)
            rows: Sequence[Any] = []
            if fresh:
                rows = conn.execute(
                    select(
                        t.jobs.c.job_id,
                        t.jobs.c.placement,
                        t.jobs.c.collective,
                        t.jobs.c.placed_at,
                        t.jobs.c.body,
                        t.jobs.c.lease_s,
                    ).where(
                        t.jobs.c.state == JobState.PLACED.value, t.jobs.c.job_id.in_(sorted(fresh))
                    )
                ).all()
            failed: dict[str, set[int]] = {}
            if queued_rows:  # what placement must not count on (by the partial index)
                for oxc_id, port in conn.execute(
                    select(t.confirmed_ports.c.oxc_id, t.confirmed_ports.c.port).where(
                        t.confirmed_ports.c.failed == true()
                    )
                ):
                    failed.setdefault(oxc_id, set()).add(port)
        cache.update(placed_ids, rows)
        view = cache.view()
        queued = tuple(job_from_body(r.job_id, r.body, r.submitted_order) for r in queued_rows)
        unexamined = frozenset(r.job_id for r in queued_rows if not r.examined)
        leased = frozenset(r.job_id for r in queued_rows if r.lease_s is not None)
        return Snapshot(
            queued,
            view.used,
            view.placed,
            unexamined,
            view.aggregators,
            view.busy_until,
            leased,
            view.uplinks_held,
            {o: frozenset(ports) for o, ports in failed.items()},
        )

    def record_admission(
        self,
        placements: Iterable[Placement],
        *,
        examined: Iterable[str],
        queue_reasons: dict[str, str],
        reason: str,
        collectives: dict[str, dict[str, Any]] | None = None,
        now: dt.datetime | None = None,
    ) -> Admitted:
        """Place jobs, hold their servers and log the decisions in one short transaction.

        Set-based: one locking read of the jobs to place, one executemany per
        kind of change, so the transaction's length does not grow with the
        queue. A job that left the queue meanwhile (completed, cancelled) is
        not placed and is named in `Admitted.left`; the other placements stand
        (they never shared servers with it). Raises ConcurrentChange only when
        a server was taken by another writer. `now` is the placement time
        stored (default: the clock).
        """
        now = now or utcnow()
        collectives = collectives or {}
        wanted = list(placements)
        j = t.jobs
        try:
            with self.write_engine.begin() as conn:
                queued: set[str] = set()
                ids = [p.job_id for p in wanted]
                for chunk in chunks(ids):
                    queued.update(
                        conn.execute(
                            select(j.c.job_id)
                            .where(j.c.job_id.in_(chunk), j.c.state == JobState.QUEUED.value)
                            .with_for_update()
                        ).scalars()
                    )
                kept = [p for p in wanted if p.job_id in queued]
                payloads = {p.job_id: placement_to_json(p) for p in kept}
                if kept:
                    conn.execute(
                        update(j)
                        .where(j.c.job_id == bindparam("b_job"))
                        .values(
                            state=JobState.PLACED.value,
                            placement=bindparam("b_placement"),
                            collective=bindparam("b_collective"),
                            placed_at=now,
                            examined=True,
                            queue_reason=None,
                        ),
                        [
                            {
                                "b_job": p.job_id,
                                "b_placement": payloads[p.job_id],
                                "b_collective": collectives.get(p.job_id),
                            }
                            for p in kept
                        ],
                    )
                    conn.execute(
                        insert(t.server_assignments),
                        [{"server_id": s, "job_id": p.job_id} for p in kept for s in p.servers],
                    )
                # jobs placed here are marked examined by their own update
                for chunk in chunks([e for e in examined if e not in payloads]):
                    conn.execute(
                        update(j)
                        .where(j.c.job_id.in_(chunk))
                        .where(j.c.state == JobState.QUEUED.value)
                        .where(j.c.examined.is_(False))
                        .values(examined=True)
                    )
                if queue_reasons:
                    conn.execute(
                        update(j)
                        .where(j.c.job_id == bindparam("b_job"))
                        .where(j.c.state == JobState.QUEUED.value)
                        .where(j.c.queue_reason.is_distinct_from(bindparam("b_why")))
                        .values(queue_reason=bindparam("b_why")),
                        [{"b_job": k, "b_why": v} for k, v in queue_reasons.items()],
                    )
                decisions = [
                    NewDecision("placement", p.job_id, reason, {"placement": payloads[p.job_id]})
                    for p in kept
                ]
                seqs = append_decisions(conn, decisions)
        except IntegrityError as exc:
            raise ConcurrentChange("a server was taken by another writer") from exc
        left = tuple(p.job_id for p in wanted if p.job_id not in queued)
        return Admitted(tuple(p.job_id for p in kept), tuple(seqs), left)

    # --- outbox -----------------------------------------------------------

    def relay_outbox(self, publish: Callable[[dict[str, Any]], None], limit: int = 500) -> int:
        """Publish unpublished outbox rows in order, then mark them; returns how many.

        At-least-once: a crash after publishing and before the commit publishes
        again; consumers are idempotent. Rows are locked (SKIP LOCKED on
        Postgres) so two relays do not publish the same row concurrently.
        """
        with self.read_engine.connect() as conn:
            pending = conn.execute(
                select(t.outbox.c.id).where(t.outbox.c.published_at.is_(None)).limit(1)
            ).first()
        if pending is None:
            return 0
        with self.write_engine.begin() as conn:
            relaxed_commit(conn)  # a mark lost in a crash only publishes the row again
            rows = conn.execute(
                select(t.outbox.c.id, t.outbox.c.payload)
                .where(t.outbox.c.published_at.is_(None))
                .order_by(t.outbox.c.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            # traffic events name the last report stored; the worker reads every
            # report up to the newest, so only the newest of a drain is sent
            traffic = [r.id for r in rows if r.payload.get("type") == "ReportTraffic"]
            for row in rows:
                if row.payload.get("type") != "ReportTraffic" or row.id == traffic[-1]:
                    publish(row.payload)
            if rows:
                conn.execute(
                    update(t.outbox)
                    .where(t.outbox.c.id.in_([r.id for r in rows]))
                    .values(published_at=utcnow())
                )
        return len(rows)

    def prune_outbox(self, older_than: dt.timedelta) -> int:
        """Delete published outbox rows older than `older_than`."""
        with self.write_engine.begin() as conn:
            return conn.execute(
                delete(t.outbox).where(t.outbox.c.published_at < utcnow() - older_than)
            ).rowcount

    # --- decision log -----------------------------------------------------

    def decisions_after(self, after: int, limit: int) -> list[DecisionRecord]:
        with self.read_engine.connect() as conn:
            rows = conn.execute(
                select(t.decisions)
                .where(t.decisions.c.seq > after)
                .order_by(t.decisions.c.seq)
                .limit(limit)
            ).all()
        return [
            DecisionRecord(r.seq, as_utc(r.at), r.kind, r.job_id, r.reason, r.payload)  # type: ignore[arg-type]
            for r in rows
        ]

    def last_decision_seq(self) -> int:
        with self.read_engine.connect() as conn:
            value = conn.execute(select(func.max(t.decisions.c.seq))).scalar()
        return int(value or 0)

    def job_and_free_servers(self, job_id: str, total: int) -> tuple[JobRecord | None, int]:
        """A job and how many of `total` servers no job holds, in one statement (one
        snapshot: a job read as queued was not placed when the servers were counted)."""
        used = select(func.count()).select_from(t.server_assignments).scalar_subquery()
        with self.read_engine.connect() as conn:
            row = conn.execute(
                select(t.jobs, used.label("used_servers")).where(t.jobs.c.job_id == job_id)
            ).first()
        if row is None:
            return None, self.count_free_servers(total)
        return _job_record(row), total - int(row.used_servers or 0)

    def count_free_servers(self, total: int) -> int:
        with self.read_engine.connect() as conn:
            used = conn.execute(select(func.count()).select_from(t.server_assignments)).scalar()
        return total - int(used or 0)
