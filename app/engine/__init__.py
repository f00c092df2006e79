"""The functional core: pure values and functions shared by the worker and the simulator.

Nothing under `app.engine` does I/O, reads a clock or imports FastAPI, SQLAlchemy,
Redis or pydantic.
"""

from .cluster import Cluster, Oxc, Pod, Server, Tor, build_cluster, cluster_from_dict, preset
from .job import (
    Collective,
    ComputeTimes,
    Job,
    JobState,
    ModelFacts,
    Parallelism,
    Placement,
    Unit,
    Unplaceable,
)
from .placement import never_fits, place_job
from .queue import Admission, QueuePolicy, admit_queued, order_queue

__all__ = [
    "Admission", "Cluster", "Collective", "ComputeTimes", "Job", "JobState", "ModelFacts",
    "Oxc", "Parallelism", "Placement", "Pod", "QueuePolicy", "Server", "Tor", "Unit",
    "Unplaceable", "admit_queued", "build_cluster", "cluster_from_dict", "never_fits",
    "order_queue", "place_job", "preset",
]
