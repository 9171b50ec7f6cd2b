"""The service's Prometheus metrics (``GET /metrics``), read from the store at scrape time."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pollux.cluster.state.store import JobStore

__all__ = ["ServiceMetrics"]


class ServiceMetrics(Collector):
    """The service's Prometheus metrics, a collector of its own registry (one per application), read at
    scrape time: ``pollux_jobs{state}`` and ``pollux_allocated_gpus`` from the store's counts (never
    the jobs themselves), and ``pollux_hints_received_total``, the valid hints this process accepted."""

    def __init__(self, store: JobStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.hints_received = 0
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def add_hints(self) -> None:
        with self._lock:
            self.hints_received += 1

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("pollux_jobs", "Number of jobs in each state.", labels=["state"])
        for state, n in self._store.count_by_state().items():
            jobs.add_metric([state], n)
        yield jobs
        gpus = sum(sum(a.values()) for a in self._store.current_allocations().values())
        yield GaugeMetricFamily("pollux_allocated_gpus", "GPUs currently allocated to jobs.", value=gpus)
        with self._lock:
            hints = self.hints_received
        yield CounterMetricFamily("pollux_hints_received",
                                  "Valid hints accepted by this service process.", value=hints)

    def exposition(self) -> PlainTextResponse:
        return PlainTextResponse(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
