"""The service's Prometheus metrics (``GET /metrics``), read from the store at scrape time.

Cluster-wide: ``pollux_jobs{state}``, ``pollux_queue_length`` (pending jobs) and
``pollux_allocated_gpus`` from the store's counts; ``pollux_hints_received_total``;
``pollux_round_duration_seconds``, a histogram of the policy's time per round over every round the
store keeps; ``pollux_api_request_duration_seconds{method, route}``, this process's API latency.

Per job, labelled ``job``, ``user`` (``admin`` for the admin's jobs), ``kind`` and ``gpu_type`` (the
GPU types of its allocation, comma-joined; empty on an untyped cluster): ``pollux_job_gpus``,
``pollux_job_restarts``, ``pollux_job_failures``, and, once the job has reported hints, what the
latest round expects of it on its allocation (:mod:`pollux.cluster.control.outlook`):
``pollux_job_batch_size``, ``pollux_job_local_bsz``, ``pollux_job_accumulation_steps``,
``pollux_job_efficiency``, ``pollux_job_goodput``, ``pollux_job_speedup`` and ``pollux_job_pgns``. A
job's series are shown while it has not ended and for :data:`RETAIN_S` after (bounded cardinality).
A user's scrape holds only its own jobs' series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping

from fastapi.responses import PlainTextResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pollux.cluster.backends.gputypes import job_gpu_types
from pollux.cluster.state.round_table import JobSeriesRow
from pollux.cluster.state.store import JobStore

__all__ = ["RETAIN_S", "ROUND_BUCKETS", "JobSeries", "ServiceMetrics"]

#: Seconds a job's series stay after it ended.
RETAIN_S = 600.0
#: Bucket bounds (seconds) of the round-duration histogram.
ROUND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: The per-job gauges from a round's outlook: metric name suffix, outlook field, help.
OUTLOOK_GAUGES = (
    ("batch_size", "batch_size", "Global batch size the job's goodput model chooses on its allocation."),
    ("local_bsz", "local_bsz", "Per-replica batch size the job's goodput model chooses on its allocation."),
    ("accumulation_steps", "accum_steps", "Gradient accumulation steps per optimiser step chosen there."),
    ("efficiency", "efficiency", "Statistical efficiency of that batch size (0-1)."),
    ("goodput", "goodput", "Goodput expected on the allocation: examples per second times efficiency."),
    ("speedup", "speedup", "Goodput on the allocation over goodput on one GPU."),
    ("pgns", "pgns", "Gradient noise scale the job last reported."),
)
_LABELS = ["job", "user", "kind", "gpu_type"]


def _escape_value(text: str) -> str:
    """A label value in the text format: backslash, double quote and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class JobSeries:
    """The per-job series of one scrape (all jobs, or one user's), read in one query.

    Written in the text format here rather than through ``prometheus_client``'s generic writer, which
    checks and escapes every label name of every sample: about 0.1 ms a sample, so 0.3 s for the
    3,000 samples of 500 active jobs. Here the label names are fixed and valid, the values are
    escaped once per job, and the numbers are formatted by ``prometheus_client``'s own function.
    """

    def __init__(self, store: JobStore, owner: str | None, now: float,
                 node_types: Mapping[str, str]) -> None:
        self._store = store
        self._owner = owner
        self._now = now
        self._types = node_types

    def _labels(self, row: JobSeriesRow) -> str:
        gpu_types = ",".join(job_gpu_types(row.allocation, self._types))
        values = [row.job_id, row.owner or "admin", row.kind, gpu_types]
        return ",".join(f'{name}="{_escape_value(v)}"' for name, v in zip(_LABELS, values, strict=True))

    def text(self) -> bytes:
        """The families, each with its HELP and TYPE lines, then one line per job that has a value."""
        rows = self._store.job_series(self._now - RETAIN_S, owner=self._owner)
        labels = [self._labels(row) for row in rows]
        families: list[tuple[str, str, list[float | None]]] = [
            ("gpus", "GPUs allocated to the job.", [float(sum(r.allocation.values())) for r in rows]),
            ("restarts", "Times the job was restarted.", [float(r.restarts) for r in rows]),
            ("failures", "Failed runs of the job.", [float(r.failures) for r in rows]),
        ]
        for name, field, help_text in OUTLOOK_GAUGES:
            values = [None if r.outlook is None else getattr(r.outlook, field) for r in rows]
            families.append((name, help_text, values))
        lines: list[str] = []
        for name, help_text, values in families:
            metric = f"pollux_job_{name}"
            lines.append(f"# HELP {metric} {help_text}")
            lines.append(f"# TYPE {metric} gauge")
            lines += [f"{metric}{{{label}}} {floatToGoString(value)}"
                      for label, value in zip(labels, values, strict=True) if value is not None]
        return ("\n".join(lines) + "\n").encode()


class ServiceMetrics(Collector):
    """The service's metrics (see the module docstring): a collector of its own registry (one per
    application) for the cluster-wide series, the API latency histogram beside it, and
    :class:`JobSeries` made for each scrape."""

    def __init__(self, store: JobStore, node_types: Callable[[], Mapping[str, str]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._node_types = node_types
        self._clock = clock
        self._lock = threading.Lock()
        self.hints_received = 0
        # No ``_created`` series (a timestamp per histogram child): they double the series for nothing
        # a dashboard uses. The switch is process-wide, and this is the service's only exposition.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.api_latency = Histogram("pollux_api_request_duration_seconds", "API request latency.",
                                     ["method", "route"], registry=self.registry)

    def add_hints(self) -> None:
        with self._lock:
            self.hints_received += 1

    def observe_request(self, method: str, route: str, seconds: float) -> None:
        self.api_latency.labels(method, route).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        counts = self._store.count_by_state()
        jobs = GaugeMetricFamily("pollux_jobs", "Number of jobs in each state.", labels=["state"])
        for state, n in counts.items():
            jobs.add_metric([state], n)
        yield jobs
        yield GaugeMetricFamily("pollux_queue_length", "Jobs waiting for GPUs (pending).",
                                value=counts.get("pending", 0))
        gpus = sum(sum(a.values()) for a in self._store.current_allocations().values())
        yield GaugeMetricFamily("pollux_allocated_gpus", "GPUs currently allocated to jobs.", value=gpus)
        with self._lock:
            hints = self.hints_received
        yield CounterMetricFamily("pollux_hints_received",
                                  "Valid hints accepted by this service process.", value=hints)
        below, count, total = self._store.round_durations(ROUND_BUCKETS)
        buckets = [(str(b), float(n)) for b, n in zip(ROUND_BUCKETS, below, strict=True)]
        buckets.append(("+Inf", float(count)))
        yield HistogramMetricFamily("pollux_round_duration_seconds", "Policy time per scheduling round.",
                                    buckets=buckets, sum_value=total)

    def exposition(self, owner: str | None = None) -> PlainTextResponse:
        """The scrape's text: the cluster-wide series and the job series (only ``owner``'s, if given)."""
        types = {}
        if self._node_types is not None:
            try:
                types = dict(self._node_types())
            except Exception:   # never let a scrape fail for want of GPU types
                types = {}
        per_job = JobSeries(self._store, owner, self._clock(), types).text()
        text = generate_latest(self.registry) + per_job
        return PlainTextResponse(text, media_type=CONTENT_TYPE_LATEST)
