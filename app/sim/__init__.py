"""The offline simulator: replay a workload through the engine on simulated time.

An imperative shell around `app.engine` like the worker, with no web, database
or bus imports. `simulate` runs one policy; `report` turns results into
`summary.json`, tables and plots; `commands` holds what the CLI calls.
"""

from .policies import POLICIES
from .simulator import JobResult, SimResult, Simulation, simulate
from .workload import WorkloadError, WorkloadJob, from_kalos_trace, read_workload, write_workload

__all__ = [
    "POLICIES",
    "JobResult",
    "SimResult",
    "Simulation",
    "WorkloadError",
    "WorkloadJob",
    "from_kalos_trace",
    "read_workload",
    "simulate",
    "write_workload",
]
