"""SQLAlchemy 2 tables: the single description of what Lightpath keeps durably.

Schema changes go through an Alembic revision in `migrations/versions/`.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    text,
)

metadata = MetaData()

# the newest Alembic revision (`migrations/versions/`): readiness refuses a database
# at another one (`lightpath api` on a database nobody migrated answered every call
# with a 503 while /readyz said the database was fine). A test keeps it the head.
SCHEMA_REVISION = "jobs_completed_at"

# A job as the launcher submitted it, and what the scheduler made of it.
jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("submitted_order", BigInteger, nullable=False, unique=True),
    Column("body", JSON, nullable=False),
    Column("body_hash", String(64), nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("servers_needed", Integer, nullable=False),
    Column("priority", Integer, nullable=False, default=0),
    Column("deadline", Float, nullable=True),
    # True once the worker has run admission with this job in the queue; the
    # API's POST waits for this (or placement) before answering 201/202.
    Column("examined", Boolean, nullable=False, default=False),
    Column("queue_reason", Text, nullable=True),
    Column("placement", JSON, nullable=True),
    Column("collective", JSON, nullable=True),
    Column("submitted_at", DateTime(timezone=True), nullable=False),
    Column("placed_at", DateTime(timezone=True), nullable=True),
    Column("completed_at", DateTime(timezone=True), nullable=True),
    # Fingerprint of the bearer token that submitted the job (launcher scope may
    # end only its own jobs); null when auth is off.
    Column("owner", String(64), nullable=True),
    # Heartbeat lease: a placed job not heard from for lease_s since
    # max(placed_at, heartbeat_at) is failed with end_reason lease_expired.
    Column("lease_s", Float, nullable=True),
    Column("heartbeat_at", DateTime(timezone=True), nullable=True),
    # How a job ended: the launcher's exit code and reason (failed, cancelled).
    Column("exit_code", Integer, nullable=True),
    Column("end_reason", Text, nullable=True),
    # retention deletes ended jobs oldest first (only ended jobs have completed_at)
    Index(
        "ix_jobs_completed_at",
        "completed_at",
        postgresql_where=text("completed_at IS NOT NULL"),
        sqlite_where=text("completed_at IS NOT NULL"),
    ),
)

# Which job holds each server. The primary key makes double booking impossible.
server_assignments = Table(
    "server_assignments",
    metadata,
    Column("server_id", String(200), primary_key=True),
    Column("job_id", String(200), ForeignKey("jobs.job_id"), nullable=False, index=True),
)

# The decision log: gap-free, ordered by seq, append-only.
decisions = Table(
    "decisions",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("job_id", String(200), nullable=True, index=True),
    Column("reason", String(16), nullable=False),
    Column("payload", JSON, nullable=False),
    # the leader token of the worker that wrote it (null: written before fencing)
    Column("token", BigInteger, nullable=True),
)

# The newest leader token the database has seen, per lease name. Every worker
# transaction reads it (FOR SHARE) and is refused when a newer leader exists, so
# a deposed leader cannot write; a new leader raises it in its first transaction.
fencing = Table(
    "fencing",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("token", BigInteger, nullable=False),
)

# Traffic reports the engine could not use, set aside with the reason; the
# worker's cursor moves past them.
dead_letters = Table(
    "dead_letters",
    metadata,
    Column("ord", BigInteger, primary_key=True, autoincrement=False),
    Column("job_id", String(200), nullable=True),
    Column("reason", Text, nullable=False),
    Column("report", JSON, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
)

# Named monotonic counters (decision seq, job arrival order, report order). Taking
# the next value updates the row, which serialises writers and rolls back with
# the transaction, so sequences stay gap-free.
counters = Table(
    "counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

# Transactional outbox: written in the same transaction as the fact it
# announces, published to the bus by the relay, then marked published.
outbox = Table(
    "outbox",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("topic", String(64), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Index("ix_outbox_unpublished", "published_at", "id"),
)

# Desired cross-connects (from the decision log), one row per port: the primary
# key makes "one port in two cross-connects" impossible in the desired state.
desired_ports = Table(
    "desired_ports",
    metadata,
    Column("oxc_id", String(64), primary_key=True),
    Column("port", Integer, primary_key=True),
    Column("peer", Integer, nullable=False),
    Column("job_id", String(200), nullable=False, index=True),
)

# What the switches reported at the last reconciliation pass, one row per port.
confirmed_ports = Table(
    "confirmed_ports",
    metadata,
    Column("oxc_id", String(64), primary_key=True),
    Column("port", Integer, primary_key=True),
    Column("peer", Integer, nullable=True),  # null: the port is failed and unconnected
    Column("failed", Boolean, nullable=False, default=False),
    # the switch controller reads the failed ports on every pass: a few rows
    Index(
        "ix_confirmed_ports_failed",
        "oxc_id",
        "port",
        postgresql_where=text("failed"),
        sqlite_where=text("failed = 1"),
    ),
)

# Fabric-wide facts the worker keeps between passes (MLU, pod circuits, ...).
fabric_state = Table(
    "fabric_state",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", JSON, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Traffic-demand reports: one row per report (one communication phase).
# `seq` comes from a database sequence (SQLite: the rowid), so ingest takes no
# row lock; concurrent ingests may commit out of `seq` order and a rolled-back
# one leaves a gap. The worker therefore numbers committed reports itself:
# `ord` is gap-free and is what its cursor counts (null: not yet numbered).
traffic_reports = Table(
    "traffic_reports",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("ord", BigInteger, nullable=True),
    Column("job_id", String(200), nullable=True, index=True),
    Column("phase_started_at", Float, nullable=False),
    Column("demands", JSON, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    # written until issue 16 (the jobs a consumed report fed, for a replay that no
    # longer exists: predictor state is one row per job); nothing writes or reads it
    # now, so consuming a report no longer rewrites its row
    Column("attributed", JSON, nullable=True),
    Index("uq_traffic_reports_ord", "ord", unique=True),
    Index(
        "ix_traffic_reports_unnumbered",
        "seq",
        postgresql_where=text("ord IS NULL"),
        sqlite_where=text("ord IS NULL"),
    ),
)

# Per-job cycle predictor state, written with the traffic cursor it reflects.
predictions = Table(
    "predictions",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("algorithm", String(16), nullable=False),
    Column("state", JSON, nullable=False),
    Column("hits", Integer, nullable=False, default=0),
    Column("misses", Integer, nullable=False, default=0),
    Column("exposed_reconfig_s", Float, nullable=False, default=0.0),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Traffic batches submitted with an Idempotency-Key: a retried batch (its
# first answer lost) is answered again instead of stored twice.
traffic_batches = Table(
    "traffic_batches",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("accepted", Integer, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    # sha256 of the batch: the same key with another body is refused (409)
    Column("body_hash", String(64), nullable=True),
)
