"""The functional core: pure values and functions shared by the worker and the simulator.

Nothing under `app.engine` does I/O, reads a clock or imports FastAPI, SQLAlchemy,
Redis or pydantic.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# loaded on first use (PEP 562): `lightpath --help` and the API's start need only a
# few of these, and `circuits` alone pulls in numpy's and scipy's import machinery
_HOME = {
    "Admission": "queue",
    "AggregatorGrant": "collective",
    "AggregatorLedger": "collective",
    "BatchAdvice": "memory",
    "CircuitPlan": "circuits",
    "Cluster": "cluster",
    "Collective": "job",
    "CollectiveChoice": "collective",
    "ComputeTimes": "job",
    "CrossConnect": "cross_connects",
    "DemandMatrix": "traffic",
    "FabricPlan": "fabric",
    "Job": "job",
    "JobState": "job",
    "MemoryBreakdown": "memory",
    "MemorySetup": "memory",
    "ModelFacts": "job",
    "Optimizer": "memory",
    "Oxc": "cluster",
    "OxcChange": "cross_connects",
    "Parallelism": "job",
    "PlacedJob": "fabric",
    "Placement": "job",
    "PlanCatalog": "plan_signature",
    "Pod": "cluster",
    "PodCircuits": "circuits",
    "PredictorState": "predictor",
    "QueuePolicy": "queue",
    "Server": "cluster",
    "Step": "predictor",
    "Tor": "cluster",
    "Unit": "job",
    "Unplaceable": "job",
    "admit_queued": "queue",
    "attribute_demands": "plan_signature",
    "build_cluster": "cluster",
    "check_job_memory": "memory",
    "choose_collective": "collective",
    "classify_plan": "plan_signature",
    "cluster_from_dict": "cluster",
    "diff_cross_connects": "cross_connects",
    "diff_plans": "fabric",
    "format_steps": "predictor",
    "job_traffic": "traffic",
    "map_cross_connects": "cross_connects",
    "max_microbatch": "memory",
    "memory_bytes": "memory",
    "never_fits": "placement",
    "new_predictor": "predictor",
    "observed_pod_demand": "traffic",
    "order_queue": "queue",
    "place_job": "placement",
    "plan_circuits": "circuits",
    "plan_circuits_exact": "circuits",
    "plan_fabric": "fabric",
    "plan_topology": "fabric",
    "preset": "cluster",
    "reserve_for": "queue",
    "run_predictor": "predictor",
    "should_preinstall": "preinstall",
    "step": "predictor",
    "without_failed_ports": "cluster",
}


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
