"""Prometheus metrics of the API process, on a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from app.engine.cluster import Cluster
from app.store import Store


class _StateCollector(Collector):
    """Reads jobs by state, free servers and the decision count at scrape time."""

    def __init__(self, store: Store, cluster: Cluster) -> None:
        self.store = store
        self.cluster = cluster

    def collect(self) -> Iterator[Any]:
        try:
            counts = self.store.count_jobs_by_state()
            free = self.store.count_free_servers(self.cluster.server_count)
            decisions = self.store.last_decision_seq()
        except Exception:  # an unreachable database must not break the scrape
            return
        jobs = GaugeMetricFamily("lightpath_jobs", "Jobs by state", labels=["state"])
        for state, n in counts.items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily("lightpath_free_servers", "Servers not held by a job", value=free)
        yield GaugeMetricFamily(
            "lightpath_servers", "Servers in the cluster", value=self.cluster.server_count
        )
        yield GaugeMetricFamily(
            "lightpath_decisions", "Decisions in the log (last seq)", value=decisions
        )


class ApiMetrics:
    def __init__(
        self, store: Store, cluster: Cluster, registry: CollectorRegistry | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.request_seconds = Histogram(
            "lightpath_http_request_duration_seconds",
            "HTTP request latency by route",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.traffic_reports = Counter(
            "lightpath_traffic_reports", "Traffic reports accepted", registry=self.registry
        )
        self.traffic_demands = Counter(
            "lightpath_traffic_demands", "Demand entries accepted", registry=self.registry
        )
        self.registry.register(_StateCollector(store, cluster))
