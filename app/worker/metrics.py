"""Prometheus metrics of the worker (scheduling, fabric, switches, predictor)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.placement_seconds = Histogram(
            "lightpath_placement_seconds",
            "Engine time of one scheduling pass (placement and admission)",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.fabric_seconds = Histogram(
            "lightpath_fabric_plan_seconds",
            "Engine time of one fabric plan (collectives, circuits, cross-connects)",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
        )
        self.jobs_placed = Counter("lightpath_jobs_placed", "Jobs placed", registry=r)
        self.decisions = Counter(
            "lightpath_decisions_written", "Decisions appended to the log", ["kind"], registry=r
        )
        self.reconfigurations = Counter(
            "lightpath_reconfigurations",
            "Cross-connect changes applied to OXCs (one per OXC command)",
            registry=r,
        )
        self.reconcile_errors = Counter(
            "lightpath_reconcile_errors", "OXC reconciliation failures", ["code"], registry=r
        )
        self.converged = Gauge(
            "lightpath_switches_converged", "1 when every OXC holds its desired state", registry=r
        )
        self.mlu = Gauge(
            "lightpath_mlu", "Maximum link utilisation of the planned fabric", registry=r
        )
        self.is_leader = Gauge(
            "lightpath_worker_is_leader", "1 while this worker holds the leader lease", registry=r
        )
        self.traffic_reports = Counter(
            "lightpath_traffic_reports_processed",
            "Traffic reports fed to the predictor",
            registry=r,
        )
        self.dead_letters = Counter(
            "lightpath_traffic_dead_letters",
            "Traffic reports the engine could not use, set aside with the reason",
            registry=r,
        )
        self.prediction_hits = Counter(
            "lightpath_prediction_hits",
            "Phases whose planned topology the switches confirmed before the phase began",
            registry=r,
        )
        self.prediction_misses = Counter(
            "lightpath_prediction_misses",
            "Phases that waited on circuits or ran on a topology not planned for them",
            registry=r,
        )
        self.prediction_held = Counter(
            "lightpath_prediction_held",
            "Phases that ran on a topology the controller chose to keep",
            registry=r,
        )
        self.exposed_reconfig = Counter(
            "lightpath_exposed_reconfig_seconds",
            "Time phases waited on circuits still being switched",
            registry=r,
        )
