"""A job's hints history as points over time: for each accepted hints body (down-sampled by the
store), its gradient noise scale and what its goodput model chooses on the allocation in force at
that time — batch size, local batch, accumulation, statistical efficiency, predicted step time and
goodput — computed by the same code as a round's outlook (:mod:`pollux.cluster.control.outlook`);
and, when the agent reported it (hints version 3, ``current``), the step time it measured and the
goodput that measurement makes, so that a chart sets measured beside predicted.

The web view's charts and the API's ``GET /v1/jobs/{id}/hints/history`` both answer from one
:class:`HintsPoints`, so a chart holds exactly the points the API gives. A point costs a few
milliseconds (the body is validated and the batch size optimised); the history is append-only and the
allocation in force when a body arrived never changes afterwards, so each point is computed once and
kept (a bounded cache), and a page shown again costs only the store's read.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pollux.cluster.control.outlook import OutlookCache
from pollux.cluster.control.scheduler import job_view
from pollux.cluster.state.hints_table import HintsEntry
from pollux.cluster.state.records import JobRecord, ResizeRecord
from pollux.cluster.state.store import JobStore
from pollux.hints import HintsError

__all__ = ["DEFAULT_POINTS", "HintsPoint", "HintsPoints", "allocation_at", "point_of"]

#: Points a chart shows unless asked for another number.
DEFAULT_POINTS = 200
#: Points kept computed, over every job (about 200 bytes each).
CACHED_POINTS = 100_000


@dataclass(frozen=True)
class HintsPoint:
    """One hints body of a job, seen on the allocation in force when it arrived.

    ``gpus``/``nodes`` are that allocation's; ``pgns`` is the gradient noise scale at the job's
    initial batch size; the batch configuration, ``efficiency``, ``step_time`` (seconds per optimiser
    step, predicted: ``batch_size × efficiency / goodput``) and ``goodput`` are what the goodput model
    chooses there (None without GPUs, or for a body that no longer validates). ``measured_batch_size``
    comes from the body's optional ``current`` block (hints version 3) when it has one, and
    ``measured_step_time`` when that block has timed steps too; ``measured_goodput`` is
    ``measured_batch_size`` × the model's statistical efficiency at that batch /
    ``measured_step_time``: the goodput the job actually made, weighted by the same statistical
    efficiency as the prediction, so that the two charts are comparable."""

    time: float
    gpus: int
    nodes: int
    pgns: float | None = None
    batch_size: float | None = None
    local_bsz: float | None = None
    accum_steps: int | None = None
    efficiency: float | None = None
    step_time: float | None = None
    goodput: float | None = None
    measured_step_time: float | None = None
    measured_batch_size: float | None = None
    measured_goodput: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def allocation_at(history: Sequence[ResizeRecord], times: Sequence[float], t: float) -> Mapping[str, int]:
    """The allocation in force at ``t``: the newest of ``history`` (whose ``times`` are sorted) made at
    or before ``t``; none before the first."""
    k = bisect.bisect_right(times, t)
    return history[k - 1].allocation if k else {}


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def point_of(job: JobRecord, entry: HintsEntry, allocation: Mapping[str, int]) -> HintsPoint:
    """The point of one hints body of ``job`` on ``allocation``."""
    gpus = int(sum(allocation.values()))
    nodes = sum(1 for g in allocation.values() if g > 0)
    try:
        view = job_view(job, entry.hints, entry.time)   # validates the body (an older version too)
    except HintsError:   # a body stored by an older Pollux that no longer validates: time only
        return HintsPoint(time=entry.time, gpus=gpus, nodes=nodes)
    assert view.model is not None
    measured = entry.hints.get("current") or {}   # valid now; absent before version 3
    measured_step_time = _positive(measured.get("step_time"))
    measured_batch_size = _positive(measured.get("batch_size"))
    measured_goodput = None
    if measured_step_time is not None and measured_batch_size is not None:
        measured_goodput = _positive(float(view.model.measured_goodput(measured_batch_size,
                                                                       measured_step_time)))
    # The round's own computation, for one job on one allocation (a cache of its own: nothing to reuse).
    outlook = OutlookCache().round([view], {job.id: dict(allocation)}, entry.time, {})[job.id]
    pgns = outlook.pgns
    if pgns is None:   # no GPUs then: the noise scale is still the body's
        pgns = float(view.model.grad_stats.pgns(view.model.init_batch_size))
    step_time = None
    if outlook.goodput and outlook.batch_size and outlook.efficiency:
        step_time = outlook.batch_size * outlook.efficiency / outlook.goodput
    return HintsPoint(time=entry.time, gpus=gpus, nodes=nodes, pgns=_positive(pgns),
                      batch_size=outlook.batch_size, local_bsz=outlook.local_bsz,
                      accum_steps=outlook.accum_steps, efficiency=outlook.efficiency, step_time=step_time,
                      goodput=outlook.goodput, measured_step_time=measured_step_time,
                      measured_batch_size=measured_batch_size, measured_goodput=measured_goodput)


class HintsPoints:
    """Jobs' hints histories as points, each point computed once (see the module docstring)."""

    def __init__(self, store: JobStore, capacity: int = CACHED_POINTS) -> None:
        self.store = store
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[str, int, tuple[tuple[str, int], ...]], HintsPoint] = OrderedDict()

    def of(self, job_id: str, points: int = DEFAULT_POINTS) -> list[HintsPoint]:
        """The job's hints history as at most ``points`` points, oldest first (the store
        down-samples). Raises :class:`UnknownJobError` for an unknown job, ValueError for ``points``
        out of range."""
        job = self.store.get_job(job_id)
        entries = self.store.hints_history(job_id, points)
        history = sorted(self.store.resizes(job_id), key=lambda r: (r.time, r.version))
        times = [r.time for r in history]
        out = []
        for entry in entries:
            allocation = allocation_at(history, times, entry.time)
            key = (job_id, entry.seq, tuple(sorted(allocation.items())))
            with self._lock:
                point = self._kept.get(key)
                if point is not None:
                    self._kept.move_to_end(key)
            if point is None:
                point = point_of(job, entry, allocation)
                with self._lock:
                    self._kept[key] = point
                    while len(self._kept) > self.capacity:
                        self._kept.popitem(last=False)
            out.append(point)
        return out
