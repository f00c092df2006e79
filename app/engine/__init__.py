"""The functional core: pure values and functions shared by the worker and the simulator.

Nothing under `app.engine` does I/O, reads a clock or imports FastAPI, SQLAlchemy,
Redis or pydantic.
"""

from .circuits import CircuitPlan, PodCircuits, plan_circuits, plan_circuits_exact
from .cluster import (
    Cluster,
    Oxc,
    Pod,
    Server,
    Tor,
    build_cluster,
    cluster_from_dict,
    preset,
    without_failed_ports,
)
from .collective import AggregatorGrant, AggregatorLedger, CollectiveChoice, choose_collective
from .cross_connects import CrossConnect, OxcChange, diff_cross_connects, map_cross_connects
from .fabric import FabricPlan, PlacedJob, diff_plans, plan_fabric, plan_topology
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
from .memory import (
    BatchAdvice,
    MemoryBreakdown,
    MemorySetup,
    Optimizer,
    check_job_memory,
    max_microbatch,
    memory_bytes,
)
from .placement import never_fits, place_job
from .plan_signature import PlanCatalog, attribute_demands, classify_plan
from .predictor import PredictorState, Step, format_steps, new_predictor, run_predictor, step
from .preinstall import should_preinstall
from .queue import Admission, QueuePolicy, admit_queued, order_queue, reserve_for
from .traffic import DemandMatrix, job_traffic, observed_pod_demand

__all__ = [
    "Admission",
    "AggregatorGrant",
    "AggregatorLedger",
    "BatchAdvice",
    "CircuitPlan",
    "Cluster",
    "Collective",
    "CollectiveChoice",
    "ComputeTimes",
    "CrossConnect",
    "DemandMatrix",
    "FabricPlan",
    "Job",
    "JobState",
    "MemoryBreakdown",
    "MemorySetup",
    "ModelFacts",
    "Optimizer",
    "Oxc",
    "OxcChange",
    "Parallelism",
    "PlacedJob",
    "Placement",
    "PlanCatalog",
    "Pod",
    "PodCircuits",
    "PredictorState",
    "QueuePolicy",
    "Server",
    "Step",
    "Tor",
    "Unit",
    "Unplaceable",
    "admit_queued",
    "attribute_demands",
    "build_cluster",
    "check_job_memory",
    "choose_collective",
    "classify_plan",
    "cluster_from_dict",
    "diff_cross_connects",
    "diff_plans",
    "format_steps",
    "job_traffic",
    "map_cross_connects",
    "max_microbatch",
    "memory_bytes",
    "never_fits",
    "new_predictor",
    "observed_pod_demand",
    "order_queue",
    "place_job",
    "plan_circuits",
    "plan_circuits_exact",
    "plan_fabric",
    "plan_topology",
    "preset",
    "reserve_for",
    "run_predictor",
    "should_preinstall",
    "step",
    "without_failed_ports",
]
