"""What a switch holds, as read back from it: the value every driver returns.

A cross-connect is an unordered port pair (full duplex), always stored as
`(low, high)` so `(17, 0)` and `(0, 17)` compare equal. Imports nothing but the
standard library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PortPair = tuple[int, int]


def normalize_pair(a: int, b: int) -> PortPair:
    """The canonical spelling of the cross-connect joining ports `a` and `b`."""
    return (a, b) if a <= b else (b, a)


def normalize_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[PortPair, ...]:
    """Canonical pairs in the order given (duplicates kept, so callers can refuse them)."""
    return tuple(normalize_pair(int(a), int(b)) for a, b in pairs)


@dataclass(frozen=True, slots=True)
class ConfirmedState:
    """An OXC's cross-connects and failed ports as the switch itself reports them."""

    oxc_id: str
    ports: int
    cross_connects: frozenset[PortPair]
    failed_ports: frozenset[int]

    def port_peer(self, port: int) -> int | None:
        """The port `port` is cross-connected to, or None when it is free."""
        for a, b in self.cross_connects:
            if a == port:
                return b
            if b == port:
                return a
        return None

    @property
    def used_ports(self) -> frozenset[int]:
        return frozenset(p for pair in self.cross_connects for p in pair)
