"""Durable fabric state: desired and confirmed cross-connects, collectives, fabric facts.

The worker writes the desired state and its decisions in one transaction; the
southbound reconciler writes what the switches confirmed; the API reads both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update

from app.engine.cross_connects import CrossConnect
from app.engine.job import Job, JobState, Placement

from . import tables as t
from .mapping import job_from_body, placement_from_json
from .repository import NewDecision, Store, append_decisions, utcnow


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


def replace_desired(conn: Any, cross_connects: Iterable[CrossConnect]) -> None:
    """Make the desired-ports table hold exactly `cross_connects`, touching only changes."""
    wanted = {(r["oxc_id"], r["port"]): r for r in _port_rows(cross_connects)}
    existing = {(r.oxc_id, r.port): r for r in conn.execute(select(t.desired_ports))}
    gone = {
        key
        for key, row in existing.items()
        if key not in wanted
        or (wanted[key]["peer"], wanted[key]["job_id"]) != (row.peer, row.job_id)
    }
    for oxc_id, port in gone:
        conn.execute(
            delete(t.desired_ports)
            .where(t.desired_ports.c.oxc_id == oxc_id)
            .where(t.desired_ports.c.port == port)
        )
    fresh = [row for key, row in wanted.items() if key not in existing or key in gone]
    if fresh:
        conn.execute(insert(t.desired_ports), fresh)


class FabricRepository:
    """Reads and writes of the fabric tables over a `Store`'s engines."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def load_placed_jobs(self) -> list[PlacedJobRow]:
        """Placed jobs in arrival order (earlier jobs keep priority for ports)."""
        with self.store.read_engine.connect() as conn:
            rows = conn.execute(
                select(
                    t.jobs.c.job_id,
                    t.jobs.c.body,
                    t.jobs.c.submitted_order,
                    t.jobs.c.placement,
                    t.jobs.c.collective,
                )
                .where(t.jobs.c.state == JobState.PLACED.value)
                .order_by(t.jobs.c.submitted_order)
            ).all()
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
    ) -> list[int]:
        """Replace the desired state, update collectives, log decisions: one transaction."""
        now = utcnow()
        with self.store.write_engine.begin() as conn:
            replace_desired(conn, cross_connects)
            for job_id, collective in collectives.items():
                conn.execute(
                    update(t.jobs)
                    .where(t.jobs.c.job_id == job_id)
                    .where(t.jobs.c.state == JobState.PLACED.value)
                    .values(collective=collective)
                )
            self._put_fact(conn, "fabric", facts, now)
            return append_decisions(conn, decisions, now)

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
        self, confirmed: Iterable[ConfirmedOxc], unreachable: Iterable[str] = ()
    ) -> None:
        """Replace the confirmed rows of the OXCs read in this pass; note which were not.

        The `switches` fact keeps, per OXC, when it was last read and whether the
        last pass reached it: an unreachable switch's rows are its last read, and
        the topology view marks them stale.
        """
        confirmed = list(confirmed)
        unreachable = set(unreachable)
        now = utcnow()
        with self.store.write_engine.begin() as conn:
            health = dict(
                conn.execute(
                    select(t.fabric_state.c.value).where(t.fabric_state.c.name == "switches")
                ).scalar()
                or {}
            )
            for oxc in confirmed:
                health[oxc.oxc_id] = {"confirmed_at": now.isoformat(), "reachable": True}
            for oxc_id in unreachable:
                health[oxc_id] = {**health.get(oxc_id, {"confirmed_at": None}), "reachable": False}
            if confirmed or unreachable:
                self._put_fact(conn, "switches", health, now)
            for oxc in confirmed:
                conn.execute(
                    delete(t.confirmed_ports).where(t.confirmed_ports.c.oxc_id == oxc.oxc_id)
                )
                rows: dict[int, dict[str, Any]] = {}
                for a, b in oxc.cross_connects:
                    rows[a] = {
                        "oxc_id": oxc.oxc_id,
                        "port": a,
                        "peer": b,
                        "failed": a in oxc.failed_ports,
                    }
                    rows[b] = {
                        "oxc_id": oxc.oxc_id,
                        "port": b,
                        "peer": a,
                        "failed": b in oxc.failed_ports,
                    }
                for port in oxc.failed_ports:
                    rows.setdefault(
                        port, {"oxc_id": oxc.oxc_id, "port": port, "peer": None, "failed": True}
                    )
                if rows:
                    conn.execute(insert(t.confirmed_ports), list(rows.values()))

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
        return {o: c.failed_ports for o, c in self.load_confirmed().items() if c.failed_ports}
