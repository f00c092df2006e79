"""The southbound: drive optical cross-connect switches toward the decision log.

One small interface (`SouthboundDriver`: apply, read, close) with an in-process
driver over the switch model, an HTTP driver for the `mock-oxc` service, and a
level-triggered `reconcile` pass. The engine never imports this package.
`mock_oxc` (FastAPI) is imported on its own so the worker does not pull it in.
"""

from .driver import HttpDriver, InProcessDriver, SouthboundDriver
from .errors import (
    CommandRefused,
    NotConnected,
    PortBusy,
    PortFailed,
    PortOutOfRange,
    RequestIdReused,
    SouthboundError,
    StaleToken,
    SwitchFault,
    SwitchProtocolError,
    SwitchTimeout,
    SwitchUnreachable,
    TerminalError,
    TransientError,
    UnknownSwitch,
)
from .reconcile import (
    BlockedCrossConnect,
    CrossConnectDiff,
    DesiredCrossConnect,
    OxcChange,
    ReconcileError,
    ReconcileResult,
    RetryPolicy,
    diff_cross_connects,
    reconcile,
)
from .state import ConfirmedState, PortPair, normalize_pair
from .switch import DEFAULT_RECONFIG_MS, ApplyOutcome, OpticalSwitch, switches_for_cluster

__all__ = [
    "DEFAULT_RECONFIG_MS",
    "ApplyOutcome",
    "BlockedCrossConnect",
    "CommandRefused",
    "ConfirmedState",
    "CrossConnectDiff",
    "DesiredCrossConnect",
    "HttpDriver",
    "InProcessDriver",
    "NotConnected",
    "OpticalSwitch",
    "OxcChange",
    "PortBusy",
    "PortFailed",
    "PortOutOfRange",
    "PortPair",
    "ReconcileError",
    "ReconcileResult",
    "RequestIdReused",
    "RetryPolicy",
    "SouthboundDriver",
    "SouthboundError",
    "StaleToken",
    "SwitchFault",
    "SwitchProtocolError",
    "SwitchTimeout",
    "SwitchUnreachable",
    "TerminalError",
    "TransientError",
    "UnknownSwitch",
    "diff_cross_connects",
    "normalize_pair",
    "reconcile",
    "switches_for_cluster",
]
