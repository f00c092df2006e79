"""Durable fabric state: desired and confirmed cross-connects, collectives, fabric facts.

The worker writes the desired state and its decisions in one transaction; the
southbound reconciler writes what the switches confirmed; the API reads both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, text, true, update

from app.engine.cross_connects import CrossConnect
from app.engine.job import Job, JobState, Placement

from . import tables as t
from .database import relaxed_commit
from .mapping import job_from_body, placement_from_json
from .repository import NewDecision, Store, append_decisions, chunks, utcnow


@dataclass(frozen=True, slots=True)
class PlacedJobRow:
    job: Job
    placement: Placement
    collective: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ConfirmedOxc:
    """One switch as last read back: cross-connects and failed ports."""

    oxc_id: str
    cross_connects: frozenset[tuple[int, int]]
    failed_ports: frozenset[int]


def _port_rows(cross_connects: Iterable[CrossConnect]) -> list[dict[str, Any]]:
    rows = []
    for cc in cross_connects:
        rows.append(
            {"oxc_id": cc.oxc_id, "port": cc.port_a, "peer": cc.port_b, "job_id": cc.job_id}
        )
        rows.append(
            {"oxc_id": cc.oxc_id, "port": cc.port_b, "peer": cc.port_a, "job_id": cc.job_id}
        )
    return rows


def _port_key_rows(cross_connects: Iterable[CrossConnect]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["oxc_id"], r["port"]): r for r in _port_rows(cross_connects)}


def replace_desired(
    conn: Any,
    cross_connects: Iterable[CrossConnect],
    previous: Iterable[CrossConnect] | None = None,
) -> int:
    """Make the desired-ports table hold exactly `cross_connects`, touching only changes.

    `previous` is what the table holds (the caller's memory of its last write):
    given, nothing is read; else the table is read and compared. Returns the
    number of port rows written or deleted.
    """
    if previous is not None:  # diff the cross-connects, then only their port rows
        want, held = set(cross_connects), set(previous)
        gone = [{"o": r["oxc_id"], "p": r["port"]} for r in _port_rows(held.difference(want))]
        fresh = _port_rows(want.difference(held))
    else:
        wanted = _port_key_rows(cross_connects)
        existing = {
            (r.oxc_id, r.port): (r.peer, r.job_id) for r in conn.execute(select(t.desired_ports))
        }
        gone = [
            {"o": oxc_id, "p": port}
            for (oxc_id, port), row in existing.items()
            if (oxc_id, port) not in wanted
            or (wanted[(oxc_id, port)]["peer"], wanted[(oxc_id, port)]["job_id"]) != row
        ]
        removed = {(g["o"], g["p"]) for g in gone}
        fresh = [row for key, row in wanted.items() if key not in existing or key in removed]
    if gone:
        conn.execute(
            delete(t.desired_ports).where(
                t.desired_ports.c.oxc_id == bindparam("o"), t.desired_ports.c.port == bindparam("p")
            ),
            gone,
        )
    if fresh:
        conn.execute(insert(t.desired_ports), fresh)
    return len(gone) + len(fresh)


class FabricRepository:
    """Reads and writes of the fabric tables over a `Store`'s engines."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def placed_job_ids(self) -> list[str]:
        """Ids of the placed jobs in placement order (no JSON decoded)."""
        with self.store.read_engine.connect() as conn:
            return list(
                conn.execute(
                    select(t.jobs.c.job_id)
                    .where(t.jobs.c.state == JobState.PLACED.value)
                    .order_by(t.jobs.c.placed_at, t.jobs.c.submitted_order)
                ).scalars()
            )

    def load_placed_jobs(self, job_ids: Collection[str] | None = None) -> list[PlacedJobRow]:
        """Placed jobs in placement order (earlier jobs keep priority for ports, and a
        new leader steps them in as the old one did); only `job_ids` of them when
        given (the worker reads what appeared since its last pass)."""
        query = (
            select(
                t.jobs.c.job_id,
                t.jobs.c.body,
                t.jobs.c.submitted_order,
                t.jobs.c.placement,
                t.jobs.c.collective,
            )
            .where(t.jobs.c.state == JobState.PLACED.value)
            .order_by(t.jobs.c.placed_at, t.jobs.c.submitted_order)
        )
        if job_ids is not None:
            if not job_ids:
                return []
            query = query.where(t.jobs.c.job_id.in_(sorted(job_ids)))
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            PlacedJobRow(
                job_from_body(r.job_id, r.body, r.submitted_order),
                placement_from_json(r.job_id, r.placement),
                r.collective,
            )
            for r in rows
        ]

    def load_desired(self) -> tuple[CrossConnect, ...]:
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(
                select(t.desired_ports).where(t.desired_ports.c.port < t.desired_ports.c.peer)
            ).all()
        return tuple(CrossConnect(r.oxc_id, r.port, r.peer, r.job_id) for r in rows)

    def desired_by_oxc(self, oxc_ids: Iterable[str]) -> dict[str, set[tuple[int, int, str]]]:
        """The desired cross-connects of every OXC (empty for an OXC that should hold none)."""
        desired: dict[str, set[tuple[int, int, str]]] = {o: set() for o in oxc_ids}
        for cc in self.load_desired():
            desired.setdefault(cc.oxc_id, set()).add((cc.port_a, cc.port_b, cc.job_id))
        return desired

    def record_fabric(
        self,
        cross_connects: Sequence[CrossConnect],
        collectives: Mapping[str, dict[str, Any]],
        decisions: Sequence[NewDecision],
        facts: dict[str, Any],
        *,
        previous: Iterable[CrossConnect] | None = None,
    ) -> list[int]:
        """Replace the desired state, update collectives, log decisions: one transaction.

        `previous`: the desired state as last written (see `replace_desired`).
        """
        now = utcnow()
        with self.store.write_engine.begin() as conn:
            replace_desired(conn, cross_connects, previous)
            if collectives:  # one executemany (PostgreSQL: one round trip), not one per job
                conn.execute(
                    update(t.jobs)
                    .where(t.jobs.c.job_id == bindparam("b_job"))
                    .where(t.jobs.c.state == JobState.PLACED.value)
                    .values(collective=bindparam("b_collective")),
                    [{"b_job": j, "b_collective": c} for j, c in collectives.items()],
                )
            self._put_fact(conn, "fabric", facts, now)
            return append_decisions(conn, decisions)

    @staticmethod
    def _put_fact(conn: Any, name: str, value: dict[str, Any], now: Any) -> None:
        changed = conn.execute(
            update(t.fabric_state)
            .where(t.fabric_state.c.name == name)
            .values(value=value, updated_at=now)
        ).rowcount
        if not changed:
            conn.execute(insert(t.fabric_state).values(name=name, value=value, updated_at=now))

    def fact(self, name: str) -> dict[str, Any] | None:
        with self.store.read_engine.connect() as conn:
            row = conn.execute(
                select(t.fabric_state.c.value).where(t.fabric_state.c.name == name)
            ).first()
        return row.value if row else None

    # --- what the switches confirmed --------------------------------------

    def save_confirmed(
        self,
        confirmed: Iterable[ConfirmedOxc],
        previous: Mapping[str, ConfirmedOxc] | None = None,
    ) -> int:
        """Record what the OXCs read in this pass hold; returns the port rows written.

        With `previous` (what the table holds, the caller's memory) only the
        ports that changed are deleted and inserted and nothing is read;
        without it every given OXC's rows are replaced.
        """
        confirmed = list(confirmed)
        cp = t.confirmed_ports
        replaced: list[str] = []  # OXCs whose rows all go (no memory of them)
        gone: list[tuple[str, int]] = []
        fresh: list[dict[str, Any]] = []
        for oxc in confirmed:
            rows = _confirmed_rows(oxc)
            if previous is None:
                replaced.append(oxc.oxc_id)
                fresh.extend(rows.values())
                continue
            before = previous.get(oxc.oxc_id)
            held = _confirmed_rows(before) if before is not None else {}
            gone.extend((oxc.oxc_id, port) for port, row in held.items() if rows.get(port) != row)
            fresh.extend(row for port, row in rows.items() if held.get(port) != row)
        if not (replaced or gone or fresh):
            return 0
        # one statement per kind of change for all the OXCs of the pass (a cross-pod
        # arrival touches ~16): each statement is a round trip on PostgreSQL
        with self.store.write_engine.begin() as conn:
            relaxed_commit(conn)  # the switches are read again on the next pass
            for names in chunks(replaced):
                conn.execute(delete(cp).where(cp.c.oxc_id.in_(names)))
            _delete_ports(conn, gone)
            _insert_ports(conn, fresh)
        return len(gone) + len(fresh)

    def save_reachability(self, unreachable: Iterable[str]) -> None:
        """Which switches the last pass could not read, and since when (the `switches` fact)."""
        now = utcnow()
        with self.store.write_engine.begin() as conn:
            before = (
                conn.execute(
                    select(t.fabric_state.c.value).where(t.fabric_state.c.name == "switches")
                ).scalar()
                or {}
            ).get("unreachable", {})
            since = {o: before.get(o, now.isoformat()) for o in sorted(unreachable)}
            self._put_fact(conn, "switches", {"unreachable": since}, now)

    def load_confirmed(self) -> dict[str, ConfirmedOxc]:
        pairs: dict[str, set[tuple[int, int]]] = defaultdict(set)
        failed: dict[str, set[int]] = defaultdict(set)
        with self.store.read_engine.connect() as conn:
            for r in conn.execute(select(t.confirmed_ports)):
                if r.peer is not None and r.port < r.peer:
                    pairs[r.oxc_id].add((r.port, r.peer))
                if r.failed:
                    failed[r.oxc_id].add(r.port)
        return {
            o: ConfirmedOxc(o, frozenset(pairs[o]), frozenset(failed[o]))
            for o in set(pairs) | set(failed)
        }

    def load_failed_ports(self) -> dict[str, frozenset[int]]:
        """Failed ports per OXC, read by the partial index on failed rows."""
        failed: dict[str, set[int]] = defaultdict(set)
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(
                select(t.confirmed_ports.c.oxc_id, t.confirmed_ports.c.port).where(
                    t.confirmed_ports.c.failed == true()
                )
            )
            for r in rows:
                failed[r.oxc_id].add(r.port)
        return {o: frozenset(p) for o, p in failed.items()}


# PostgreSQL: a batch of ports as arrays, one statement and one round trip whatever its
# size (a row-value IN list of ~160 pairs plans as an OR of index scans: ~25 ms)
_PG_DELETE_PORTS = text(
    "DELETE FROM confirmed_ports AS c"
    " USING unnest(CAST(:oxc AS text[]), CAST(:port AS integer[])) AS g(oxc_id, port)"
    " WHERE c.oxc_id = g.oxc_id AND c.port = g.port"
)
_PG_INSERT_PORTS = text(
    "INSERT INTO confirmed_ports (oxc_id, port, peer, failed) SELECT * FROM unnest("
    "CAST(:oxc AS text[]), CAST(:port AS integer[]), CAST(:peer AS integer[]),"
    " CAST(:failed AS boolean[]))"
)


def _delete_ports(conn: Connection, keys: Sequence[tuple[str, int]]) -> None:
    """Delete the confirmed rows of these (OXC, port) pairs."""
    if not keys:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(_PG_DELETE_PORTS, {"oxc": [o for o, _ in keys], "port": [p for _, p in keys]})
        return
    cp = t.confirmed_ports
    conn.execute(
        delete(cp).where(cp.c.oxc_id == bindparam("o"), cp.c.port == bindparam("p")),
        [{"o": o, "p": p} for o, p in keys],
    )


def _insert_ports(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    if conn.dialect.name == "postgresql":
        columns = {k: [r[c] for r in rows] for k, c in _PORT_COLUMNS}
        conn.execute(_PG_INSERT_PORTS, columns)
        return
    conn.execute(insert(t.confirmed_ports), rows)


_PORT_COLUMNS = (("oxc", "oxc_id"), ("port", "port"), ("peer", "peer"), ("failed", "failed"))


def _confirmed_rows(oxc: ConfirmedOxc) -> dict[int, dict[str, Any]]:
    """One row per port of `oxc`: connected ports with their peer, failed ones flagged."""
    rows: dict[int, dict[str, Any]] = {}
    for a, b in oxc.cross_connects:
        rows[a] = {"oxc_id": oxc.oxc_id, "port": a, "peer": b, "failed": a in oxc.failed_ports}
        rows[b] = {"oxc_id": oxc.oxc_id, "port": b, "peer": a, "failed": b in oxc.failed_ports}
    for port in oxc.failed_ports:
        rows.setdefault(port, {"oxc_id": oxc.oxc_id, "port": port, "peer": None, "failed": True})
    return rows
