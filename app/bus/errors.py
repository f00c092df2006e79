"""The bus exception family: what publishing, consuming or announcing can run into.

Nothing above `app.bus` needs to know about redis-py: the Redis Streams bus
translates its low-level errors into these at the boundary
(`raise BusUnavailable(...) from exc`). Imports nothing but the standard library.

Hierarchy::

    BusError                 the broker refused or could not run a command
    └── BusUnavailable       the broker cannot be reached now; retrying later may succeed
"""

from __future__ import annotations


class BusError(Exception):
    """Base class: a bus operation failed (bad credentials, a refused command, a bug)."""


class BusUnavailable(BusError):
    """No usable connection to the broker (refused, reset, timed out, still loading)."""
